package auth

import (
	"net/url"
	"testing"
)

// TestSafeNextHostile feeds SafeNext what an attacker would put in
// /login?next= (as the handler sees it, already query-decoded). Every value
// that a browser could resolve to another origin, now or after one more
// decoding, must become "/"; ordinary paths survive unchanged.
func TestSafeNextHostile(t *testing.T) {
	hostile := []string{
		"/\t/evil.example",          // WHATWG drops the tab: //evil.example
		"/\t\t/evil.example",        //
		"\t//evil.example",          //
		"/\r/evil.example",          //
		"/\n/evil.example",          //
		"/\r\n/evil.example",        //
		"/%09/evil.example",         // a hop that decodes it finds the tab
		"/%0d%0a/evil.example",      //
		"/%2F%2Fevil.example",       // decoded path //evil.example
		"/%2f/evil.example",         //
		"/%5Cevil.example",          // decoded backslash
		"/%5C%5Cevil.example",       //
		"/\\evil.example",           // backslash reads as a slash
		"/\\/evil.example",          //
		"\\\\evil.example",          //
		"//evil.example",            // scheme-relative
		"///evil.example",           //
		"////evil.example",          //
		"https:evil.example",        // scheme without slashes
		"https://evil.example",      //
		"http:/evil.example",        //
		"javascript:alert(1)",       //
		"data:text/html,hi",         //
		"evil.example",              // not a path
		" /keys",                    // leading space (browsers strip it)
		"/ /evil.example",           //
		"/\x00/evil.example",        // NUL
		"/\x7f/evil.example",        // DEL
		"/\u00a0/evil.example",      // no-break space
		"/\u2028/evil.example",      // line separator
		"/\u200b/evil.example",      // zero-width space
		"/\u202e/elpmaxe.live",      // right-to-left override
		"/\uff0f\uff0fevil.example", // fullwidth solidus
		"/\u3002evil.example",       // ideographic full stop
		"/%00",                      // decoded NUL
		"/%C2%85/evil",              // decoded C1 control (NEL)
		"/..//evil.example",         // resolves to //evil.example
		"/./",                       //
		"/keys/../..//evil.example", //
		"/%2e%2e//evil.example",     //
		"/%zz",                      // bad escape
		"",                          //
		"/" + string(make([]byte, 1000)),
	}
	for _, in := range hostile {
		if got := SafeNext(in); got != "/" {
			t.Errorf("SafeNext(%q) = %q, want /", in, got)
		}
	}

	for _, in := range []string{
		"/",
		"/keys",
		"/admin/keys?x=1",
		"/keys?next=//evil.example", // only the path decides where a browser goes
		"/keys#frag",                //
		"/search?q=%E2%9C%93&x=%5C", // encoded query values are fine
		"/caf%C3%A9",                // an encoded non-ASCII path
		"/a:b",                      // a colon after the first slash is a path
		"/.well-known/x",            //
	} {
		if got := SafeNext(in); got != in {
			t.Errorf("SafeNext(%q) = %q, want it kept", in, got)
		}
		// Whatever is kept is a same-origin path for a WHATWG-like
		// resolution against this site.
		base, _ := url.Parse("http://moonji.example/")
		ref, err := url.Parse(SafeNext(in))
		if err != nil || base.ResolveReference(ref).Host != "moonji.example" {
			t.Errorf("SafeNext(%q) leaves the site", in)
		}
	}
}

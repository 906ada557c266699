package assets

import (
	"strings"
	"testing"
)

// Hostile and odd Accept-Encoding headers: never a coding the header
// refused, never a panic, bounded work.
func TestNegotiateHostile(t *testing.T) {
	for h, want := range map[string]string{
		"br;q=0":                         "",
		"gzip;q=0.000":                   "",
		"br;q=1.5":                       "",
		"br;q=-1":                        "",
		"br;q=0x1p-2":                    "",
		"br;q=NaN":                       "",
		"br;q=Inf, gzip":                 "gzip",
		"br;q, gzip":                     "gzip",
		"br;;;q=0.3":                     "br",
		"BR":                             "br",
		"x-gzip":                         "gzip",
		",,,,":                           "",
		"gzip;level=9":                   "gzip",
		"br;q=0.001, gzip;q=0.002":       "gzip",
		"\x00br":                         "",
		strings.Repeat("a,", 40) + "br":  "", // past maxAcceptCoding
		strings.Repeat(" ", 2000) + "br": "", // past maxAcceptLen
	} {
		if got := Negotiate(h); got != want {
			t.Errorf("Negotiate(%.40q) = %q, want %q", h, got, want)
		}
	}
}

// FuzzNegotiate: whatever the header, the answer is one of three, and a
// coding the header refuses by name is never chosen.
func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{"gzip, deflate, br, zstd", "br;q=0, gzip", "*;q=0", "gzip;q=0, *", "br;q=1.000", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got := Negotiate(h)
		if got != "" && got != "br" && got != "gzip" {
			t.Fatalf("Negotiate(%q) = %q", h, got)
		}
		if got != "" {
			br, gz := weights(h)
			if (got == "br" && br <= 0) || (got == "gzip" && gz <= 0) {
				t.Fatalf("Negotiate(%q) = %q with weights br %v gzip %v", h, got, br, gz)
			}
		}
		if got == "br" && strings.TrimSpace(strings.ToLower(h)) == "br;q=0" {
			t.Fatalf("refused br chosen")
		}
	})
}

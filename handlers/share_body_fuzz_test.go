package handlers

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"moonji/internal/share"
)

// parseShareBody takes whole seconds or a Go duration within bounds, and a
// boolean show_author; everything else is refused naming the field.
func TestParseShareBody(t *testing.T) {
	for body, want := range map[string]share.Request{
		``: {}, ` `: {}, `{}`: {}, `{"expires_in":null}`: {}, `{"show_author":false}`: {},
		`{"expires_in":60}`: {ExpiresIn: time.Minute}, `{"expires_in":3600,"show_author":true}`: {ExpiresIn: time.Hour, ShowAuthor: true},
		`{"expires_in":31536000}`: {ExpiresIn: share.MaxExpiry}, `{"expires_in":6e1}`: {ExpiresIn: time.Minute},
		`{"expires_in":"24h"}`: {ExpiresIn: 24 * time.Hour}, `{"expires_in":"3600"}`: {ExpiresIn: time.Hour},
		`{"expires_in":"1h30m"}`: {ExpiresIn: 90 * time.Minute}, `{"other":1}`: {},
	} {
		got, err := parseShareBody([]byte(body))
		if err != nil || got != want {
			t.Errorf("%s: %+v %v, want %+v", body, got, err, want)
		}
	}
	for body, param := range map[string]string{
		`{"expires_in":-1}`: "expires_in", `{"expires_in":0}`: "expires_in", `{"expires_in":59}`: "expires_in",
		`{"expires_in":31536001}`: "expires_in", `{"expires_in":1e30}`: "expires_in", `{"expires_in":1.5}`: "expires_in",
		`{"expires_in":99999999999999999999}`: "expires_in", `{"expires_in":"abc"}`: "expires_in", `{"expires_in":"-5m"}`: "expires_in",
		`{"expires_in":"59s"}`: "expires_in", `{"expires_in":"9999999h"}`: "expires_in", `{"expires_in":"0"}`: "expires_in",
		`{"expires_in":"-60"}`: "expires_in", `{"expires_in":true}`: "expires_in", `{"expires_in":[60]}`: "expires_in",
		`{"expires_in":{}}`: "expires_in", `{"expires_in":60,"expires_in":120}`: "expires_in",
		`{"show_author":"yes"}`: "show_author", `{"show_author":1}`: "show_author",
		`[60]`: "", `"60"`: "", `60`: "", `{`: "", `{"x":` + strings.Repeat("[", 5000) + `}`: "",
	} {
		_, err := parseShareBody([]byte(body))
		bad, ok := err.(*bodyError)
		if !ok || bad.Param != param || bad.Message == "" {
			t.Errorf("%.40s: %#v, want a refusal naming %q", body, err, param)
		}
	}
}

// FuzzParseShareBody: the share body's parser never panics; it refuses
// with a *bodyError naming expires_in, show_author or nothing; what it
// accepts is within the bounds; and any seconds and flag written by
// encoding/json are read back exactly, or refused when out of bounds.
//
//	go test ./handlers -run '^$' -fuzz FuzzParseShareBody -fuzztime 60s
func FuzzParseShareBody(f *testing.F) {
	for _, b := range []string{
		`{"expires_in":3600,"show_author":true}`, `{"expires_in":"24h"}`, `{"expires_in":"3600"}`, `{}`, ``, `[]`,
		`{"expires_in":-1}`, `{"expires_in":1e30}`, `{"expires_in":"-5m"}`, `{"expires_in":60,"expires_in":61}`,
		`{"show_author":"true"}`, `{"x":` + strings.Repeat("[", 200) + `}`,
	} {
		f.Add([]byte(b), int64(3600), true)
	}
	f.Add([]byte(`{}`), int64(-60), false)
	f.Add([]byte(`{}`), int64(59), false)
	f.Add([]byte(`{}`), int64(31536001), true)
	f.Fuzz(func(t *testing.T, body []byte, secs int64, show bool) {
		got, err := parseShareBody(body)
		if err != nil {
			refusal(t, err, body, "expires_in", "show_author")
		} else if share.CheckExpiry(got.ExpiresIn) != nil {
			t.Fatalf("accepted expires_in %v out of bounds from %q", got.ExpiresIn, body)
		}

		b, _ := json.Marshal(map[string]any{"expires_in": secs, "show_author": show})
		got, err = parseShareBody(b)
		in := secs >= int64(share.MinExpiry/time.Second) && secs <= int64(share.MaxExpiry/time.Second)
		switch {
		case in && (err != nil || got.ExpiresIn != time.Duration(secs)*time.Second || got.ShowAuthor != show):
			t.Fatalf("%s: %+v %v", b, got, err)
		case !in && err == nil:
			t.Fatalf("%s accepted: %+v", b, got)
		}
		b, _ = json.Marshal(map[string]any{"expires_in": strconv.FormatInt(secs, 10) + "s"})
		if got, err := parseShareBody(b); in != (err == nil) || (in && got.ExpiresIn != time.Duration(secs)*time.Second) {
			t.Fatalf("%s: %+v %v", b, got, err)
		}
	})
}

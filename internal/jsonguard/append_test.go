package jsonguard

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// AppendString writes valid JSON for any string, decoding to the same
// text with each invalid byte as U+FFFD.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `"quoted"`, `back\slash`, "tab\there", "nul\x00", "\x1f\x7f",
		"문지기 🚪", "\xff", "a\xc3", "\xed\xa0\x80", "\u2028\u2029", "</script>", strings.Repeat("é", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := AppendString(nil, s)
		if !json.Valid(b) {
			t.Fatalf("invalid JSON %q for %q", b, s)
		}
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		var want strings.Builder
		for i := 0; i < len(s); {
			r, size := utf8.DecodeRuneInString(s[i:])
			want.WriteRune(r) // RuneError for an invalid byte: U+FFFD
			i += size
		}
		if got != want.String() {
			t.Fatalf("%q decodes to %q, want %q", s, got, want.String())
		}
	})
}

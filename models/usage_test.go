package models

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestStorable(t *testing.T) {
	cases := []struct {
		name, in string
		size     int
		want     string
	}{
		{"plain", "m1", 200, "m1"},
		{"spreadsheet formula kept", "=cmd|' /C calc'!A0", 200, "=cmd|' /C calc'!A0"},
		{"NUL", "a\x00b", 200, "ab"},
		{"controls", "a\tb\nc\x1bd\x7f", 200, "abcd\x7f"},
		{"invalid bytes", "\xff\xfe", 200, "\uFFFD"},
		{"invalid inside", "a\xc3(b", 200, "a\uFFFD(b"},
		{"cut", strings.Repeat("x", 300), 200, strings.Repeat("x", 200)},
		{"cut by characters, not bytes", strings.Repeat("é", 201), 200, strings.Repeat("é", 200)},
		{"exactly the size", strings.Repeat("é", 200), 200, strings.Repeat("é", 200)},
		{"cut after cleaning", "\x00" + strings.Repeat("z", 5), 4, "zzzz"},
		{"empty", "", 8, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Storable(c.in, c.size); got != c.want {
				t.Errorf("Storable(%q, %d) = %q, want %q", c.in, c.size, got, c.want)
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() { _ = Storable("inf_0123456789abcdef", 40) }); n != 0 {
		t.Errorf("a clean value costs %v allocations", n)
	}
}

// TestSanitizeCoversEveryColumn fills every string column of Usage with
// more than its size of characters, NULs and invalid bytes, and checks
// what Sanitize leaves fits the column its gorm tag declares: a column
// added or resized without Sanitize would fail here.
func TestSanitizeCoversEveryColumn(t *testing.T) {
	sizeTag := regexp.MustCompile(`(?:^|;)size:(\d+)`)
	var u Usage
	v := reflect.ValueOf(&u).Elem()
	sizes := map[string]int{}
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if f.Type.Kind() != reflect.String {
			continue
		}
		m := sizeTag.FindStringSubmatch(f.Tag.Get("gorm"))
		if m == nil {
			t.Errorf("string column %s has no size: PostgreSQL would store it as text, unbounded", f.Name)
			continue
		}
		size, _ := strconv.Atoi(m[1])
		sizes[f.Name] = size
		v.Field(i).SetString(strings.Repeat("é\x00\xff", size+5))
	}
	u.Sanitize()
	for name, size := range sizes {
		got := v.FieldByName(name).String()
		if !utf8.ValidString(got) || strings.ContainsRune(got, 0) || utf8.RuneCountInString(got) > size {
			t.Errorf("%s after Sanitize: %d characters (column size %d), valid UTF-8 %v, NUL %v",
				name, utf8.RuneCountInString(got), size, utf8.ValidString(got), strings.ContainsRune(got, 0))
		}
		if utf8.RuneCountInString(got) != size {
			t.Errorf("%s: cut to %d characters, want the column's %d", name, utf8.RuneCountInString(got), size)
		}
	}
}

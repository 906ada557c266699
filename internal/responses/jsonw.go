package responses

import (
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// The translation writes JSON by appending to byte slices: the shapes are
// fixed, and most values are copied as the client or the engine wrote them
// (gjson's Raw), so nothing is decoded only to be encoded again. Every
// document a Raw is taken from has passed jsonguard.Validate first, which
// makes each Raw a well-formed JSON value.

// appendInt appends n in decimal.
func appendInt(b []byte, n int64) []byte { return strconv.AppendInt(b, n, 10) }

// body returns the inside of a raw JSON string (its escaped text without
// the quotes), or "" when v is not a string. Bodies concatenate: the body of
// "a" followed by the body of "b" is the body of "ab", which is how the
// stream keeps the whole answer as one escaped buffer.
func body(v gjson.Result) string {
	if v.Type != gjson.String || len(v.Raw) < 2 {
		return ""
	}
	return v.Raw[1 : len(v.Raw)-1]
}

// appendQuoted appends a string body between quotes.
func appendQuoted[T string | []byte](b []byte, body T) []byte {
	b = append(b, '"')
	b = append(b, body...)
	return append(b, '"')
}

// rawOr returns v's raw JSON when v has one of the wanted types, or def.
func rawOr(v gjson.Result, def string, types ...gjson.Type) string {
	for _, t := range types {
		if v.Type == t && v.Raw != "" {
			return v.Raw
		}
	}
	return def
}

// unsafeString views b as a string without copying. The string must not
// outlive b's contents: it is only used for reading a frame while the frame
// is at hand.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// isObject reports whether v is a JSON object.
func isObject(v gjson.Result) bool { return v.Type == gjson.JSON && len(v.Raw) > 0 && v.Raw[0] == '{' }

// isArray reports whether v is a JSON array.
func isArray(v gjson.Result) bool { return v.Type == gjson.JSON && len(v.Raw) > 0 && v.Raw[0] == '[' }

// isNull reports whether v is missing or an explicit null: both mean "not
// set" in the Responses API.
func isNull(v gjson.Result) bool { return v.Type == gjson.Null }

// loneSurrogates replaces each \u escape of a UTF-16 surrogate that is not
// part of a pair with \ufffd in a string body. Decoders disagree on a lone
// surrogate (Go makes it U+FFFD, JavaScript and Python keep it), and a
// pair split across two deltas would decode as two replacement characters
// from the deltas but as one character from the joined text of the done
// events. Engines only split a pair by mistake; the body is returned as it
// is, without copying, when it has none.
func loneSurrogates(s string) string {
	if !strings.Contains(s, `\u`) {
		return s
	}
	var b []byte // allocated at the first lone surrogate
	last := 0    // s[last:] is not yet copied to b
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		start := i
		i++ // the escaped character; the loop steps past it
		if i >= len(s) || s[i] != 'u' {
			continue
		}
		if start+6 > len(s) {
			break
		}
		r := hex4(s[start+2 : start+6])
		i = start + 5
		switch {
		case r >= 0xd800 && r < 0xdc00:
			// A high surrogate must be followed by a low one.
			if start+12 <= len(s) && s[start+6] == '\\' && s[start+7] == 'u' {
				if lo := hex4(s[start+8 : start+12]); lo >= 0xdc00 && lo < 0xe000 {
					i = start + 11
					continue
				}
			}
		case r >= 0xdc00 && r < 0xe000:
		default:
			continue
		}
		b = append(b, s[last:start]...)
		b = append(b, `\ufffd`...)
		last = start + 6
	}
	if b == nil {
		return s
	}
	return string(append(b, s[last:]...))
}

// hex4 reads four hex digits; the body was validated, so they are.
func hex4(h string) rune {
	var r rune
	for i := 0; i < 4; i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

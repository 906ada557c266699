package jsonguard

import "unicode/utf8"

// AppendString appends s as a JSON string: quotes, backslashes and control
// characters escaped, and each byte of invalid UTF-8 as U+FFFD, as
// encoding/json does, so that the output is valid JSON whatever s holds.
// Unlike encoding/json it leaves <, > and & as they are: its output goes
// into API responses and rows, never into HTML. It is for the places that
// write JSON by appending to a byte slice (the Responses translation, the
// closing chunks of a stream cut short, the SQLite ledger's rows).
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

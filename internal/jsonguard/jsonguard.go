// Package jsonguard checks a JSON document in one pass before anything else
// reads it: full RFC 8259 syntax, a bounded nesting depth, and no repeats of
// the keys its caller reads or writes.
//
// It exists because the readers behind it are not safe on hostile input.
// gjson.ValidBytes recurses once per nesting level with no limit, so a few
// MB of "[" overflow the goroutine stack: a fatal error that recover()
// cannot catch. And a repeated key is read first-wins by gjson/sjson but
// last-wins by the engines (vLLM's pydantic, Ollama, llama.cpp, Python's
// json), so the gateway and the engine would read different requests.
//
// Validate keeps its nesting in a fixed bit stack (no recursion) and
// allocates nothing for a valid document: it runs on every request.
package jsonguard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting Validate accepts: 128 arrays or objects
// inside one another (the top-level value counts as one). Chat requests
// nest a few levels, a tool's JSON schema perhaps a dozen; 128 leaves room
// for any real request and keeps every recursive reader after the guard
// (gjson, the engines' parsers) far from the end of its stack.
const MaxDepth = 128

// maxWatched bounds the fields of a Watch, and the inner and element names
// of a Field: which of them were seen is kept in a uint64.
const maxWatched = 64

// Field is a member of the top-level object whose repeats are refused.
// Inner names the members of its value, when that value is an object,
// whose repeats are refused too (stream_options.include_usage). Each names
// the members of every object in its value, when that value is an array,
// whose repeats are refused within that object (messages[i].content): one
// level down, like Inner, so the pass stays flat.
type Field struct {
	Name  string
	Inner []string
	Each  []string
}

// Watch lists the fields of the top-level object that the caller reads or
// writes; at most 64, each with at most 64 inner and 64 element names, all
// ASCII, no two equal but for letter case.
//
// Keys are compared the way the engines read them: after decoding escapes
// ("mod\u0065l" is model). And because Go's encoding/json (Ollama) matches
// keys to struct fields regardless of letter case, a key equal to a watched
// name only under Unicode case folding ("MODEL", "ſtream") is refused too:
// gjson would not read it, an engine would.
type Watch []Field

// Kind tells what is wrong with a document.
type Kind uint8

// The kinds of Error.
const (
	// Syntax: the document is not JSON.
	Syntax Kind = iota + 1
	// TooDeep: arrays and objects nest deeper than MaxDepth.
	TooDeep
	// Duplicate: a watched key appears twice in the same object.
	Duplicate
	// CaseVariant: a key equals a watched name only when letter case is
	// ignored.
	CaseVariant
)

// Error says what is wrong with a document and where.
type Error struct {
	Kind Kind
	// Offset is the byte offset of the problem: the offending byte, the
	// opening quote of a refused key, the bracket that nests too deep, or
	// the document's length when it ends too early.
	Offset int
	// Detail says what is wrong, for Syntax.
	Detail string
	// Field is the watched field a refused key stands for, for Duplicate
	// and CaseVariant: "model", "stream_options.include_usage" inside a
	// watched object, or "messages[2].content" inside the third element of
	// a watched array.
	Field string
	// Key is the refused key as written, escapes undecoded, for
	// CaseVariant (cut to 64 bytes).
	Key string
}

func (e *Error) Error() string {
	switch e.Kind {
	case TooDeep:
		return fmt.Sprintf("JSON nests deeper than %d levels at byte %d", MaxDepth, e.Offset)
	case Duplicate:
		return fmt.Sprintf("duplicate key %q at byte %d", e.Field, e.Offset)
	case CaseVariant:
		return fmt.Sprintf("key %q at byte %d differs from %q only in letter case", e.Key, e.Offset, e.Field)
	default:
		return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Detail)
	}
}

// Validate checks that data is one JSON value (RFC 8259; like
// encoding/json.Valid, bytes of strings are not checked to be UTF-8),
// nested at most MaxDepth deep, whose top-level object, if it is one,
// repeats none of the keys in w. It returns nil or an *Error. Time is linear
// in len(data), and it stops at the first problem.
func Validate(data []byte, w Watch) error {
	if len(w) > maxWatched {
		panic("jsonguard: more than 64 watched fields")
	}
	var (
		n     = len(data)
		i     int
		depth int
		// objects has bit d set when the container at depth d+1 is an
		// object, clear when it is an array.
		objects [(MaxDepth + 63) / 64]uint64
		// seen has bit k set once w[k] was met in the top-level object.
		seen uint64
		// pending is the index in w of the field whose value comes next,
		// when that field has inner names; -1 otherwise.
		pending = -1
		// inner is the index in w of the field whose object is open at
		// depth 2, or -1; innerSeen marks its inner names met so far.
		inner     = -1
		innerSeen uint64
		// each is the index in w of the field whose array is open at depth
		// 2, or -1; elem is the index of its element being read, and
		// eachSeen marks the element names met in that element so far.
		each     = -1
		elem     = -1
		eachSeen uint64
		err      *Error
	)

value:
	if depth == 2 && each >= 0 {
		elem++ // an element of the watched array begins
	}
	i = skipSpace(data, i)
	if i >= n {
		return endErr(n)
	}
	switch c := data[i]; c {
	case '{', '[':
		if depth == MaxDepth {
			return &Error{Kind: TooDeep, Offset: i}
		}
		if c == '{' {
			objects[depth>>6] |= 1 << (depth & 63)
		} else {
			objects[depth>>6] &^= 1 << (depth & 63)
		}
		depth++
		switch {
		case depth == 2:
			inner, innerSeen, each, elem = -1, 0, -1, -1
			if pending >= 0 && c == '{' && len(w[pending].Inner) > 0 {
				inner = pending
			}
			if pending >= 0 && c == '[' && len(w[pending].Each) > 0 {
				each = pending
			}
		case depth == 3 && each >= 0:
			eachSeen = 0 // a new element: its names start unseen
		}
		i = skipSpace(data, i+1)
		if i < n && (data[i] == '}' && c == '{' || data[i] == ']' && c == '[') {
			i++
			depth--
			goto after
		}
		if c == '{' {
			goto key
		}
		goto value
	case '"':
		if i, _, err = scanString(data, i+1); err != nil {
			return err
		}
	case 't':
		if i, err = literal(data, i, "true"); err != nil {
			return err
		}
	case 'f':
		if i, err = literal(data, i, "false"); err != nil {
			return err
		}
	case 'n':
		if i, err = literal(data, i, "null"); err != nil {
			return err
		}
	default:
		if c != '-' && (c < '0' || c > '9') {
			return unexpected(data, i, "looking for the beginning of a value")
		}
		if i, err = scanNumber(data, i); err != nil {
			return err
		}
	}

after:
	i = skipSpace(data, i)
	if depth == 0 {
		if i < n {
			return unexpected(data, i, "after the top-level value")
		}
		return nil
	}
	if i >= n {
		return endErr(n)
	}
	if objects[(depth-1)>>6]&(1<<((depth-1)&63)) != 0 {
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
			goto key
		case '}':
			i++
			depth--
			goto after
		}
		return unexpected(data, i, "after an object member; expected ',' or '}'")
	}
	switch data[i] {
	case ',':
		i++
		goto value
	case ']':
		i++
		depth--
		goto after
	}
	return unexpected(data, i, "after an array element; expected ',' or ']'")

key:
	// i is at the key's opening quote, spaces skipped.
	if i >= n {
		return endErr(n)
	}
	if data[i] != '"' {
		return unexpected(data, i, "looking for the beginning of an object key")
	}
	{
		start := i
		var esc bool
		if i, esc, err = scanString(data, i+1); err != nil {
			return err
		}
		raw := data[start+1 : i-1]
		switch {
		case depth == 1 && len(w) > 0:
			pending = -1
			for k := range w {
				m := match(raw, esc, w[k].Name)
				if m == noMatch {
					continue
				}
				if m == folded {
					return caseErr(start, raw, w[k].Name, "")
				}
				if seen&(1<<k) != 0 {
					return &Error{Kind: Duplicate, Offset: start, Field: w[k].Name}
				}
				seen |= 1 << k
				if len(w[k].Inner) > 0 || len(w[k].Each) > 0 {
					pending = k
				}
				break
			}
		case depth == 2 && inner >= 0:
			names := w[inner].Inner
			if len(names) > maxWatched {
				panic("jsonguard: more than 64 inner names in a watched field")
			}
			for k, name := range names {
				m := match(raw, esc, name)
				if m == noMatch {
					continue
				}
				if m == folded {
					return caseErr(start, raw, name, w[inner].Name)
				}
				if innerSeen&(1<<k) != 0 {
					return &Error{Kind: Duplicate, Offset: start, Field: w[inner].Name + "." + name}
				}
				innerSeen |= 1 << k
				break
			}
		case depth == 3 && each >= 0:
			// depth 3 is an element of the watched array: only an object
			// there has keys.
			names := w[each].Each
			if len(names) > maxWatched {
				panic("jsonguard: more than 64 element names in a watched field")
			}
			for k, name := range names {
				m := match(raw, esc, name)
				if m == noMatch {
					continue
				}
				if m == folded {
					return caseErr(start, raw, name, elemField(w[each].Name, elem))
				}
				if eachSeen&(1<<k) != 0 {
					return &Error{Kind: Duplicate, Offset: start, Field: elemField(w[each].Name, elem) + "." + name}
				}
				eachSeen |= 1 << k
				break
			}
		}
	}
	i = skipSpace(data, i)
	if i >= n {
		return endErr(n)
	}
	if data[i] != ':' {
		return unexpected(data, i, "after an object key; expected ':'")
	}
	i++
	goto value
}

func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// Masks for scanning eight bytes of a string at a time.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// scanString checks a string whose opening quote is just before i and
// returns the offset after its closing quote, and whether it holds escapes.
func scanString(data []byte, i int) (int, bool, *Error) {
	esc := false
	for {
		// Skip eight bytes at a time while none is a quote, a backslash
		// or a control character: most of a chat body is message text.
		// Of the flagged bytes the lowest is always a true one (a borrow
		// only runs upwards from a true one), so it is where to stop.
		for i+8 <= len(data) {
			x := binary.LittleEndian.Uint64(data[i:])
			q := x ^ (lsb * '"')
			b := x ^ (lsb * '\\')
			m := ((q - lsb) &^ q) | ((b - lsb) &^ b) | ((x - lsb*' ') &^ x)
			if m &= msb; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(data) {
			return i, esc, endErr(len(data))
		}
		switch c := data[i]; {
		case c == '"':
			return i + 1, esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(data) {
				return i, esc, endErr(len(data))
			}
			switch data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for k := i + 2; k < i+6; k++ {
					if k >= len(data) {
						return k, esc, endErr(len(data))
					}
					if !isHex(data[k]) {
						return k, esc, unexpected(data, k, "in a \\u escape")
					}
				}
				i += 6
			default:
				return i + 1, esc, unexpected(data, i+1, "in a string escape")
			}
		case c < ' ':
			return i, esc, unexpected(data, i, "in a string (control characters must be escaped)")
		default:
			i++
		}
	}
}

// scanNumber checks a number starting at i (a '-' or a digit) and returns
// the offset after it: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(data []byte, i int) (int, *Error) {
	n := len(data)
	if data[i] == '-' {
		i++
	}
	switch {
	case i >= n:
		return i, endErr(n)
	case data[i] == '0':
		i++
	case isDigit(data[i]):
		i = skipDigits(data, i+1)
	default:
		return i, unexpected(data, i, "in a number; expected a digit")
	}
	if i < n && data[i] == '.' {
		i++
		if i >= n {
			return i, endErr(n)
		}
		if !isDigit(data[i]) {
			return i, unexpected(data, i, "after a decimal point; expected a digit")
		}
		i = skipDigits(data, i+1)
	}
	if i < n && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < n && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= n {
			return i, endErr(n)
		}
		if !isDigit(data[i]) {
			return i, unexpected(data, i, "in an exponent; expected a digit")
		}
		i = skipDigits(data, i+1)
	}
	return i, nil
}

func skipDigits(data []byte, i int) int {
	for i < len(data) && isDigit(data[i]) {
		i++
	}
	return i
}

// literal checks that data holds word (true, false or null) at i.
func literal(data []byte, i int, word string) (int, *Error) {
	for k := 0; k < len(word); k++ {
		if i+k >= len(data) {
			return i + k, endErr(len(data))
		}
		if data[i+k] != word[k] {
			return i + k, unexpected(data, i+k, "in literal "+word)
		}
	}
	return i + len(word), nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func endErr(n int) *Error {
	return &Error{Kind: Syntax, Offset: n, Detail: "unexpected end of input"}
}

func unexpected(data []byte, i int, where string) *Error {
	c := data[i]
	var s string
	if c >= ' ' && c < utf8.RuneSelf {
		s = strconv.QuoteRune(rune(c))
	} else {
		s = fmt.Sprintf("byte 0x%02x", c)
	}
	return &Error{Kind: Syntax, Offset: i, Detail: "invalid character " + s + " " + where}
}

// elemField names element i of watched array field: "messages[2]".
func elemField(field string, i int) string {
	return field + "[" + strconv.Itoa(i) + "]"
}

func caseErr(start int, raw []byte, name, parent string) *Error {
	if len(raw) > 64 {
		raw = raw[:64]
	}
	field := name
	if parent != "" {
		field = parent + "." + name
	}
	return &Error{Kind: CaseVariant, Offset: start, Field: field, Key: string(raw)}
}

// How a key compares with a watched name.
const (
	noMatch = iota
	exact   // the same text once escapes are decoded
	folded  // the same text only when letter case is ignored
)

// match compares raw, a key's bytes between its quotes (a valid JSON
// string body; esc tells whether it holds escapes), with name the way
// Go's encoding/json matches a struct field: exactly or under Unicode
// simple case folding, like strings.EqualFold.
func match(raw []byte, esc bool, name string) int {
	if !esc && len(raw) == len(name) && string(raw) == name {
		return exact
	}
	// Each rune of name takes at least one byte of raw, and a rune that
	// folds to an ASCII letter takes at most three (U+212A KELVIN SIGN):
	// most keys are told apart by their length alone.
	if !esc && (len(raw) < len(name) || len(raw) > 3*len(name)) {
		return noMatch
	}
	same := true
	j := 0
	for len(raw) > 0 {
		if j >= len(name) {
			return noMatch
		}
		var r rune
		r, raw = nextRune(raw)
		nr, size := utf8.DecodeRuneInString(name[j:])
		j += size
		if r == nr {
			continue
		}
		if !equalFold(r, nr) {
			return noMatch
		}
		same = false
	}
	switch {
	case j != len(name):
		return noMatch
	case same:
		return exact
	default:
		return folded
	}
}

// nextRune decodes the first rune of a valid JSON string body, escapes
// included. A lone surrogate decodes to U+FFFD, as in encoding/json.
func nextRune(s []byte) (rune, []byte) {
	if s[0] != '\\' {
		if s[0] < utf8.RuneSelf {
			return rune(s[0]), s[1:]
		}
		r, size := utf8.DecodeRune(s)
		return r, s[size:]
	}
	switch s[1] {
	case 'b':
		return '\b', s[2:]
	case 'f':
		return '\f', s[2:]
	case 'n':
		return '\n', s[2:]
	case 'r':
		return '\r', s[2:]
	case 't':
		return '\t', s[2:]
	case 'u':
		r := hex4(s[2:6])
		s = s[6:]
		if 0xD800 <= r && r < 0xDC00 && len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
			if lo := hex4(s[2:6]); 0xDC00 <= lo && lo < 0xE000 {
				return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), s[6:]
			}
		}
		if 0xD800 <= r && r < 0xE000 {
			return utf8.RuneError, s
		}
		return r, s
	default: // '"', '\\', '/'
		return rune(s[1]), s[2:]
	}
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// equalFold reports whether two different runes are equal under Unicode
// simple case folding, as strings.EqualFold compares them.
func equalFold(a, b rune) bool {
	if a > b {
		a, b = b, a
	}
	if b < utf8.RuneSelf {
		return 'A' <= a && a <= 'Z' && b == a+'a'-'A'
	}
	r := unicode.SimpleFold(a)
	for r != a && r < b {
		r = unicode.SimpleFold(r)
	}
	return r == b
}

// Refusal words an error of Validate for the client that sent the body: a
// message, and the watched field at fault (param) when there is one. The
// gateway and the JSON API answer a bad body the same way.
func Refusal(err error) (message, param string) {
	var e *Error
	if !errors.As(err, &e) {
		return "request body is not valid JSON", ""
	}
	switch e.Kind {
	case TooDeep:
		return "request body nests deeper than " + strconv.Itoa(MaxDepth) + " levels", ""
	case Duplicate:
		return fmt.Sprintf("duplicate key %q in the request body", e.Field), e.Field
	case CaseVariant:
		return fmt.Sprintf("key %q in the request body differs from %q only in letter case; some engines read it as %[2]q", e.Key, e.Field), e.Field
	default:
		return fmt.Sprintf("request body is not valid JSON: %s at byte %d", e.Detail, e.Offset), ""
	}
}

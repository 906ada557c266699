package attachment

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes bounds a file name (most file systems' limit).
const MaxNameBytes = 255

// Name checks a file's name as it is shown and stored: a plain name, not a
// path. It refuses, saying why, an empty name, one over MaxNameBytes, one
// that is not valid UTF-8, one with a path separator (/ or \) or that is
// "." or "..", and one with a control character (NUL, a newline, …) or a
// bidirectional override, which can make "gpj.exe" read as "exe.jpg".
func Name(name string) *Error {
	switch {
	case strings.TrimSpace(name) == "":
		return refuse(CodeBadName, "The file has no name.")
	case len(name) > MaxNameBytes:
		return refuse(CodeBadName, "The file name is longer than %d bytes; rename the file.", MaxNameBytes)
	case !utf8.ValidString(name):
		return refuse(CodeBadName, "The file name is not valid UTF-8 text; rename the file.")
	case strings.ContainsAny(name, `/\`):
		return refuse(CodeBadName, "The file name %q holds a path separator (/ or \\): give a plain file name.", printable(name))
	case name == "." || name == "..":
		return refuse(CodeBadName, "The file name %q names a directory: give a plain file name.", name)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return refuse(CodeBadName, "The file name %q holds a control character (%U); rename the file.", printable(name), r)
		}
		if bidiControl(r) {
			return refuse(CodeBadName, "The file name %q holds an invisible direction mark (%U), which can disguise its type; rename the file.",
				printable(name), r)
		}
	}
	return nil
}

// bidiControl reports the formatting characters that reorder text: the
// embeddings, overrides and isolates, and the marks.
func bidiControl(r rune) bool {
	return (r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069) || r == 0x200E || r == 0x200F || r == 0x061C
}

// printable quotes what a refused name shows: its control characters as
// escapes, so that the message itself carries none.
func printable(name string) string {
	var b strings.Builder
	for _, r := range name {
		if unicode.IsControl(r) || bidiControl(r) {
			b.WriteString("�")
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

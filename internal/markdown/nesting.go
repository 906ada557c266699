package markdown

import "strings"

// Goldmark's block parser slows down with nesting: one line of 100,000 ">"
// takes it seconds (quadratic in depth), and every line inside an open
// container appends one record per open level to a slice it keeps until
// the containers close — a list item 32 deep followed by a million blank
// lines takes ten seconds and gigabytes. So before parsing, Render bounds
// both: no line may open more than maxLineNesting levels, and the deepest
// line's levels times the number of lines may not pass maxNestingCost. And
// each container marker becomes a block, its tags a dozen bytes of output
// for the renderer and the sanitizer: there may be at most maxMarkers.
// Past any of these, the answer is shown as plain text; no real answer
// comes near (a 1 MiB answer of one-line list items has some 50,000).
const (
	maxLineNesting = 64
	maxNestingCost = 1 << 20
	maxMarkers     = 1 << 16
)

// nestingCost returns an upper bound of the work the nesting in src gives
// goldmark: the most container levels any line can be in, times the number
// of lines; or maxNestingCost+1 when a line is deeper than maxLineNesting,
// or the lines hold more than maxMarkers container markers.
//
// A line is in no more levels than the markers (">", "-", "+", "*", "1."
// or "1)") it starts with, plus half its indentation in columns: a
// blockquote continues only with its ">", a list item only with an indent
// of two columns or more. Blank and lazy continuation lines stay at most
// as deep as the line before them.
func nestingCost(src string) int {
	deepest, lines, markers := 0, 0, 0
	for len(src) > 0 {
		line := src
		if i := strings.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i], src[i+1:]
		} else {
			src = ""
		}
		lines++
		d, m := lineNesting(line)
		markers += m
		if d > maxLineNesting || markers > maxMarkers {
			return maxNestingCost + 1
		}
		deepest = max(deepest, d)
	}
	return deepest * lines
}

// lineNesting returns the most container levels line can be in (see
// nestingCost), and the container markers it starts with.
func lineNesting(line string) (depth, markers int) {
	cols := 0
	i := 0
scan:
	for i < len(line) {
		switch c := line[i]; {
		case c == ' ':
			cols++
			i++
		case c == '\t':
			cols += 4 - cols%4
			i++
		case c == '\r':
			i++
		case c == '>':
			markers++
			i++
		case c == '-' || c == '+' || c == '*':
			if !endsMarker(line, i+1) {
				break scan
			}
			markers++
			i++
		case c >= '0' && c <= '9':
			j := i
			for j < len(line) && j-i < 9 && line[j] >= '0' && line[j] <= '9' {
				j++
			}
			if j >= len(line) || line[j] != '.' && line[j] != ')' || !endsMarker(line, j+1) {
				break scan
			}
			markers++
			i = j + 1
		default:
			break scan
		}
	}
	if i == len(line) && isThematicBreak(line) {
		// "- - - - …" is a rule, not lists, however long.
		return 0, 0
	}
	return markers + cols/2, markers
}

// endsMarker reports whether a list marker ending before line[i] is one:
// followed by white space or the end of the line.
func endsMarker(line string, i int) bool {
	return i >= len(line) || line[i] == ' ' || line[i] == '\t' || line[i] == '\r'
}

// isThematicBreak reports whether line is only one of "-", "*" and white
// space, which CommonMark reads as a thematic break (given three or more).
func isThematicBreak(line string) bool {
	var mark byte
	n := 0
	for i := range len(line) {
		switch c := line[i]; c {
		case ' ', '\t', '\r':
		case '-', '*':
			if mark != 0 && c != mark {
				return false
			}
			mark = c
			n++
		default:
			return false
		}
	}
	return n >= 3
}

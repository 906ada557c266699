package models

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	sqlite "github.com/glebarez/go-sqlite"
)

// The owner's tag on every indexed word (issue 42). A full-text index
// keyed by words alone makes a search read every person's postings of its
// words before keeping the searcher's: FTS5 merges the lists of all the
// words a prefix starts (from every person) before any condition on rowids
// applies, and a GIN partial match collects every matching row. So the
// indexed words carry their owner: on SQLite each word of a title or a
// message is indexed as ownerTag(person) + word, and a search for "kube"
// looks for the prefix ownerTag(searcher) + "kube", which only the
// searcher's words start; on PostgreSQL each lexeme is prefixed the same
// way (moonji_owned_words, search_migrate_pg.go). What a search reads is then the searcher's postings
// only, whatever others have written.

// sqliteWordsFunc is the SQL function (registered with the SQLite driver
// for every connection of this process) that the search index's triggers
// call: moonji_search_words(owner, text) = ownedWords(ownerTag(owner), text).
// A program that writes conversations or messages into the database
// without it (the sqlite3 shell) fails with "no such function".
const sqliteWordsFunc = "moonji_search_words"

func init() {
	sqlite.MustRegisterDeterministicScalarFunction(sqliteWordsFunc, 2, func(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
		owner, ok := args[0].(int64)
		if !ok || owner < 0 {
			return nil, fmt.Errorf("%s: owner %v is not a person's id", sqliteWordsFunc, args[0])
		}
		switch text := args[1].(type) {
		case nil:
			return nil, nil
		case string:
			return ownedWords(ownerTag(uint64(owner)), text), nil
		case []byte:
			return ownedWords(ownerTag(uint64(owner)), string(text)), nil
		default: // a number
			return ownedWords(ownerTag(uint64(owner)), fmt.Sprint(text)), nil
		}
	})
}

// Owner tags are base 36, fixed width, so that FTS5's prefix indexes (of
// tagWidth+1 to tagWidth+3 characters) hold the first 1 to 3 characters of
// the word after the tag: six characters whose first is 0–y for the ids
// below 35·36⁵ (2.1 billion), "z" and thirteen more for the rest, so that
// no tag starts another. Short, because every word of the text grows by
// it before FTS5 reads the text.
const (
	tagWidth     = 6
	smallOwners  = 35 * 36 * 36 * 36 * 36 * 36
	bigTagDigits = 13
)

// ownerTag is the tag of person owner's words in the SQLite index.
func ownerTag(owner uint64) string {
	s := strconv.FormatUint(owner, 36)
	if owner < smallOwners {
		return strings.Repeat("0", tagWidth-len(s)) + s
	}
	return "z" + strings.Repeat("0", bigTagDigits-len(s)) + s
}

// ownedWords returns text with tag written before each word that FTS5's
// unicode61 tokenizer (remove_diacritics 2) finds in it, and nothing else
// changed, so that FTS5 indexes tag+word for each word, with the case and
// the diacritics folded as before. A search term goes through the same
// function, so a prefix of a word gives a prefix of its tagged form.
//
// Where this function's idea of a word character differs from FTS5's the
// result is still consistent, only less bounded: characters FTS5 counts
// as word characters but Go's Unicode tables do not (marks and symbols
// newer than FTS5's Unicode 6 tables, which it takes for letters) get a
// tag after them inside FTS5's word, in the text and in a search alike;
// a word that starts with one is indexed without a tag, so it is looked
// up in everyone's postings (it is still matched exactly). The converse,
// a character Go calls a letter and FTS5 a separator, would leave the
// word after it untagged and unfindable: ftsWordChar excludes the few
// there are (TestOwnedWordsMatchFTS5 checks the two tables).
func ownedWords(tag, text string) string {
	var b strings.Builder
	b.Grow(2*len(text) + len(tag)) // a tag per word of a few letters
	in := false
	done := 0 // text[:done] is written
	for i := 0; i < len(text); {
		word, diacritic, w := asciiWord[text[i]&0x7f] && text[i] < utf8.RuneSelf, false, 1
		if text[i] >= utf8.RuneSelf {
			var r rune
			r, w = utf8.DecodeRuneInString(text[i:])
			word = ftsWordChar(r)
			diacritic = !word && ftsDiacritic(r)
		}
		switch {
		case word:
			if !in {
				b.WriteString(text[done:i])
				b.WriteString(tag)
				done, in = i, true
			}
		case in && diacritic:
			// FTS5 keeps a combining diacritic inside a word (and drops it).
		default:
			in = false
		}
		i += w
	}
	b.WriteString(text[done:])
	return b.String()
}

// asciiWord marks the ASCII characters FTS5 takes as word characters.
var asciiWord = func() (t [128]bool) {
	for c := range t {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
	}
	return t
}()

// ftsWordChar tells whether FTS5's unicode61 tokenizer takes r as a word
// character: ASCII letters and digits; beyond ASCII, letters, numbers and
// private use characters, less those its older tables classify otherwise.
func ftsWordChar(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiWord[r]
	}
	if r == utf8.RuneError {
		return false
	}
	if !unicode.IsLetter(r) && !unicode.IsNumber(r) && !unicode.Is(unicode.Co, r) {
		return false
	}
	// Letters since Unicode 8 and 10 that were spacing marks in FTS5's
	// tables (New Tai Lue vowel signs, two Vedic signs).
	return !(0x19B0 <= r && r <= 0x19C0 || r == 0x19C8 || r == 0x19C9 || r == 0x1CF2 || r == 0x1CF3)
}

// ftsDiacritic is sqlite3Fts5UnicodeIsdiacritic: the combining marks
// (among U+0300–U+0331) that FTS5 keeps inside a word.
func ftsDiacritic(r rune) bool {
	const mask0, mask1 = 0x08029FDF, 0x000361F8
	switch {
	case r < 0x300 || r > 0x331:
		return false
	case r < 0x320:
		return mask0&(1<<(r-0x300)) != 0
	default:
		return mask1&(1<<(r-0x320)) != 0
	}
}

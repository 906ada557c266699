package models

import (
	"slices"
	"strings"
	"testing"
	"unicode"
)

func TestOwnerTag(t *testing.T) {
	for _, c := range []struct {
		id   uint64
		want string
	}{
		{0, "000000"}, {1, "000001"}, {35, "00000z"}, {smallOwners - 1, "yzzzzz"},
		{smallOwners, "z0000000z00000"}, {1<<64 - 1, "z3w5e11264sgsf"},
	} {
		if got := ownerTag(c.id); got != c.want {
			t.Errorf("ownerTag(%d) = %q, want %q", c.id, got, c.want)
		}
	}
	// No tag starts another: one person's prefix never reaches another's
	// words.
	ids := []uint64{0, 1, 35, 36, 1295, smallOwners - 1, smallOwners, smallOwners + 1, 1 << 40, 1<<64 - 1}
	for _, a := range ids {
		for _, b := range ids {
			if a != b && strings.HasPrefix(ownerTag(a), ownerTag(b)) {
				t.Errorf("tag of %d (%s) starts with the tag of %d (%s)", a, ownerTag(a), b, ownerTag(b))
			}
		}
	}
}

func TestOwnedWords(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"Hello, world!", "TAGHello, TAGworld!"},
		{"main.go v1.2.3", "TAGmain.TAGgo TAGv1.TAG2.TAG3"},
		{"maintenance_work", "TAGmaintenance_TAGwork"},
		{"café e\u0301te\u0301", "TAGcafé TAGe\u0301te\u0301"}, // a diacritic stays in its word
		{"\u0301e", "\u0301TAGe"},                              // but does not start one
		{"हिन्दी", "TAGह\u093fTAGन\u094dTAGद\u0940"},           // FTS5 cuts at these marks
		{"日本語 テキスト", "TAG日本語 TAGテキスト"},
		{"a\u19b0b", "TAGa\u19b0TAGb"}, // a letter since Unicode 8, a mark to FTS5
		{"😀x", "😀TAGx"},
		{`say "hi"`, `TAGsay "TAGhi"`},
	} {
		if got := ownedWords("TAG", c.in); got != c.want {
			t.Errorf("ownedWords(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// ownedWords must cut words where FTS5's unicode61 tokenizer does, or a
// word would be indexed without its tag and never found: every character
// it takes for a word character FTS5 takes too, and the diacritics it keeps
// inside a word are FTS5's. Then, on texts of many scripts, FTS5 reads the
// tagged text as the tag before each word it reads in the text itself.
func TestOwnedWordsMatchFTS5(t *testing.T) {
	db := openTestDB(t, "sqlite://"+t.TempDir()+"/words.db")
	for _, st := range []string{
		"CREATE VIRTUAL TABLE probe USING fts5(t, tokenize='unicode61 remove_diacritics 2')",
		"CREATE VIRTUAL TABLE probe_terms USING fts5vocab(probe, 'instance')",
	} {
		if err := db.Exec(st).Error; err != nil {
			t.Fatal(err)
		}
	}
	// Every word character, alone between spaces, 2,000 to a row: FTS5
	// must read each as a word.
	var rows [][]rune
	var row []rune
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		if !ftsWordChar(r) {
			continue
		}
		if row = append(row, r); len(row) == 2000 {
			rows, row = append(rows, row), nil
		}
	}
	rows = append(rows, row)
	tx := db.Begin()
	for i, row := range rows {
		var b strings.Builder
		for _, r := range row {
			b.WriteRune(r)
			b.WriteByte(' ')
		}
		if err := tx.Exec("INSERT INTO probe(rowid, t) VALUES (?, ?)", i+1, b.String()).Error; err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	var counts []struct{ Doc, N int }
	db.Raw("SELECT doc, count(*) AS n FROM probe_terms GROUP BY doc ORDER BY doc").Scan(&counts)
	for i, row := range rows {
		if i >= len(counts) || counts[i].N != len(row) {
			t.Errorf("row %d (U+%04X…U+%04X): FTS5 reads fewer words than the %d characters ownedWords takes for words", i+1, row[0], row[len(row)-1], len(row))
		}
	}
	// Every mark: inside a word, FTS5 keeps it (one word) exactly when
	// ftsDiacritic says so.
	db.Exec("DELETE FROM probe")
	var marks []rune
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		if unicode.IsMark(r) || ftsDiacritic(r) {
			marks = append(marks, r)
		}
	}
	tx = db.Begin()
	for _, r := range marks {
		tx.Exec("INSERT INTO probe(rowid, t) VALUES (?, ?)", int(r), "b"+string(r)+"b")
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	var words []struct{ Doc, N int }
	db.Raw("SELECT doc, count(*) AS n FROM probe_terms GROUP BY doc").Scan(&words)
	kept := 0
	for _, w := range words {
		// FTS5 may keep more inside a word than ownedWords (marks newer
		// than its tables): a tag then lands inside the word, in a search
		// alike. Not less.
		if r := rune(w.Doc); (ftsDiacritic(r) || ftsWordChar(r)) && w.N != 1 {
			t.Errorf("U+%04X: FTS5 cuts b%cb in two, ownedWords keeps it in one word", r, r)
		}
		if w.N == 1 {
			kept++
		}
	}
	t.Logf("of %d marks, FTS5 keeps %d inside a word, ownedWords %d", len(marks), kept, len(slices.DeleteFunc(marks, func(r rune) bool { return !ftsDiacritic(r) })))
	// Texts: the tagged text's words are the text's, tagged.
	db.Exec("DELETE FROM probe")
	texts := []string{
		"Hello, world! main.go v1.2.3 2026-12-01 maintenance_work",
		"Ünïcödé ÉTÉ café e\u0301t\u0301e\u0301 naïve Straße ǅungla İstanbul",
		"Страница про Ёлку; Ελληνικά κείμενα",
		"日本語のテキスト、中文文本。한국어 검색",
		"हिन्दी पाठ, தமிழ் உரை, ภาษาไทย, العَرَبِيَّة, עִבְרִית",
		"emoji 😀👩‍👩‍👧 ½ ² ٣ Ⅻ \u200b\u00a0\u202e\ufeff tab\there",
		"ᦰᦱ ᳲx 𞤀𞤁 𐒰𐓘 𑼄",
	}
	tx = db.Begin()
	for i, text := range texts {
		tx.Exec("INSERT INTO probe(rowid, t) VALUES (?, ?)", 2*i+1, text)
		tx.Exec("INSERT INTO probe(rowid, t) VALUES (?, ?)", 2*i+2, ownedWords("000007", text))
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	for i, text := range texts {
		var plain, tagged []string
		db.Raw("SELECT term FROM probe_terms WHERE doc = ? ORDER BY offset", 2*i+1).Scan(&plain)
		db.Raw("SELECT term FROM probe_terms WHERE doc = ? ORDER BY offset", 2*i+2).Scan(&tagged)
		var want []string
		for _, w := range plain {
			want = append(want, "000007"+w)
		}
		if !slices.Equal(tagged, want) {
			t.Errorf("%q: FTS5 reads the tagged text as %q, want %q", text, tagged, want)
		}
	}
}

package models

import (
	"context"
	"strings"
	"testing"
	"time"
)

// FuzzSearchQuery: whatever a person types into the search box, the search
// runs without an error on SQLite (no FTS5 syntax reaches the index: the
// query is quoted phrases, each opening with the searcher's tag) and the
// PostgreSQL query is only words and its own operators.
func FuzzSearchQuery(f *testing.F) {
	for _, seed := range []string{
		"kubernetes", `"quoted" phrase`, "a*", "NEAR(a b)", "-x", "col:term", "a & b | !c", `\`, "%_",
		"'; DROP TABLE messages; --", "ＡＢＣ", "café", "한국어 검색", "e\u0301", "\x00", "\xff\xfe", "((((", "^a", "a OR b", "{a b}",
	} {
		f.Add(seed)
	}
	db := openTestDB(f, "sqlite://"+f.TempDir()+"/fuzz.db")
	seedConversation(f, db, 1, "fuzz title", time.Now(), "some text to find", "an answer")
	f.Fuzz(func(t *testing.T, q string) {
		if len(q) > 800 {
			return // the service refuses longer searches
		}
		if _, err := ListConversations(context.Background(), db, 1, q, nil, 51); err != nil {
			t.Fatalf("search %q: %v", q, err)
		}
		terms := searchTerms(q)
		tag := ownerTag(1)
		phrases := strings.Split(strings.ReplaceAll(ftsQuery(tag, terms), `""`, ""), " ")
		for i, p := range phrases {
			if len(terms) > 0 && (!strings.HasPrefix(p, `"`) || !strings.HasSuffix(p, `"*`) || strings.Count(p, `"`) != 2 ||
				strings.ContainsAny(terms[i][:1], "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") && !strings.HasPrefix(p, `"`+tag)) {
				t.Fatalf("FTS5 query of %q: phrase %q", q, p)
			}
		}
		for _, r := range tsQuery(terms) {
			if r == '\'' || r == '(' || r == ')' || r == '|' || r == '!' || r == '<' || r == '\\' {
				t.Fatalf("tsquery of %q holds %q", q, r)
			}
		}
	})
}

package models

import (
	"context"
	"testing"
	"time"
)

// FuzzSearchQuery: whatever a person types into the search box, the search
// runs without an error on SQLite (no FTS5 syntax reaches the index) and
// the PostgreSQL query is only words and its own operators.
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
		for _, r := range tsQuery(searchTerms(q)) {
			if r == '\'' || r == '(' || r == ')' || r == '|' || r == '!' || r == '<' || r == '\\' {
				t.Fatalf("tsquery of %q holds %q", q, r)
			}
		}
	})
}

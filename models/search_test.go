package models

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"moonji/internal/testdb"

	"gorm.io/gorm"
)

// testDatabases lists the databases the model tests run on: SQLite always,
// PostgreSQL too when MOONJI_TEST_POSTGRES_DSN is set. Each call of a
// maker opens a fresh, migrated database (a new file, or a new schema)
// that the test's cleanup removes.
func testDatabases() map[string]func(t testing.TB) *gorm.DB {
	dbs := map[string]func(t testing.TB) *gorm.DB{
		"sqlite": func(t testing.TB) *gorm.DB { return openTestDB(t, "sqlite://"+t.TempDir()+"/moonji.db") },
	}
	if dsn := os.Getenv("MOONJI_TEST_POSTGRES_DSN"); dsn != "" {
		dbs["postgres"] = func(t testing.TB) *gorm.DB { return openTestDB(t, freshPostgresSchema(t, dsn)) }
	}
	return dbs
}

// searchPlans are the values of forcePlan the tests try: every plan must
// give the same answers.
var searchPlans = []string{"index", "walk", "window", ""}

// withPlan runs fn with forcePlan set to plan.
func withPlan(plan string, fn func()) {
	forcePlan = plan
	defer func() { forcePlan = "" }()
	fn()
}

// eachDatabase runs fn once per test database, on a fresh one.
func eachDatabase(t *testing.T, fn func(t *testing.T, db *gorm.DB)) {
	for name, open := range testDatabases() {
		t.Run(name, func(t *testing.T) { fn(t, open(t)) })
	}
}

func openTestDB(t testing.TB, dbURL string) *gorm.DB {
	t.Helper()
	db, err := Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Close(db) })
	return db
}

// freshPostgresSchema creates a schema of its own for one test and returns
// a URL whose search_path points at it.
func freshPostgresSchema(t testing.TB, dsn string) string {
	t.Helper()
	return testdb.PostgresSchema(t, dsn)
}

// seedConversation stores a conversation of userID last used at updated,
// with one message per text (alternately the person's and the assistant's).
func seedConversation(t testing.TB, db *gorm.DB, userID uint, title string, updated time.Time, texts ...string) *Conversation {
	t.Helper()
	c := &Conversation{ID: NewConversationID(), UserID: userID, Title: title, Model: "m1", CreatedAt: updated, UpdatedAt: updated}
	if err := db.Create(c).Error; err != nil {
		t.Fatal(err)
	}
	var parent *string
	for i, text := range texts {
		role := RoleUser
		if i%2 == 1 {
			role = RoleAssistant
		}
		m := &Message{ID: NewMessageID(), ConversationID: c.ID, ParentID: parent, Role: role, Content: text, Status: MessageDone}
		if err := db.Create(m).Error; err != nil {
			t.Fatal(err)
		}
		parent = &m.ID
	}
	return c
}

// search returns the titles of the person's conversations matching query
// (first 100), the same with every plan.
func search(t testing.TB, db *gorm.DB, userID uint, query string) []string {
	t.Helper()
	var first []string
	for i, plan := range searchPlans {
		var rows []Conversation
		var err error
		withPlan(plan, func() { rows, err = ListConversations(context.Background(), db, userID, query, nil, 100) })
		if err != nil {
			t.Fatalf("search %q (plan %q): %v", query, plan, err)
		}
		var titles []string
		for _, c := range rows {
			titles = append(titles, c.Title)
		}
		if i == 0 {
			first = titles
		} else if !slices.Equal(titles, first) {
			t.Errorf("search %q: plan %q found %q, plan %q %q", query, plan, titles, searchPlans[0], first)
		}
	}
	return first
}

func TestSearchTerms(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"kubernetes deploy", []string{"kubernetes", "deploy"}},
		{`"quoted" NEAR(a b) -x col:y`, []string{"quoted", "NEAR", "col", "a", "b", "x", "y"}},
		{"kube Kubernetes KUBE", []string{"Kubernetes"}},
		{"main.go v1.2.3", []string{"main", "go", "v1", "2", "3"}},
		{"café e\u0301t\u0301e\u0301", []string{"e\u0301t\u0301e\u0301", "café"}},
		{"\u0301 ! ?? *** \xff", nil},
		{"日本語 😀 text", []string{"text", "日本語"}},
		{"", nil},
	} {
		got := searchTerms(c.in)
		if !slices.Equal(got, c.want) {
			t.Errorf("searchTerms(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := searchTerms(strings.Repeat("ab", 5) + " " + strings.Repeat("x ", 100) + "a1 a2 a3 a4 a5 a6 a7 a8 a9 b1 b2 b3 b4 b5 b6 b7 b8 b9"); len(got) != maxSearchTerms || got[0] != "ababababab" {
		t.Errorf("many terms: %q", got)
	}
	if got := ftsQuery("000001", []string{"a", `b"c`}); got != `"000001a"* "000001b""000001c"*` {
		t.Errorf("ftsQuery = %s", got)
	}
	if got := tsQuery([]string{"a", "b\u0301c", "½"}); got != "a:* & bc:*" {
		t.Errorf("tsQuery = %s", got)
	}
}

// History search: by title and by message text, word starts, every word
// in one place, any case; only the person's own conversations, newest
// first.
func TestSearchConversations(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
		at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
		seedConversation(t, db, 1, "Kubernetes deployment help", at(9), "How do I roll back?", "Use kubectl rollout undo deployment/web.")
		seedConversation(t, db, 1, "Dinner ideas", at(8), "A quick recipe with Lentils", "Try a lentil soup with cumin and garlic.")
		seedConversation(t, db, 1, "", at(7), "Tuning a PostgreSQL GIN index", "Raise maintenance_work_mem; check gin_pending_list_limit.")
		seedConversation(t, db, 1, "Split words", at(6), "alpha is here", "beta is here")
		seedConversation(t, db, 1, "Together", at(5), "alpha and BETA together", "ok")
		seedConversation(t, db, 1, "Files", at(4), "Edit main.go and nginx.conf on example.com", "Release v1.2.3 on 2026-12-01")
		seedConversation(t, db, 1, "Ünïcödé ÉTÉ", at(3), "Страница про Ёлку", "日本語 テキスト")
		seedConversation(t, db, 1, "Operators", at(2), "a NOT b AND c OR d NEAR e", "x")
		seedConversation(t, db, 2, "Kubernetes secrets of someone else", at(10), "lentil kubectl alpha beta")
		all := []string{"Kubernetes deployment help", "Dinner ideas", "", "Split words", "Together", "Files", "Ünïcödé ÉTÉ", "Operators"}

		for _, c := range []struct {
			name, q string
			want    []string
		}{
			{"title", "kubernetes", []string{"Kubernetes deployment help"}},
			{"message text", "kubectl", []string{"Kubernetes deployment help"}},
			{"untitled by its message", "postgresql", []string{""}},
			{"prefix", "kube", []string{"Kubernetes deployment help"}},
			{"prefix of a later word", "roll", []string{"Kubernetes deployment help"}},
			{"case", "KUBECTL", []string{"Kubernetes deployment help"}},
			{"mixed case data", "lentils", []string{"Dinner ideas"}},
			{"two words in one message", "lentil cumin", []string{"Dinner ideas"}},
			{"two words in one title", "dinner IDEAS", []string{"Dinner ideas"}},
			{"words in different messages", "recipe cumin", nil},
			{"title word and message word", "dinner cumin", nil},
			{"all words in one message", "alpha beta", []string{"Together"}},
			{"one word, several conversations, newest first", "alpha", []string{"Split words", "Together"}},
			{"word order", "beta alpha", []string{"Together"}},
			{"punctuation between words", "alpha, beta!", []string{"Together"}},
			{"part of a file name", "go", []string{"Files"}},
			{"file name", "main.go", []string{"Files"}},
			{"host part", "com", []string{"Files"}},
			{"version", "v1.2.3", []string{"Files"}},
			{"version part", "3", []string{"Files"}},
			{"date", "2026-12-01", []string{"Files"}},
			{"underscore", "maintenance_work", []string{""}},
			{"non-ASCII title, any case", "ünïcödé été", []string{"Ünïcödé ÉTÉ"}},
			{"Cyrillic, any case", "ёлку СТРАНИЦА", []string{"Ünïcödé ÉTÉ"}},
			{"Japanese", "テキスト", []string{"Ünïcödé ÉTÉ"}},
			{"operator words are words", "not and or near", []string{"Operators"}},
			{"no match", "zzzzz", nil},
			{"a word nobody wrote beside one they did", "kubectl zzzzz", nil},
			{"punctuation only finds nothing", `"*-:()`, nil},
			{"blank is no search", "   ", all},
		} {
			if got := search(t, db, 1, c.q); !slices.Equal(got, c.want) {
				t.Errorf("%s: search %q = %q, want %q", c.name, c.q, got, c.want)
			}
		}
		if got := search(t, db, 2, "kubectl"); !slices.Equal(got, []string{"Kubernetes secrets of someone else"}) {
			t.Errorf("person 2: %q", got)
		}
		if got := search(t, db, 3, "kubectl"); got != nil {
			t.Errorf("person 3 found %q", got)
		}
		if db.Dialector.Name() == "sqlite" {
			// FTS5's remove_diacritics; PostgreSQL's 'simple' keeps accents.
			if got := search(t, db, 1, "unicode ete"); !slices.Equal(got, []string{"Ünïcödé ÉTÉ"}) {
				t.Errorf("without accents: %q", got)
			}
		}
		// A deleted conversation is gone from the results, by title and text.
		rows, _ := ListConversations(ctx, db, 1, "kubernetes", nil, 10)
		if err := DeleteConversation(ctx, db, 2, rows[0].ID); err != ErrNotFound {
			t.Fatalf("someone else deleting it: %v", err)
		}
		if err := DeleteConversation(ctx, db, 1, rows[0].ID); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"kubernetes", "kubectl", "rollout"} {
			if got := search(t, db, 1, q); got != nil {
				t.Errorf("deleted conversation found by %q: %q", q, got)
			}
		}
		if got := search(t, db, 2, "kubectl"); len(got) != 1 {
			t.Errorf("someone else's deleted too: %q", got)
		}
		// A renamed conversation is found by its new title only.
		rows, _ = ListConversations(ctx, db, 1, "dinner", nil, 10)
		if err := RenameConversation(ctx, db, 1, rows[0].ID, "Supper plans"); err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 1, "dinner"); got != nil {
			t.Errorf("old title found: %q", got)
		}
		if got := search(t, db, 1, "supper"); !slices.Equal(got, []string{"Supper plans"}) {
			t.Errorf("new title: %q", got)
		}
	})
}

// A streaming reply is found by the text saved so far, then by its final
// text and no longer by the partial one; the title given by the first
// message is found too.
func TestSearchFollowsMessageUpdates(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		conv := &Conversation{ID: NewConversationID(), UserID: 1, Model: "m1"}
		if err := CreateConversation(ctx, db, conv); err != nil {
			t.Fatal(err)
		}
		inf := "inf_search"
		user := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleUser, Content: "Tell me about animals", Status: MessageDone}
		reply := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming, InferenceID: &inf}
		if err := StartExchange(ctx, db, conv, user, reply, "Animal facts"); err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 1, "animal facts"); len(got) != 1 {
			t.Fatalf("new title: %q", got)
		}
		if err := SaveMessageContent(ctx, db, reply.ID, "The zebra has stripes"); err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 1, "zebra stripes"); len(got) != 1 {
			t.Errorf("partial text: %q", got)
		}
		if err := FinishMessage(ctx, db, reply.ID, MessageEnd{Status: MessageDone, Content: "The giraffe is tall"}); err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 1, "zebra"); got != nil {
			t.Errorf("old partial text still found: %q", got)
		}
		if got := search(t, db, 1, "giraffe tall"); len(got) != 1 {
			t.Errorf("final text: %q", got)
		}
	})
}

// Pages of search results follow each other without gaps or repeats, in
// order, ties on updated_at broken by id.
func TestSearchPagination(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
		for i := range 23 {
			at := t0.Add(time.Duration(i/3) * time.Second) // three at a time share a timestamp
			text := "filler text"
			if i%2 == 0 {
				text = "the needle is here"
			}
			seedConversation(t, db, 1, "", at, "question", text)
			seedConversation(t, db, 2, "", at, "needle of someone else")
		}
		// Newest first; within a timestamp, the greater id first.
		var all []Conversation
		db.Where("user_id = ?", 1).Order("updated_at DESC, id DESC").Find(&all)
		var want []string
		for _, c := range all {
			msgs, _ := ConversationMessages(ctx, db, c.ID)
			if strings.Contains(msgs[1].Content, "needle") {
				want = append(want, c.ID)
			}
		}
		for _, plan := range searchPlans {
			for _, pc := range []struct {
				q    string
				size int
			}{{"needle", 5}, {"NEE", 5}, {"needle", 1}, {"NEE", 1}} { // a long word, a short one
				q := pc.q
				var got []string
				var after *ConversationCursor
				for pages := 0; ; pages++ {
					if pages > 30 {
						t.Fatal("pagination does not end")
					}
					var rows []Conversation
					var err error
					withPlan(plan, func() { rows, err = ListConversations(ctx, db, 1, q, after, pc.size) })
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range rows {
						got = append(got, c.ID)
					}
					if len(rows) < pc.size {
						break
					}
					last := rows[len(rows)-1]
					after = &ConversationCursor{UpdatedAt: last.UpdatedAt, ID: last.ID}
				}
				if len(want) != 12 || !slices.Equal(got, want) {
					t.Errorf("plan %q, %q by %d: pages gave %d conversations %q, want %d %q", plan, q, pc.size, len(got), got, len(want), want)
				}
			}
		}
	})
}

// Whatever a person types, a search answers (maybe with nothing) and never
// fails: the text is never query syntax.
func TestSearchHostileQueries(t *testing.T) {
	hostile := []string{
		`"`, `""`, `"*`, `*`, `**`, `a*`, `*a`, `NEAR(a b)`, `NEAR(`, `NEAR(a b, 2)`, `a -b`, `-`, `--`,
		`content:x`, `title:x`, `col:`, `:`, `a:*`, `a & b | !c (d)`, `&|!()`, `!`, `(`, `)`, `a <-> b`, `a <2> b`,
		`\`, `\\`, `\"`, `a\`, `%`, `_`, `%_%`, `100%`, `'`, `''`, `a'b`, `'; DROP TABLE messages; --`, `' OR 1=1 --`,
		`" OR 1=1 --`, `x') OR ('1'='1`, `AND`, `OR`, `NOT`, `a AND`, `NOT a`, `a OR`, `^a`, `{a b}: c`, `a + b`, `+`,
		`$1`, `?`, `@@`, `::text`, `@ rowid`, `rowid`, `messages_fts`, `*:*`, `a:*B`, `x:A`, `x:*&y`, "\u0301", "a\u0301",
		"𞤀𞤁", "ꞔ", "𝔘𝔫𝔦", "😀", "👩‍👩‍👧", "a\x00b", "\xff\xfe", "日本語", "ﬁ", "İstanbul", "ß", "ǅ", "\u200b", "\u00a0",
		"\u202e", "Ⅻ", "½", "²", "٣", "\U000F0000", "\ufeff", "\t\n\r", strings.Repeat("*", 200), strings.Repeat(`"`, 199),
		strings.Repeat("NEAR(", 40), strings.Repeat("a ", 100), strings.Repeat("ab", 100), strings.Repeat("é", 200),
		strings.Repeat("x:* & ", 33), strings.Repeat("\\'\"%_*-:()&|!", 15),
	}
	junk := make([]byte, 200)
	for i := range junk {
		junk[i] = byte(32 + (i*37)%95)
	}
	hostile = append(hostile, string(junk))
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		seedConversation(t, db, 1, "Normal title", time.Now(), "normal text with ab and a and NEAR words", "reply")
		for _, plan := range searchPlans {
			withPlan(plan, func() {
				for _, q := range hostile {
					if _, err := ListConversations(ctx, db, 1, q, nil, 51); err != nil {
						t.Errorf("plan %q: search %q: %v", plan, q, err)
					}
					after := &ConversationCursor{UpdatedAt: time.Now(), ID: "c_zzz"}
					if _, err := ListConversations(ctx, db, 1, q, after, 1); err != nil {
						t.Errorf("plan %q: search %q after a cursor: %v", plan, q, err)
					}
				}
			})
		}
		// Still there afterwards.
		if got := search(t, db, 1, "normal"); len(got) != 1 {
			t.Fatalf("after the hostile queries: %q", got)
		}
		// Punctuation only finds nothing; words among the junk still count.
		if got := search(t, db, 1, `"*()-:`); got != nil {
			t.Errorf("punctuation only: %q", got)
		}
		if got := search(t, db, 1, `NEAR("normal" -text*)`); len(got) != 1 {
			t.Errorf("words among operators: %q", got)
		}
		if got := search(t, db, 1, `'; DROP TABLE messages; --`); got != nil {
			t.Errorf("SQL: %q", got)
		}
	})
}

// A message too long for one tsvector is still stored (PostgreSQL indexes
// its first 100,000 characters) and found by its start.
func TestSearchHugeMessage(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		var b strings.Builder
		b.WriteString("beginning ")
		for i := range 60000 {
			var r [8]byte
			_, _ = rand.Read(r[:])
			b.WriteString(hex.EncodeToString(r[:]))
			if i%2 == 0 {
				b.WriteByte(' ')
			} else {
				b.WriteByte('\n')
			}
		}
		seedConversation(t, db, 1, "big", time.Now(), b.String()) // ~1.1 MB of distinct words
		if got := search(t, db, 1, "beginning"); len(got) != 1 {
			t.Errorf("huge message: %q", got)
		}
		// The most distinct words 100,000 characters hold (one-letter words
		// of four bytes), for a person whose id makes the longest tag: the
		// tagged words must still fit in a tsvector.
		b.Reset()
		b.WriteString("beginning")
		for r, n := rune(0x20000), 0; n < 50000; r++ {
			if unicode.IsLetter(r) {
				b.WriteByte(' ')
				b.WriteRune(r)
				n++
			}
		}
		const bigID = 1 << 62
		seedConversation(t, db, bigID, "bigger", time.Now(), b.String())
		if got := search(t, db, bigID, "beginning"); len(got) != 1 {
			t.Errorf("many distinct words: %q", got)
		}
		if got := search(t, db, bigID, string(rune(0x20000))); len(got) != 1 {
			t.Errorf("many distinct words, the first: %q", got)
		}
	})
}

// Two replies cannot stream at once in one conversation, even when their
// transactions run together on two replicas: the partial unique index
// refuses the second, as ErrBusy.
func TestStartExchangeConcurrent(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		for round := range 20 {
			conv := &Conversation{ID: NewConversationID(), UserID: 1, Model: "m1"}
			if err := CreateConversation(ctx, db, conv); err != nil {
				t.Fatal(err)
			}
			const n = 6
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					inf := "inf_" + NewMessageID()
					user := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleUser, Content: "hi", Status: MessageDone}
					reply := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming, InferenceID: &inf}
					<-start
					errs[i] = StartExchange(ctx, db, conv, user, reply, "t")
				}()
			}
			close(start)
			wg.Wait()
			ok := 0
			for _, err := range errs {
				switch {
				case err == nil:
					ok++
				case !errors.Is(err, ErrBusy):
					t.Fatalf("round %d: %v", round, err)
				}
			}
			msgs, _ := ConversationMessages(ctx, db, conv.ID)
			if ok != 1 || len(msgs) != 2 {
				t.Fatalf("round %d: %d exchanges started, %d messages stored; want 1 and 2", round, ok, len(msgs))
			}
		}
	})
}

// The index itself refuses a second streaming message, whoever writes it,
// and StartExchange turns that refusal into ErrBusy; finished messages are
// not limited.
func TestOneStreamingIndex(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		conv := seedConversation(t, db, 1, "t", time.Now(), "a", "b", "c")
		add := func(status string) error {
			return db.Create(&Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: status}).Error
		}
		if err := add(MessageStreaming); err != nil {
			t.Fatal(err)
		}
		err := add(MessageStreaming)
		if err == nil || !isOneStreamingViolation(err) {
			t.Fatalf("second streaming message: %v", err)
		}
		if err := add(MessageDone); err != nil {
			t.Fatal(err)
		}
		inf := "inf_dup"
		dup := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming, InferenceID: &inf}
		if err := db.Create(dup).Error; !isOneStreamingViolation(err) {
			t.Fatalf("not a violation: %v", err)
		}
		// A duplicate inference id is another unique index: not ErrBusy.
		other := seedConversation(t, db, 1, "u", time.Now())
		inf2 := "inf_x"
		if err := db.Create(&Message{ID: NewMessageID(), ConversationID: other.ID, Status: MessageDone, InferenceID: &inf2}).Error; err != nil {
			t.Fatal(err)
		}
		err = db.Create(&Message{ID: NewMessageID(), ConversationID: other.ID, Status: MessageDone, InferenceID: &inf2}).Error
		if err == nil || isOneStreamingViolation(err) {
			t.Fatalf("duplicate inference id: %v", err)
		}
	})
}

// A message is in the search index exactly while its conversation exists,
// whatever order rows come and go in: a message stored before its
// conversation is found once the conversation is; a conversation deleted
// before its messages takes them out of the index, so the next
// conversation, which SQLite may give the same rowid, is not found by
// their words.
func TestSearchIndexFollowsConversations(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		id := NewConversationID()
		if err := db.Create(&Message{ID: NewMessageID(), ConversationID: id, Role: RoleUser, Content: "early walrus", Status: MessageDone}).Error; err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 1, "walrus"); got != nil {
			t.Fatalf("found without a conversation: %q", got)
		}
		if err := db.Create(&Conversation{ID: id, UserID: 1, Title: "late"}).Error; err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 1, "walrus"); !slices.Equal(got, []string{"late"}) {
			t.Fatalf("message stored first: %q", got)
		}
		var before int64
		db.Raw("SELECT rowid FROM conversations WHERE id = ?", id).Scan(&before)
		if err := db.Delete(&Conversation{}, "id = ?", id).Error; err != nil { // its messages stay
			t.Fatal(err)
		}
		next := seedConversation(t, db, 2, "next", time.Now())
		var after int64
		db.Raw("SELECT rowid FROM conversations WHERE id = ?", next.ID).Scan(&after)
		if db.Dialector.Name() == "sqlite" && after != before {
			t.Logf("SQLite did not reuse rowid %d (got %d): the case below is weaker", before, after)
		}
		if got := search(t, db, 2, "walrus"); got != nil {
			t.Errorf("the next conversation (rowid %d, the deleted one's %d) found by the deleted one's words: %q", after, before, got)
		}
		if err := db.Where("conversation_id = ?", id).Delete(&Message{}).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Create(&Message{ID: NewMessageID(), ConversationID: next.ID, Role: RoleUser, Content: "a walrus again", Status: MessageDone}).Error; err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 2, "walrus"); !slices.Equal(got, []string{"next"}) {
			t.Errorf("after all that: %q", got)
		}
		if db.Dialector.Name() == "sqlite" {
			if err := db.Exec("INSERT INTO " + searchFTS + "(" + searchFTS + ") VALUES ('integrity-check')").Error; err != nil {
				t.Errorf("%s: %v", searchFTS, err)
			}
		}
	})
}

// StartExchange turns the index's refusal into ErrBusy: here a streaming
// reply appears, as if from another replica, between its check and its
// insert (inside its transaction, so that SQLite's lock lets it in).
func TestStartExchangeLosesRace(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		conv := seedConversation(t, db, 1, "raced", time.Now(), "q", "a")
		inf := "inf_raced"
		user := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleUser, Content: "again", Status: MessageDone}
		reply := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming, InferenceID: &inf}
		raced := false
		err := db.Callback().Create().Before("gorm:create").Register("test:race", func(tx *gorm.DB) {
			if m, ok := tx.Statement.Dest.(*Message); ok && m == reply && !raced {
				raced = true
				err := tx.Session(&gorm.Session{NewDB: true}).Create(&Message{ID: NewMessageID(), ConversationID: conv.ID,
					Role: RoleAssistant, Status: MessageStreaming}).Error
				if err != nil {
					t.Errorf("the racing reply: %v", err)
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := StartExchange(ctx, db, conv, user, reply, ""); !errors.Is(err, ErrBusy) {
			t.Fatalf("lost race: %v", err)
		}
		if !raced {
			t.Fatal("the race did not run")
		}
		msgs, _ := ConversationMessages(ctx, db, conv.ID)
		if len(msgs) != 2 {
			t.Errorf("%d messages after the lost race, want the 2 before it", len(msgs))
		}
	})
}

package models

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

// listAll pages through the person's conversations (of folder, matching
// query) size at a time with plan, following cursors as chat.Service
// does, and returns their ids in the order shown.
func listAll(t *testing.T, db *gorm.DB, userID uint, folder, query, plan string, size int) []string {
	t.Helper()
	var got []string
	var after *ConversationCursor
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("pagination does not end")
		}
		var rows []Conversation
		var err error
		withPlan(plan, func() { rows, err = ListConversationsIn(context.Background(), db, userID, folder, query, after, size) })
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range rows {
			got = append(got, c.ID)
		}
		if len(rows) < size {
			return got
		}
		cur := CursorOf(&rows[len(rows)-1])
		after = &cur
	}
}

// Pinned conversations come first, then the others, each last used first,
// and pages follow each other across the boundary without a gap or a
// repeat, whatever the page size, with and without a search or a folder,
// with every search plan; ties on updated_at are broken by id.
func TestPinnedFirstAcrossPages(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
		type row struct {
			id             string
			pinned, needle bool
			folder         string
			at             time.Time
		}
		var rows []row
		for i := range 29 {
			at := t0.Add(time.Duration(i/3) * time.Second) // three at a time share a timestamp
			text := "filler text"
			if i%2 == 0 {
				text = "the needle is here"
			}
			c := seedConversation(t, db, 1, "", at, "question", text)
			r := row{id: c.ID, pinned: i%4 == 1 || i == 28, needle: i%2 == 0, at: at}
			if i%3 == 0 {
				r.folder = "Work"
			}
			err := ChangeConversation(context.Background(), db, 1, c.ID, ConversationChange{Pinned: &r.pinned, Folder: &r.folder}, 0)
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, r)
			seedConversation(t, db, 2, "", at, "needle of someone else")
		}
		slices.SortFunc(rows, func(a, b row) int {
			switch {
			case a.pinned != b.pinned:
				if a.pinned {
					return -1
				}
				return 1
			case !a.at.Equal(b.at):
				return b.at.Compare(a.at)
			}
			return -1 * compareStrings(a.id, b.id)
		})
		want := func(keep func(row) bool) []string {
			var ids []string
			for _, r := range rows {
				if keep(r) {
					ids = append(ids, r.id)
				}
			}
			return ids
		}
		all := want(func(row) bool { return true })
		if n := len(want(func(r row) bool { return r.pinned })); n != 8 {
			t.Fatalf("%d pinned conversations seeded, want 8", n)
		}
		for _, size := range []int{1, 3, 7, 8, 9, 50} {
			if got := listAll(t, db, 1, "", "", "", size); !slices.Equal(got, all) {
				t.Errorf("by %d: %q\nwant %q", size, got, all)
			}
			work := want(func(r row) bool { return r.folder == "Work" })
			if got := listAll(t, db, 1, "Work", "", "", size); !slices.Equal(got, work) {
				t.Errorf("folder Work by %d: %q\nwant %q", size, got, work)
			}
			for _, plan := range searchPlans {
				for _, q := range []string{"needle", "NEE"} { // a long word, a short one
					needles := want(func(r row) bool { return r.needle })
					if got := listAll(t, db, 1, "", q, plan, size); !slices.Equal(got, needles) {
						t.Errorf("plan %q, %q by %d: %q\nwant %q", plan, q, size, got, needles)
					}
					both := want(func(r row) bool { return r.needle && r.folder == "Work" })
					if got := listAll(t, db, 1, "Work", q, plan, size); len(both) == 0 || !slices.Equal(got, both) {
						t.Errorf("plan %q, %q in Work by %d: %q\nwant %q", plan, q, size, got, both)
					}
				}
			}
		}
		// No one else's, in no folder of theirs.
		if got := listAll(t, db, 2, "Work", "", "", 50); len(got) != 0 {
			t.Errorf("person 2's folder Work: %q", got)
		}
	})
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// A pin or a folder changes neither the conversation's place among the
// others (updated_at) nor anyone else's conversation; a title does move it.
// A person's folders are listed from the index, at most the limit; a new
// folder past the bound is refused, an existing one is not.
func TestChangeConversationAndFolders(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		c := seedConversation(t, db, 1, "mine", at)
		other := seedConversation(t, db, 2, "theirs", at)
		pin, folder := true, "Trips"
		if err := ChangeConversation(ctx, db, 1, c.ID, ConversationChange{Pinned: &pin, Folder: &folder}, 3); err != nil {
			t.Fatal(err)
		}
		got, err := ConversationOf(ctx, db, 1, c.ID)
		if err != nil || !got.Pinned || got.Folder != "Trips" || !got.UpdatedAt.Equal(at) {
			t.Fatalf("after a pin and a move: %+v, %v", got, err)
		}
		if err := ChangeConversation(ctx, db, 1, other.ID, ConversationChange{Pinned: &pin}, 3); !errors.Is(err, ErrNotFound) {
			t.Fatalf("pinning someone else's: %v", err)
		}
		if o, _ := ConversationOf(ctx, db, 2, other.ID); o.Pinned {
			t.Fatal("someone else's conversation pinned")
		}
		title := "renamed"
		if err := ChangeConversation(ctx, db, 1, c.ID, ConversationChange{Title: &title}, 3); err != nil {
			t.Fatal(err)
		}
		if got, _ := ConversationOf(ctx, db, 1, c.ID); got.UpdatedAt.Equal(at) || !got.Pinned || got.Folder != "Trips" {
			t.Fatalf("after a rename: %+v", got)
		}

		for i, name := range []string{"b", "A", "a"} {
			cc := seedConversation(t, db, 1, "", at)
			err := ChangeConversation(ctx, db, 1, cc.ID, ConversationChange{Folder: &name}, 3)
			if i < 2 && err != nil {
				t.Fatalf("folder %q: %v", name, err)
			}
			if i == 2 && !errors.Is(err, ErrTooManyFolders) {
				t.Fatalf("a fourth folder past a bound of 3: %v", err)
			}
		}
		cc := seedConversation(t, db, 1, "", at)
		if err := ChangeConversation(ctx, db, 1, cc.ID, ConversationChange{Folder: &folder}, 3); err != nil {
			t.Fatalf("an existing folder at the bound: %v", err)
		}
		none := ""
		if err := ChangeConversation(ctx, db, 1, cc.ID, ConversationChange{Folder: &none}, 3); err != nil {
			t.Fatalf("out of any folder at the bound: %v", err)
		}
		names, err := ConversationFolders(ctx, db, 1, 10)
		slices.Sort(names)
		if err != nil || !slices.Equal(names, []string{"A", "Trips", "b"}) {
			t.Fatalf("folders %q, %v", names, err)
		}
		if names, _ := ConversationFolders(ctx, db, 1, 2); len(names) != 2 {
			t.Fatalf("two folders at most: %q", names)
		}
		if names, _ := ConversationFolders(ctx, db, 2, 10); len(names) != 0 {
			t.Fatalf("person 2's folders: %q", names)
		}
	})
}

// A database of before pins (no pinned or folder column, the list's old
// index) is brought up to date with its conversations unpinned and in no
// folder, the old index replaced, and its search still working.
func TestMigrateAddsPinsAndFolders(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		for _, stmt := range []string{
			"DROP INDEX " + idxConversationsList, "DROP INDEX " + idxConversationsFolder,
			"ALTER TABLE conversations DROP COLUMN pinned", "ALTER TABLE conversations DROP COLUMN folder",
			"ALTER TABLE users DROP COLUMN default_system_prompt",
			"CREATE INDEX " + idxConversationsOld + " ON conversations (user_id, updated_at)",
		} {
			if err := db.Exec(stmt).Error; err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		at := time.Now().UTC()
		id := NewConversationID()
		if err := db.Exec("INSERT INTO conversations (id, user_id, title, model, created_at, updated_at) VALUES (?, 1, 'old', 'm1', ?, ?)",
			id, at, at).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("INSERT INTO messages (id, conversation_id, role, content, status) VALUES (?, ?, 'user', 'sourdough starter', 'done')",
			NewMessageID(), id).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("INSERT INTO users (email) VALUES ('old@example.com')").Error; err != nil {
			t.Fatal(err)
		}
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		m := db.Migrator()
		if m.HasIndex(&Conversation{}, idxConversationsOld) || !m.HasIndex(&Conversation{}, idxConversationsList) ||
			!m.HasIndex(&Conversation{}, idxConversationsFolder) {
			t.Fatal("the list's indexes were not replaced")
		}
		rows, err := ListConversations(context.Background(), db, 1, "", nil, 10)
		if err != nil || len(rows) != 1 || rows[0].Pinned || rows[0].Folder != "" {
			t.Fatalf("after the upgrade: %+v, %v", rows, err)
		}
		if got := search(t, db, 1, "sourdough"); len(got) != 1 {
			t.Fatalf("search after the upgrade: %q", got)
		}
		u, err := UserByEmail(context.Background(), db, "old@example.com")
		if err != nil || u.DefaultSystemPrompt != "" {
			t.Fatalf("a person of before: %+v, %v", u, err)
		}
		if p, err := DefaultSystemPrompt(context.Background(), db, u.ID); err != nil || p != "" {
			t.Fatalf("their default system prompt: %q, %v", p, err)
		}
	})
}

// The list's query walks the list's index in order and stops at its limit:
// no sort of the person's conversations, first page or later, in a folder
// or not.
func TestListUsesItsIndex(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		at := time.Now().UTC()
		var convs []Conversation
		for i := range 3000 {
			c := Conversation{ID: NewConversationID(), UserID: uint(1 + i%3), Model: "m1", UpdatedAt: at.Add(time.Duration(i) * time.Second),
				Pinned: i%50 == 0, Folder: fmt.Sprint("f", i%4)}
			convs = append(convs, c)
		}
		if err := db.CreateInBatches(convs, 500).Error; err != nil {
			t.Fatal(err)
		}
		db.Exec("ANALYZE")
		// A later page deep in the list: hundreds of the person's
		// conversations lie behind the cursor, and the planner must know it
		// (estimated at one row, the folder's index and the list's index
		// filtered by folder cost the same, and PostgreSQL took either).
		cur := &ConversationCursor{Pinned: false, UpdatedAt: at.Add(2500 * time.Second), ID: "c_x"}
		for _, folder := range []string{"", "f2"} {
			for _, after := range []*ConversationCursor{nil, cur} {
				plan := explainList(t, db, folder, after)
				index := idxConversationsList
				if folder != "" {
					index = idxConversationsFolder
				}
				t.Logf("folder %q, after %v:\n%s", folder, after != nil, plan)
				if !containsAll(plan, index) || containsAny(plan, "TEMP B-TREE", "Sort") {
					t.Errorf("folder %q, after %v: plan %s", folder, after, plan)
				}
				if db.Dialector.Name() == "postgres" && after != nil && estimatedRows(plan) < 100 {
					t.Errorf("folder %q: the planner expects %d rows behind the cursor, hundreds are there", folder, estimatedRows(plan))
				}
			}
		}
	})
}

// explainList is the plan of the list's query (a page of 51).
func explainList(t *testing.T, db *gorm.DB, folder string, after *ConversationCursor) string {
	t.Helper()
	stmt := listQuery(db.Session(&gorm.Session{DryRun: true}), 1, folder, after).Limit(51).Find(&[]Conversation{}).Statement
	return queryPlan(t, db, stmt.SQL.String(), stmt.Vars...)
}

// estimatedRows is PostgreSQL's estimate of the rows its plan's scan
// (the second line) reads, 0 when the plan has none.
func estimatedRows(plan string) int {
	m := regexp.MustCompile(`Scan.* rows=(\d+)`).FindStringSubmatch(plan)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

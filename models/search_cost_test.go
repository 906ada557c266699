package models

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

// A search costs what the searcher's own history costs (issue 42): beside
// a crowd whose messages are full of words that start like the search
// (hundreds of distinct "walrus…" words in each), the crowd's postings
// cost the search nothing, whether it matches some of the searcher's
// conversations or none. The cost is counted, not timed, so that a busy
// machine changes nothing: on SQLite the bytes this process reads from the
// database's files (every statement on a fresh connection, so that
// nothing comes from a page cache), on PostgreSQL the buffers its
// statements touch (EXPLAIN ANALYZE BUFFERS of each, run again).
//
// Each search is compared with a control of the same shape whose words
// nobody wrote: what the search costs beyond its control in the crowd's
// database must be what it costs beyond it in a database of the searcher
// alone (up to four pages: a page boundary falling elsewhere). And the
// crowd's mere presence may cost a lookup one more level in each tree it
// goes down and, on SQLite, a look into each of a few more FTS5 segments
// (which grow in number with the log of the index's size), but not its
// rows: at most four times the pages plus 16, for these tiny histories,
// where reading the crowd's messages or postings is ten to a thousand
// times as many.
func TestSearchCostIgnoresOthers(t *testing.T) {
	for name, open := range testDatabases() {
		t.Run(name, func(t *testing.T) {
			if name == "sqlite" {
				if _, err := readBytesSoFar(); err != nil {
					t.Skipf("no /proc/self/io to count reads with: %v", err)
				}
			}
			alone, crowded := open(t), open(t)
			for _, db := range []*gorm.DB{alone, crowded} {
				seedSearcher(t, db)
			}
			seedCrowd(t, crowded, 300, 150)
			for _, db := range []*gorm.DB{alone, crowded} {
				settle(t, db)
			}
			for _, c := range []struct {
				q    string
				want int
			}{
				{"walrus", 1},          // a long word: the full-text index
				{"walruses", 0},        // none of the searcher's
				{"walrus42", 0},        // only the crowd's
				{"wal", 1},             // a short prefix: the walk, then the index
				{"w", 12},              // one letter
				{"walrus the", 1},      // with a word in most messages
				{"zebra walrus17", 0},  // one word of the searcher's, one of the crowd's
				{"walrus7 walrus8", 0}, // two of the crowd's
			} {
				control := controlQuery(c.q)
				for _, plan := range searchPlans {
					var n [4]int
					var unit string
					withPlan(plan, func() {
						for i, run := range []struct {
							db   *gorm.DB
							q    string
							want int
						}{{alone, c.q, c.want}, {alone, control, 0}, {crowded, c.q, c.want}, {crowded, control, 0}} {
							var rows []Conversation
							cost := searchCost(t, run.db, func() { rows = listFor(t, run.db, 1, run.q) })
							n[i], unit = cost.n, cost.unit
							if len(rows) != run.want {
								t.Errorf("plan %q: search %q found %d, want %d", plan, run.q, len(rows), run.want)
							}
						}
					})
					mine, crowds := n[0]-n[1], n[2]-n[3]
					t.Logf("plan %-8q search %-18q %s: %7d alone, %7d in the crowd; beyond the control %-18q %6d alone, %6d in the crowd",
						plan, c.q, unit, n[0], n[2], control, mine, crowds)
					page := searchCostPage(name)
					if crowds > mine+4*page {
						t.Errorf("plan %q: search %q cost %d %s beyond its control in the crowd, %d alone: the crowd's postings cost the searcher",
							plan, c.q, crowds, unit, mine)
					}
					// A plan chosen by the search itself may differ between
					// the databases (PostgreSQL's estimates); a forced one
					// does the same work in both, a level deeper in a tree.
					if plan != "" && (n[2] > 4*n[0]+16*page || n[3] > 4*n[1]+16*page) {
						t.Errorf("plan %q: search %q cost %d %s in the crowd, %d alone (its control %d, %d): the crowd's size costs the searcher",
							plan, c.q, n[2], unit, n[0], n[3], n[1])
					}
				}
			}
		})
	}
}

// controlQuery is q with each letter or digit replaced by one no word of
// these tests starts with: the same shape (words and their lengths), and
// no match anywhere.
func controlQuery(q string) string {
	const letters = "xjkvy"
	i := 0
	return strings.Map(func(r rune) rune {
		if r == ' ' {
			return r
		}
		i++
		return rune(letters[i%len(letters)])
	}, q)
}

// searchCostPage is the unit of searchCost's counts that a page is.
func searchCostPage(dialect string) int {
	if dialect == "postgres" {
		return 1
	}
	return 4096
}

// seedSearcher stores person 1's small history: a dozen conversations, one
// of which mentions a walrus, and a zebra in another.
func seedSearcher(t *testing.T, db *gorm.DB) {
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for i := range 12 {
		texts := []string{fmt.Sprintf("question %d about the weather", i), "an answer with the usual words"}
		switch i {
		case 4:
			texts[1] = "the walrus sleeps on the ice"
		case 7:
			texts[0] = "a zebra and a wombat"
		}
		seedConversation(t, db, 1, fmt.Sprintf("Notes %d", i), t0.Add(time.Duration(i)*time.Minute), texts...)
	}
}

// seedCrowd stores convs conversations of people 2 to 5 with two messages
// each, every message holding words distinct words "walrus0"… among common
// ones, in a few multi-row inserts.
func seedCrowd(t *testing.T, db *gorm.DB, convs, words int) {
	t0 := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	var cs []Conversation
	var ms []Message
	n := 0
	for i := range convs {
		c := Conversation{ID: NewConversationID(), UserID: uint(2 + i%4), Title: "Walrus facts " + strconv.Itoa(i), Model: "m1",
			CreatedAt: t0, UpdatedAt: t0.Add(time.Duration(i) * time.Second)}
		cs = append(cs, c)
		for range 2 {
			var b strings.Builder
			b.WriteString("the walrus and the")
			for range words {
				b.WriteString(" walrus")
				b.WriteString(strconv.Itoa(n))
				n++
			}
			ms = append(ms, Message{ID: NewMessageID(), ConversationID: c.ID, Role: RoleUser, Content: b.String(), Status: MessageDone})
		}
	}
	if err := db.CreateInBatches(cs, 200).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.CreateInBatches(ms, 200).Error; err != nil {
		t.Fatal(err)
	}
}

// settle puts a database in a state the counts can be compared in: SQLite's
// WAL written back to the database file; PostgreSQL's statistics fresh
// and autovacuum kept from changing them (or the indexes) mid-test.
func settle(t *testing.T, db *gorm.DB) {
	var stmts []string
	if db.Dialector.Name() == "postgres" {
		stmts = []string{
			"ALTER TABLE conversations SET (autovacuum_enabled = false)",
			"ALTER TABLE messages SET (autovacuum_enabled = false)",
			"ANALYZE conversations", "ANALYZE messages",
		}
	} else {
		stmts = []string{"PRAGMA wal_checkpoint(TRUNCATE)"}
	}
	for _, st := range stmts {
		if err := db.Exec(st).Error; err != nil {
			t.Fatalf("%s: %v", st, err)
		}
	}
}

func listFor(t *testing.T, db *gorm.DB, userID uint, q string) []Conversation {
	t.Helper()
	rows, err := ListConversations(context.Background(), db, userID, q, nil, 51)
	if err != nil {
		t.Fatalf("search %q: %v", q, err)
	}
	return rows
}

// cost is what a search read: n of unit.
type cost struct {
	n    int
	unit string
}

// searchCost runs search (once before, to warm the schema up) and counts
// what it read.
func searchCost(t *testing.T, db *gorm.DB, search func()) cost {
	t.Helper()
	search()
	if db.Dialector.Name() == "postgres" {
		return cost{n: pgBuffers(t, db, search), unit: "buffers"}
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	// No idle connection: each statement opens one, with an empty cache.
	sqlDB.SetMaxIdleConns(0)
	defer sqlDB.SetMaxIdleConns(sqliteMaxIdle)
	before, err := readBytesSoFar()
	if err != nil {
		t.Fatal(err)
	}
	search()
	after, _ := readBytesSoFar()
	return cost{n: int(after - before), unit: "bytes"}
}

// readBytesSoFar is what this process has read through read system calls
// (rchar), on Linux.
func readBytesSoFar() (int64, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "rchar:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no rchar in /proc/self/io")
}

// pgBuffers runs search, then each query it sent (but the EXPLAINs it asks
// the planner) again under EXPLAIN (ANALYZE, BUFFERS), and sums the shared
// buffers their execution touched.
func pgBuffers(t *testing.T, db *gorm.DB, search func()) int {
	t.Helper()
	type stmt struct {
		sql  string
		vars []any
	}
	var sent []stmt
	record := func(tx *gorm.DB) {
		q := tx.Statement.SQL.String()
		if !strings.HasPrefix(strings.TrimSpace(strings.ToUpper(q)), "EXPLAIN") {
			sent = append(sent, stmt{q, slices.Clone(tx.Statement.Vars)})
		}
	}
	name := "test:record_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cb := db.Callback()
	for _, err := range []error{
		cb.Query().After("gorm:query").Register(name, record),
		cb.Row().After("gorm:row").Register(name, record),
		cb.Raw().After("gorm:raw").Register(name, record),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	search()
	for _, err := range []error{cb.Query().Remove(name), cb.Row().Remove(name), cb.Raw().Remove(name)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, s := range sent {
		var out string
		if err := sqlDB.QueryRow("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+s.sql, s.vars...).Scan(&out); err != nil {
			t.Fatalf("explain %s: %v", s.sql, err)
		}
		var plans []struct {
			Plan struct {
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
			}
		}
		if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) == 0 {
			t.Fatalf("explain output %s: %v", out, err)
		}
		total += plans[0].Plan.Hit + plans[0].Plan.Read
	}
	return total
}

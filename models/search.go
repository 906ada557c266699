package models

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gorm.io/gorm"
)

// History search finds a person's conversations whose title, or one of
// whose messages, holds every word of the search, each as the start of a
// word ("kube" finds "Kubernetes"), whatever the case. It is full-text
// search in the database, with the same meaning on both dialects:
//
//   - SQLite: two FTS5 indexes with the unicode61 tokenizer and
//     remove_diacritics 2 (so "cafe" also finds "café"), kept in sync by
//     triggers. conversations_fts indexes titles, as an external-content
//     table over conversations (its rowid is the conversation's).
//     messages_fts indexes message text, contentless (it holds the index
//     only), and its rowid is the conversation's rowid << 32 + the
//     message's rowid: a match names its conversation without reading the
//     messages table. That is what keeps a search for a common word fast:
//     joining each match to its message costs ~1.5 µs a row in this pure-Go
//     SQLite, so "the" (in 95 % of 100,000 messages) took 160 ms that way
//     and ~30 ms this way. A message is in the index exactly while its
//     conversation exists (triggers on both tables), and the index has
//     prefix indexes for 1 to 3 characters, since a short prefix ("go")
//     otherwise merges the lists of every word it starts.
//   - PostgreSQL: GIN indexes on to_tsvector('simple', …) of the same two
//     columns ('simple': no stemming, no stop words, lower case; accents
//     stay, so "cafe" does not find "café" there), over the text with the
//     characters that glue words into host names, paths and versions
//     blanked (pgWords), so that words are cut as FTS5 cuts them.
//
// Titles go through full-text search too rather than LIKE: a person's
// titles alone would be cheap to scan (they are few and indexed by
// user_id), but LIKE would give them another meaning than the messages
// under them (substrings instead of word starts; in SQLite, case folding
// of ASCII only).
//
// Searches never pass the person's text as query syntax: it is cut into
// words (runs of letters, digits and combining marks) and each is quoted
// (FTS5: "word"*, inner quotes doubled) or reduced to letters and digits
// and passed as a bound parameter (PostgreSQL: word:* joined with &, to
// to_tsquery). A search without any word (only punctuation) finds nothing.

// Names of the objects the search migration creates.
const (
	messagesFTS        = "messages_fts"
	conversationsFTS   = "conversations_fts"
	messagesFTSIndex   = "idx_messages_content_fts"    // PostgreSQL
	titlesFTSIndex     = "idx_conversations_title_fts" // PostgreSQL
	oneStreamingIndex  = "idx_messages_one_streaming"  // both
	searchMigrationKey = 0x6d6f6f6e6a690009            // PostgreSQL advisory lock: "moonji", issue 9
)

// pgWords is the text PostgreSQL's parser reads, as SQL over column: the
// parser keeps host names, e-mail addresses, paths, versions and hyphenated
// words whole ("example.com", "main.go", "v1.2.3") besides some of their
// parts, so a search for "com", "go" or "2" would miss them there while
// FTS5 finds them. Blanking the characters that join such tokens leaves
// words of letters and digits only, as FTS5's tokenizer and searchTerms
// cut them.
func pgWords(column string) string {
	return "translate(" + column + ", './-@:~+<>&', '          ')"
}

// pgContentVector is the indexed expression over a message's text. Only its
// first 100,000 characters are indexed: a tsvector holds at most 1 MB of
// distinct words, and a longer one makes the INSERT or UPDATE itself fail
// ("string is too long for tsvector"); 100,000 characters cannot reach it.
// Queries must spell the expression exactly like this to use the index.
var pgContentVector = "to_tsvector('simple'::regconfig, " + pgWords("left(content, 100000)") + ")"

// pgTitleVector is the indexed expression over a conversation's title.
var pgTitleVector = "to_tsvector('simple'::regconfig, " + pgWords("title") + ")"

// maxSearchTerms bounds the words of a search that are used (each costs an
// index lookup); the words past it are ignored, so such a search may find
// more than all its words.
const maxSearchTerms = 16

// searchTerms cuts a search into its words: runs of letters, digits and
// combining marks with at least one letter or digit, without repeats or
// words that are the start of another word of the search (all words must
// match as word starts, so "kube" adds nothing to "kubernetes"), at most
// maxSearchTerms of them (the longest kept).
func searchTerms(query string) []string {
	var terms []string
	var cur strings.Builder
	hasAlnum := false
	flush := func() {
		if cur.Len() > 0 && hasAlnum {
			terms = append(terms, cur.String())
		}
		cur.Reset()
		hasAlnum = false
	}
	for _, r := range query {
		switch {
		case r == utf8.RuneError:
			flush()
		case unicode.IsLetter(r) || unicode.IsNumber(r):
			cur.WriteRune(r)
			hasAlnum = true
		case unicode.IsMark(r) && cur.Len() > 0:
			cur.WriteRune(r)
		default:
			flush()
		}
	}
	flush()
	// Longest first, so that a word's starts are seen after it.
	slices.SortStableFunc(terms, func(a, b string) int { return utf8.RuneCountInString(b) - utf8.RuneCountInString(a) })
	var kept []string
	var folded []string
	for _, t := range terms {
		f := strings.ToLower(t)
		if slices.ContainsFunc(folded, func(k string) bool { return strings.HasPrefix(k, f) }) {
			continue
		}
		kept = append(kept, t)
		folded = append(folded, f)
	}
	if len(kept) > maxSearchTerms {
		kept = kept[:maxSearchTerms]
	}
	return kept
}

// ftsQuery is the FTS5 query for terms: each a quoted prefix phrase, all
// required ("a"* "b"*).
func ftsQuery(terms []string) string {
	var b strings.Builder
	for i, t := range terms {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('"')
		b.WriteString(strings.ReplaceAll(t, `"`, `""`))
		b.WriteString(`"*`)
	}
	return b.String()
}

// tsQuery is the to_tsquery text for terms: each reduced to its letters
// and digits, as a prefix, all required (a:* & b:*). The case is left to
// to_tsquery, which folds it as to_tsvector does.
func tsQuery(terms []string) string {
	var parts []string
	for _, t := range terms {
		t = strings.Map(func(r rune) rune {
			if unicode.IsLetter(r) || unicode.IsDigit(r) {
				return r
			}
			return -1
		}, t)
		if t != "" {
			parts = append(parts, t+":*")
		}
	}
	return strings.Join(parts, " & ")
}

// Search plans. Each dialect has two:
//
//   - index: find every match through the full-text index at once, then
//     walk the person's conversations newest first, keeping those matched.
//     Its cost grows with the number of matches in the whole database.
//   - walk: walk the person's next conversations newest first and check
//     each (SQLite: a lookup in messages_fts's rowid range of the
//     conversation; PostgreSQL: the tsvector of its messages, computed up
//     to the first match). Its cost grows with the conversations walked.
//
// The walk wins by far when the words are in most messages ("the", "go", a
// letter: 95,000 matches of 100,000 messages cost 140–280 ms on PostgreSQL
// and ~30 ms on SQLite through the index, 5–8 ms walking; BENCHMARKS.md
// §9) and loses by far when they are rare. It is tried when the words look common (SQLite: all
// short enough for the prefix indexes, which also makes a check cheap;
// PostgreSQL: the planner expects them in pgWalkShare of all messages),
// over at most a window of conversations; a window without a full page of
// matches hands over to the index plan, so a person whose history differs
// from everyone else's still gets a bounded wait.
const (
	// sqliteWalkChars: words up to this long are in messages_fts's prefix
	// indexes.
	sqliteWalkChars = 3
	// sqliteWalk: conversations the walk checks on SQLite (~30 µs each).
	sqliteWalk = 200
	// pgWalkShare: PostgreSQL walks when the planner expects the words in
	// at least this share of all messages.
	pgWalkShare = 0.2
	// pgWalk: conversations the walk checks on PostgreSQL (0.1–0.3 ms per
	// message up to the first match).
	pgWalk = 150
)

// forcePlan makes tests take one plan whatever the words: "index",
// "walk" (with no window), or "window" (a walk over two conversations,
// then the index plan); "" lets the search choose.
var forcePlan string

// searchConversations returns up to limit of the conversations of base
// (the person's, after the cursor, in order) whose title or one of whose
// messages holds every word of query; none when it has no word.
func searchConversations(ctx context.Context, db *gorm.DB, base func() *gorm.DB, query string, limit int) ([]Conversation, error) {
	terms := searchTerms(query)
	if len(terms) == 0 {
		return nil, nil
	}
	var index, walk string // conditions over conversations
	var args []any
	window := 0
	if db.Dialector.Name() == "postgres" {
		tsq := tsQuery(terms)
		if tsq == "" {
			return nil, nil
		}
		const q = "to_tsquery('simple'::regconfig, ?)"
		args = []any{tsq, tsq}
		// Both subqueries under OR become hashed subplans: each index is
		// read once.
		index = "conversations.id IN (SELECT id FROM conversations WHERE " + pgTitleVector + " @@ " + q + ")" +
			" OR conversations.id IN (SELECT conversation_id FROM messages WHERE " + pgContentVector + " @@ " + q + ")"
		// The subquery with LIMIT 1 stays a check per conversation: the
		// planner can neither hash it nor make it a join, whatever its
		// estimates (which a cached generic plan lacks).
		walk = "(" + pgTitleVector + " @@ " + q + ") OR (SELECT true FROM messages WHERE messages.conversation_id = conversations.id AND " +
			pgContentVector + " @@ " + q + " LIMIT 1)"
		if forcePlan == "walk" || forcePlan == "" && pgCommon(ctx, db, tsq) {
			window = pgWalk
		}
	} else {
		m := ftsQuery(terms)
		args = []any{m, m}
		titles := "conversations.rowid IN (SELECT rowid FROM " + conversationsFTS + " WHERE " + conversationsFTS + " MATCH ?)"
		// A match names its conversation: rowid >> 32.
		index = titles + " OR conversations.rowid IN (SELECT rowid >> 32 FROM " + messagesFTS + " WHERE " + messagesFTS + " MATCH ?)"
		walk = titles + " OR EXISTS (SELECT 1 FROM " + messagesFTS + " WHERE " + messagesFTS + " MATCH ? AND " + messagesFTS + ".rowid" +
			" BETWEEN conversations.rowid << 32 AND (conversations.rowid << 32) + 4294967295)"
		short := !slices.ContainsFunc(terms, func(t string) bool { return utf8.RuneCountInString(t) > sqliteWalkChars })
		if forcePlan == "walk" || forcePlan == "" && short {
			window = sqliteWalk
		}
	}
	if forcePlan == "window" {
		window = 2
	}
	var out []Conversation
	if window > 0 {
		// The walk is bounded by the window's last conversation, a plain
		// condition, so the database walks the person's index in order and
		// stops at limit matches (a subquery with LIMIT would be read and
		// sorted whole first).
		q := base().Where(walk, args...)
		if forcePlan != "walk" {
			var end struct {
				UpdatedAt time.Time
				ID        string
			}
			res := base().Select("conversations.updated_at, conversations.id").Offset(window - 1).Limit(1).Scan(&end)
			if res.Error != nil {
				return nil, res.Error
			}
			if res.RowsAffected > 0 {
				q = q.Where("conversations.updated_at > ? OR (conversations.updated_at = ? AND conversations.id >= ?)",
					end.UpdatedAt, end.UpdatedAt, end.ID)
			}
		}
		err := q.Limit(limit).Find(&out).Error
		if err != nil || len(out) >= limit || forcePlan == "walk" {
			return out, err
		}
		out = nil
	}
	err := base().Where(index, args...).Limit(limit).Find(&out).Error
	return out, err
}

// pgCommon tells whether PostgreSQL's planner expects tsq to match at least
// pgWalkShare of all messages (from the statistics ANALYZE keeps on the
// index's expression; without them it expects few).
func pgCommon(ctx context.Context, db *gorm.DB, tsq string) bool {
	var plan string
	err := db.WithContext(ctx).Raw("EXPLAIN (FORMAT JSON) SELECT 1 FROM messages WHERE "+pgContentVector+
		" @@ to_tsquery('simple'::regconfig, ?)", tsq).Row().Scan(&plan)
	if err != nil {
		return false
	}
	var p []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		}
	}
	var total float64
	if json.Unmarshal([]byte(plan), &p) != nil || len(p) == 0 ||
		db.WithContext(ctx).Raw("SELECT reltuples FROM pg_class WHERE oid = 'messages'::regclass").Row().Scan(&total) != nil {
		return false
	}
	return total > 0 && p[0].Plan.Rows >= pgWalkShare*total
}

// migrateSearch creates, after AutoMigrate, what it cannot: the full-text
// indexes of history search (indexing the rows already there) and the
// partial unique index that allows one streaming message per conversation.
// It only reads when everything exists, so a second process opening the
// database (the CLI beside a server) does not wait for a write lock.
func migrateSearch(db *gorm.DB) error {
	switch db.Dialector.Name() {
	case "sqlite":
		return migrateSearchSQLite(db)
	case "postgres":
		return migrateSearchPostgres(db)
	}
	return nil
}

// sqliteFTS is one FTS5 index: how to create it, the triggers that keep it
// in sync, and how to index every row again.
type sqliteFTS struct {
	name     string
	create   string
	triggers map[string]string
	rebuild  []string
}

// msgKey is the messages_fts rowid of message m (a column prefix) in
// conversation c: conversation rowid << 32 + message rowid. Message rowids
// stay below 2^32 (four billion messages); rowids survive VACUUM (checked on
// SQLite 3.41), and a table rebuilt by a migration loses its triggers, which
// makes Migrate index everything again.
func msgKey(c, m string) string { return "(" + c + ".rowid << 32) + " + m + ".rowid" }

var sqliteFTSIndexes = []sqliteFTS{
	{
		name: conversationsFTS,
		create: "CREATE VIRTUAL TABLE IF NOT EXISTS " + conversationsFTS +
			" USING fts5(title, content='conversations', tokenize='unicode61 remove_diacritics 2')",
		triggers: map[string]string{
			"conversations_fts_ai": "AFTER INSERT ON conversations BEGIN " +
				"INSERT INTO conversations_fts(rowid, title) VALUES (new.rowid, new.title); END",
			"conversations_fts_ad": "AFTER DELETE ON conversations BEGIN " +
				"INSERT INTO conversations_fts(conversations_fts, rowid, title) VALUES ('delete', old.rowid, old.title); END",
			"conversations_fts_au": "AFTER UPDATE OF title ON conversations BEGIN " +
				"INSERT INTO conversations_fts(conversations_fts, rowid, title) VALUES ('delete', old.rowid, old.title); " +
				"INSERT INTO conversations_fts(rowid, title) VALUES (new.rowid, new.title); END",
		},
		rebuild: []string{"INSERT INTO conversations_fts(conversations_fts) VALUES ('rebuild')"},
	},
	{
		name: messagesFTS,
		create: "CREATE VIRTUAL TABLE IF NOT EXISTS " + messagesFTS +
			" USING fts5(content, content='', columnsize=0, prefix='1 2 3', tokenize='unicode61 remove_diacritics 2')",
		// A contentless index forgets a row only when told its exact text
		// and rowid: every change of a message, or of whether its
		// conversation exists, goes through these.
		triggers: map[string]string{
			"messages_fts_ai": "AFTER INSERT ON messages BEGIN " + msgIndex("new") + " END",
			"messages_fts_ad": "AFTER DELETE ON messages BEGIN " + msgForget("old") + " END",
			"messages_fts_au": "AFTER UPDATE OF content, conversation_id ON messages BEGIN " +
				msgForget("old") + " " + msgIndex("new") + " END",
			"messages_fts_conv_ai": "AFTER INSERT ON conversations BEGIN " +
				"INSERT INTO messages_fts(rowid, content) SELECT " + msgKey("new", "m") + ", m.content " +
				"FROM messages m WHERE m.conversation_id = new.id; END",
			"messages_fts_conv_bd": "BEFORE DELETE ON conversations BEGIN " +
				"INSERT INTO messages_fts(messages_fts, rowid, content) SELECT 'delete', " + msgKey("old", "m") + ", m.content " +
				"FROM messages m WHERE m.conversation_id = old.id; END",
		},
		rebuild: []string{
			"INSERT INTO messages_fts(messages_fts) VALUES ('delete-all')",
			"INSERT INTO messages_fts(rowid, content) SELECT " + msgKey("c", "m") + ", m.content " +
				"FROM messages m JOIN conversations c ON c.id = m.conversation_id",
		},
	},
}

// msgIndex adds message row (new) to messages_fts if its conversation
// exists; msgForget removes message row (old) the same way.
func msgIndex(row string) string {
	return "INSERT INTO messages_fts(rowid, content) SELECT " + msgKey("c", row) + ", " + row + ".content " +
		"FROM conversations c WHERE c.id = " + row + ".conversation_id;"
}

func msgForget(row string) string {
	return "INSERT INTO messages_fts(messages_fts, rowid, content) SELECT 'delete', " + msgKey("c", row) + ", " + row + ".content " +
		"FROM conversations c WHERE c.id = " + row + ".conversation_id;"
}

func sqliteObjects(db *gorm.DB) (map[string]bool, error) {
	var names []string
	if err := db.Raw("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger', 'index')").Scan(&names).Error; err != nil {
		return nil, fmt.Errorf("read schema: %w", err)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	return have, nil
}

func sqliteSearchComplete(have map[string]bool) bool {
	if !have[oneStreamingIndex] {
		return false
	}
	for _, s := range sqliteFTSIndexes {
		if !have[s.name] {
			return false
		}
		for name := range s.triggers {
			if !have[name] {
				return false
			}
		}
	}
	return true
}

func migrateSearchSQLite(db *gorm.DB) error {
	have, err := sqliteObjects(db)
	if err != nil {
		return err
	}
	if sqliteSearchComplete(have) {
		return nil
	}
	// BEGIN IMMEDIATE takes the write lock first (waiting busy_timeout for
	// it): a transaction that reads before it writes fails at once when
	// another connection wrote in between.
	return db.Connection(func(conn *gorm.DB) (err error) {
		if err := conn.Exec("BEGIN IMMEDIATE").Error; err != nil {
			return fmt.Errorf("migrate search: %w", err)
		}
		defer func() {
			if err != nil {
				conn.Exec("ROLLBACK")
				return
			}
			if err = conn.Exec("COMMIT").Error; err != nil {
				err = fmt.Errorf("migrate search: commit: %w", err)
			}
		}()
		have, err := sqliteObjects(conn)
		if err != nil {
			return err
		}
		for _, s := range sqliteFTSIndexes {
			// A missing trigger means the index missed changes (or a table
			// was rebuilt under it, with new rowids): index it all again.
			rebuild := !have[s.name]
			stmts := []string{s.create}
			for name, body := range s.triggers {
				if !have[name] {
					rebuild = true
				}
				stmts = append(stmts, "CREATE TRIGGER IF NOT EXISTS "+name+" "+body)
			}
			if rebuild {
				stmts = append(stmts, s.rebuild...)
			}
			for _, st := range stmts {
				if err := conn.Exec(st).Error; err != nil {
					return fmt.Errorf("migrate search index %s: %w", s.name, err)
				}
			}
		}
		if !have[oneStreamingIndex] {
			if err := createOneStreamingIndex(conn); err != nil {
				return err
			}
		}
		return nil
	})
}

// createOneStreamingIndex closes the streaming messages that would break
// the one-per-conversation rule (all but the newest of a conversation:
// left by a race this index now prevents) and creates the index.
func createOneStreamingIndex(tx *gorm.DB) error {
	err := tx.Exec(`UPDATE messages SET status = ?, reason = ?, updated_at = ? WHERE status = ? AND id NOT IN
		(SELECT MAX(id) FROM messages WHERE status = ? GROUP BY conversation_id)`,
		MessageError, "gateway_restart", time.Now().UTC(), MessageStreaming, MessageStreaming).Error
	if err != nil {
		return fmt.Errorf("close duplicate streaming messages: %w", err)
	}
	if err := tx.Exec("CREATE UNIQUE INDEX IF NOT EXISTS " + oneStreamingIndex +
		" ON messages (conversation_id) WHERE status = '" + MessageStreaming + "'").Error; err != nil {
		return fmt.Errorf("create index %s: %w", oneStreamingIndex, err)
	}
	return nil
}

func pgMissingIndexes(db *gorm.DB) ([]string, error) {
	var missing []string
	// The partial unique index first: its table lock comes before the
	// other indexes' (weaker) ones in the same transaction.
	for _, name := range []string{oneStreamingIndex, messagesFTSIndex, titlesFTSIndex} {
		var found bool
		if err := db.Raw("SELECT to_regclass(?) IS NOT NULL", name).Scan(&found).Error; err != nil {
			return nil, fmt.Errorf("look for index %s: %w", name, err)
		}
		if !found {
			missing = append(missing, name)
		}
	}
	return missing, nil
}

func migrateSearchPostgres(db *gorm.DB) error {
	missing, err := pgMissingIndexes(db)
	if err != nil || len(missing) == 0 {
		return err
	}
	// Replicas starting together take turns; the one that waited finds
	// the indexes made.
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", searchMigrationKey).Error; err != nil {
			return fmt.Errorf("migrate search: lock: %w", err)
		}
		missing, err := pgMissingIndexes(tx)
		if err != nil {
			return err
		}
		for _, name := range missing {
			switch name {
			case messagesFTSIndex:
				err = tx.Exec("CREATE INDEX IF NOT EXISTS " + messagesFTSIndex + " ON messages USING gin (" + pgContentVector + ")").Error
			case titlesFTSIndex:
				err = tx.Exec("CREATE INDEX IF NOT EXISTS " + titlesFTSIndex + " ON conversations USING gin (" + pgTitleVector + ")").Error
			case oneStreamingIndex:
				// No new streaming message may appear between closing the
				// duplicates and building the index (older replicas run
				// on): this mode lets reads through and waits out writes.
				if err = tx.Exec("LOCK TABLE messages IN SHARE ROW EXCLUSIVE MODE").Error; err == nil {
					err = createOneStreamingIndex(tx)
				}
			}
			if err != nil {
				return fmt.Errorf("migrate search index %s: %w", name, err)
			}
		}
		return nil
	})
}

// isOneStreamingViolation tells whether err is the partial unique index
// refusing a second streaming message in a conversation (SQLite names the
// column, PostgreSQL the index).
func isOneStreamingViolation(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return strings.Contains(s, oneStreamingIndex) || strings.Contains(s, "UNIQUE constraint failed: messages.conversation_id")
}

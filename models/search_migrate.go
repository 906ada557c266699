package models

import (
	"fmt"

	"gorm.io/gorm"
)

// Names of the objects the search migration creates, and of those an
// older Moonji created that it removes.
const (
	searchFTS          = "search_fts"                  // SQLite
	searchMigrationKey = 0x6d6f6f6e6a690009            // PostgreSQL advisory lock: "moonji", issue 9
	oldMessagesFTS     = "messages_fts"                // SQLite, before issue 42
	oldTitlesFTS       = "conversations_fts"           // SQLite, before issue 42
	oldMessagesGIN     = "idx_messages_content_fts"    // PostgreSQL, before issue 42
	oldTitlesGIN       = "idx_conversations_title_fts" // PostgreSQL, before issue 42
)

// oldSQLiteTriggers kept messages_fts and conversations_fts in sync.
var oldSQLiteTriggers = []string{
	"conversations_fts_ai", "conversations_fts_ad", "conversations_fts_au",
	"messages_fts_ai", "messages_fts_ad", "messages_fts_au", "messages_fts_conv_ai", "messages_fts_conv_bd",
}

// migrateSearch creates, after AutoMigrate, what it cannot: the full-text
// indexes of history search (indexing the rows already there, replacing
// an older Moonji's) and the partial unique index that allows one
// streaming message per conversation. It only reads when everything
// exists, so a second process opening the database (the CLI beside a
// server) does not wait for a write lock.
func migrateSearch(db *gorm.DB) error {
	switch db.Dialector.Name() {
	case "sqlite":
		return migrateSearchSQLite(db)
	case "postgres":
		return migrateSearchPostgres(db)
	}
	return nil
}

// searchFTSCreate makes the SQLite index. The tag's width is part of it
// (its prefix indexes), and so is ownedWords: a change of either must
// rename the table, so that Migrate indexes everything again.
var searchFTSCreate = fmt.Sprintf("CREATE VIRTUAL TABLE IF NOT EXISTS %s USING fts5(words, content='', contentless_delete=1, "+
	"prefix='%d %d %d', tokenize='unicode61 remove_diacritics 2')", searchFTS, tagWidth+1, tagWidth+2, tagWidth+3)

// ftsKey is the search_fts rowid of message m (a column prefix) in
// conversation c: conversation rowid << 32 + message rowid; a title's is
// the conversation rowid << 32. Message rowids stay below 2^32 (four
// billion messages); rowids survive VACUUM (checked on SQLite 3.41), and a
// table rebuilt by a migration loses its triggers, which makes Migrate
// index everything again.
func ftsKey(c, m string) string { return "(" + c + ".rowid << 32) + " + m + ".rowid" }

// ftsWords is the indexed text of column of row, tagged with owner.
func ftsWords(owner, text string) string { return sqliteWordsFunc + "(" + owner + ", " + text + ")" }

// sqliteSearchTriggers keep search_fts in sync: a row is indexed exactly
// while its conversation exists, with the conversation's owner's tag.
// Rows are removed by rowid (contentless_delete), so removing one does not
// need its text.
var sqliteSearchTriggers = map[string]string{
	"search_fts_msg_ai":  "AFTER INSERT ON messages BEGIN " + msgIndex("new") + " END",
	"search_fts_msg_ad":  "AFTER DELETE ON messages BEGIN " + msgForget("old") + " END",
	"search_fts_msg_au":  "AFTER UPDATE OF content, conversation_id ON messages BEGIN " + msgForget("old") + " " + msgIndex("new") + " END",
	"search_fts_conv_ai": "AFTER INSERT ON conversations BEGIN " + titleIndex("new") + " " + convMessagesIndex("new", "") + " END",
	"search_fts_conv_au": "AFTER UPDATE OF title, user_id ON conversations BEGIN " + titleForget("old") + " " + titleIndex("new") + " " +
		convMessagesForget("old", "old.user_id IS NOT new.user_id") + " " + convMessagesIndex("new", "old.user_id IS NOT new.user_id") + " END",
	"search_fts_conv_bd": "BEFORE DELETE ON conversations BEGIN " + titleForget("old") + " " + convMessagesForget("old", "") + " END",
}

// msgIndex adds message row (new) to search_fts if its conversation
// exists; msgForget removes message row (old) the same way.
func msgIndex(row string) string {
	return "INSERT INTO " + searchFTS + "(rowid, words) SELECT " + ftsKey("c", row) + ", " + ftsWords("c.user_id", row+".content") +
		" FROM conversations c WHERE c.id = " + row + ".conversation_id;"
}

func msgForget(row string) string {
	return "DELETE FROM " + searchFTS + " WHERE rowid = (SELECT " + ftsKey("c", row) + " FROM conversations c WHERE c.id = " + row + ".conversation_id);"
}

func titleIndex(row string) string {
	return "INSERT INTO " + searchFTS + "(rowid, words) VALUES (" + row + ".rowid << 32, " + ftsWords(row+".user_id", row+".title") + ");"
}

func titleForget(row string) string {
	return "DELETE FROM " + searchFTS + " WHERE rowid = " + row + ".rowid << 32;"
}

// convMessagesIndex adds the messages of conversation row, when cond (if
// any) holds; convMessagesForget removes them.
func convMessagesIndex(row, cond string) string {
	if cond != "" {
		cond = " AND " + cond
	}
	return "INSERT INTO " + searchFTS + "(rowid, words) SELECT " + ftsKey(row, "m") + ", " + ftsWords(row+".user_id", "m.content") +
		" FROM messages m WHERE m.conversation_id = " + row + ".id" + cond + ";"
}

func convMessagesForget(row, cond string) string {
	if cond != "" {
		cond = cond + " AND "
	}
	return "DELETE FROM " + searchFTS + " WHERE " + cond + "rowid IN (SELECT " + ftsKey(row, "m") +
		" FROM messages m WHERE m.conversation_id = " + row + ".id);"
}

// sqliteSearchRebuild indexes every title and message again.
var sqliteSearchRebuild = []string{
	"INSERT INTO " + searchFTS + "(" + searchFTS + ") VALUES ('delete-all')",
	"INSERT INTO " + searchFTS + "(rowid, words) SELECT c.rowid << 32, " + ftsWords("c.user_id", "c.title") + " FROM conversations c",
	"INSERT INTO " + searchFTS + "(rowid, words) SELECT " + ftsKey("c", "m") + ", " + ftsWords("c.user_id", "m.content") +
		" FROM messages m JOIN conversations c ON c.id = m.conversation_id",
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
	if !have[oneStreamingIndex] || !have[searchFTS] || have[oldMessagesFTS] || have[oldTitlesFTS] {
		return false
	}
	for name := range sqliteSearchTriggers {
		if !have[name] {
			return false
		}
	}
	for _, name := range oldSQLiteTriggers {
		if have[name] {
			return false
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
		// An older Moonji's indexes (words without their owner) go.
		var stmts []string
		for _, name := range oldSQLiteTriggers {
			if have[name] {
				stmts = append(stmts, "DROP TRIGGER "+name)
			}
		}
		for _, name := range []string{oldMessagesFTS, oldTitlesFTS} {
			if have[name] {
				stmts = append(stmts, "DROP TABLE "+name)
			}
		}
		// A missing trigger means the index missed changes (or a table was
		// rebuilt under it, with new rowids): index it all again.
		rebuild := !have[searchFTS]
		stmts = append(stmts, searchFTSCreate)
		for name, body := range sqliteSearchTriggers {
			if !have[name] {
				rebuild = true
			}
			stmts = append(stmts, "CREATE TRIGGER IF NOT EXISTS "+name+" "+body)
		}
		if rebuild {
			stmts = append(stmts, sqliteSearchRebuild...)
		}
		for _, st := range stmts {
			if err := conn.Exec(st).Error; err != nil {
				return fmt.Errorf("migrate search index (%.50s…): %w", st, err)
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

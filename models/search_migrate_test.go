package models

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"
)

// dropSearch removes every object of the search index, as if the database
// were from before it.
func dropSearch(t *testing.T, db *gorm.DB) {
	t.Helper()
	var drop []string
	if db.Dialector.Name() == "sqlite" {
		for name := range sqliteSearchTriggers {
			drop = append(drop, "DROP TRIGGER "+name)
		}
		drop = append(drop, "DROP TABLE "+searchFTS)
	} else {
		drop = []string{
			"DROP TRIGGER " + pgMessageTrigger + " ON messages",
			"DROP TRIGGER " + pgConvTrigger + " ON conversations",
			"DROP INDEX " + messagesWordsIndex,
			"DROP INDEX " + titlesWordsIndex,
			"ALTER TABLE messages DROP COLUMN " + pgOwnerColumn,
			"DROP FUNCTION " + pgWordsFunc + ", " + pgQueryFunc + ", moonji_message_owner, moonji_conversation_owner",
		}
	}
	for _, st := range drop {
		if err := db.Exec(st).Error; err != nil {
			t.Fatalf("%s: %v", st, err)
		}
	}
}

// oldSearchSchema is the search index of Moonji before issue 42 (words
// without their owner), as it created it.
func oldSearchSchema(dialect string) []string {
	if dialect == "postgres" {
		return []string{
			"CREATE INDEX " + oldMessagesGIN + " ON messages USING gin (to_tsvector('simple'::regconfig, " + pgWords("left(content, 100000)") + "))",
			"CREATE INDEX " + oldTitlesGIN + " ON conversations USING gin (to_tsvector('simple'::regconfig, " + pgWords("title") + "))",
		}
	}
	key := func(c, m string) string { return "(" + c + ".rowid << 32) + " + m + ".rowid" }
	index := func(row string) string {
		return "INSERT INTO messages_fts(rowid, content) SELECT " + key("c", row) + ", " + row + ".content " +
			"FROM conversations c WHERE c.id = " + row + ".conversation_id;"
	}
	forget := func(row string) string {
		return "INSERT INTO messages_fts(messages_fts, rowid, content) SELECT 'delete', " + key("c", row) + ", " + row + ".content " +
			"FROM conversations c WHERE c.id = " + row + ".conversation_id;"
	}
	return []string{
		"CREATE VIRTUAL TABLE conversations_fts USING fts5(title, content='conversations', tokenize='unicode61 remove_diacritics 2')",
		"CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='', columnsize=0, prefix='1 2 3', tokenize='unicode61 remove_diacritics 2')",
		"CREATE TRIGGER conversations_fts_ai AFTER INSERT ON conversations BEGIN " +
			"INSERT INTO conversations_fts(rowid, title) VALUES (new.rowid, new.title); END",
		"CREATE TRIGGER conversations_fts_ad AFTER DELETE ON conversations BEGIN " +
			"INSERT INTO conversations_fts(conversations_fts, rowid, title) VALUES ('delete', old.rowid, old.title); END",
		"CREATE TRIGGER conversations_fts_au AFTER UPDATE OF title ON conversations BEGIN " +
			"INSERT INTO conversations_fts(conversations_fts, rowid, title) VALUES ('delete', old.rowid, old.title); " +
			"INSERT INTO conversations_fts(rowid, title) VALUES (new.rowid, new.title); END",
		"CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN " + index("new") + " END",
		"CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN " + forget("old") + " END",
		"CREATE TRIGGER messages_fts_au AFTER UPDATE OF content, conversation_id ON messages BEGIN " + forget("old") + " " + index("new") + " END",
		"CREATE TRIGGER messages_fts_conv_ai AFTER INSERT ON conversations BEGIN " +
			"INSERT INTO messages_fts(rowid, content) SELECT " + key("new", "m") + ", m.content FROM messages m WHERE m.conversation_id = new.id; END",
		"CREATE TRIGGER messages_fts_conv_bd BEFORE DELETE ON conversations BEGIN " +
			"INSERT INTO messages_fts(messages_fts, rowid, content) SELECT 'delete', " + key("old", "m") + ", m.content " +
			"FROM messages m WHERE m.conversation_id = old.id; END",
	}
}

// An old database: messages stored before the search indexes existed are
// found once they do, and duplicate streaming messages (the race the
// unique index now prevents) do not stop the migration: all but the
// newest of a conversation are closed.
func TestMigrateOldDatabase(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		dropSearch(t, db)
		if err := db.Exec("DROP INDEX " + oneStreamingIndex).Error; err != nil {
			t.Fatal(err)
		}
		conv := seedConversation(t, db, 1, "Old title", time.Now(), "an old message about walruses")
		var ids []string
		for range 3 {
			m := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming}
			if err := db.Create(m).Error; err != nil {
				t.Fatal(err)
			}
			ids = append(ids, m.ID)
		}
		other := seedConversation(t, db, 1, "Other", time.Now())
		alone := &Message{ID: NewMessageID(), ConversationID: other.ID, Role: RoleAssistant, Status: MessageStreaming}
		db.Create(alone)

		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		if err := Migrate(db); err != nil { // and again: nothing to do
			t.Fatal(err)
		}
		for q, want := range map[string]int{"walruses": 1, "old title": 1, "other": 1} {
			if got := search(t, db, 1, q); len(got) != want {
				t.Errorf("search %q after the migration: %q", q, got)
			}
		}
		msgs, _ := ConversationMessages(ctx, db, conv.ID)
		status := map[string]Message{}
		for _, m := range msgs {
			status[m.ID] = m
		}
		for i, id := range ids {
			m := status[id]
			if i < 2 && (m.Status != MessageError || m.Reason != "gateway_restart") || i == 2 && m.Status != MessageStreaming {
				t.Errorf("streaming message %d after the migration: %s %s", i, m.Status, m.Reason)
			}
		}
		var m Message
		db.Take(&m, "id = ?", alone.ID)
		if m.Status != MessageStreaming {
			t.Errorf("a conversation's only streaming message: %s", m.Status)
		}
		if err := db.Create(&Message{ID: NewMessageID(), ConversationID: conv.ID, Status: MessageStreaming}).Error; !isOneStreamingViolation(err) {
			t.Errorf("index after the migration: %v", err)
		}
	})
}

// A database whose search index is the one before issue 42 (words without
// their owner) gets the new one at the next start: the old objects are
// gone, what was stored before is found by its owner only, and the start
// after that changes nothing.
func TestMigrateReplacesOldSearchIndex(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		dropSearch(t, db)
		for _, st := range oldSearchSchema(db.Dialector.Name()) {
			if err := db.Exec(st).Error; err != nil {
				t.Fatalf("%s: %v", st, err)
			}
		}
		now := time.Now()
		seedConversation(t, db, 1, "Walrus notes", now, "tusks and whiskers", "an answer about ice")
		seedConversation(t, db, 2, "Walrus of someone else", now, "whiskers again")
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		if got := oldSearchObjects(t, db); len(got) > 0 {
			t.Errorf("left after the migration: %q", got)
		}
		for _, c := range []struct {
			user uint
			q    string
			want int
		}{{1, "walrus", 1}, {1, "whisk", 1}, {1, "ice", 1}, {2, "whiskers", 1}, {2, "ice", 0}, {3, "walrus", 0}} {
			if got := search(t, db, c.user, c.q); len(got) != c.want {
				t.Errorf("person %d, search %q after the migration: %q", c.user, c.q, got)
			}
		}
		// Written after the migration: indexed by the new triggers.
		seedConversation(t, db, 1, "Later", now.Add(time.Minute), "narwhal")
		if got := search(t, db, 1, "narwhal"); len(got) != 1 {
			t.Errorf("a message after the migration: %q", got)
		}
		changes := migrationWrites(t, db, "CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE", "LOCK")
		for _, c := range changes {
			t.Errorf("the second migration ran %s", c)
		}
	})
}

// oldSearchObjects lists the objects of the old search index db still has.
func oldSearchObjects(t *testing.T, db *gorm.DB) []string {
	var names []string
	if db.Dialector.Name() == "postgres" {
		for _, n := range []string{oldMessagesGIN, oldTitlesGIN} {
			var found bool
			db.Raw("SELECT to_regclass(?) IS NOT NULL", n).Scan(&found)
			if found {
				names = append(names, n)
			}
		}
		return names
	}
	have, err := sqliteObjects(db)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range append([]string{oldMessagesFTS, oldTitlesFTS}, oldSQLiteTriggers...) {
		if have[n] {
			names = append(names, n)
		}
	}
	return names
}

// A conversation given to someone else is found by its new owner's
// searches, by title and by text, and no longer by its old owner's; a new
// title is found, the old one not.
func TestSearchFollowsOwner(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		c := seedConversation(t, db, 1, "Walrus notes", time.Now(), "tusks and whiskers")
		if err := db.Model(&Conversation{}).Where("id = ?", c.ID).Update("user_id", 2).Error; err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"walrus", "tusks"} {
			if got := search(t, db, 1, q); got != nil {
				t.Errorf("old owner finds %q: %q", q, got)
			}
			if got := search(t, db, 2, q); len(got) != 1 {
				t.Errorf("new owner, %q: %q", q, got)
			}
		}
		if err := db.Model(&Conversation{}).Where("id = ?", c.ID).Update("title", "Seal notes").Error; err != nil {
			t.Fatal(err)
		}
		if got := search(t, db, 2, "walrus"); got != nil {
			t.Errorf("old title found: %q", got)
		}
		if got := search(t, db, 2, "seal tusks"); got != nil {
			t.Errorf("a title word and a message word found together: %q", got)
		}
		if got := search(t, db, 2, "seal"); len(got) != 1 {
			t.Errorf("new title: %q", got)
		}
		if db.Dialector.Name() == "sqlite" {
			if err := db.Exec("INSERT INTO " + searchFTS + "(" + searchFTS + ") VALUES ('integrity-check')").Error; err != nil {
				t.Error(err)
			}
		}
	})
}

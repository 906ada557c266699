package models

import (
	"fmt"

	"gorm.io/gorm"
)

// PostgreSQL's search objects. The functions' bodies are part of the
// indexes built from them: a change of either must rename the function
// and the index, so that Migrate builds them again.
const (
	pgWordsFunc        = "moonji_owned_words"
	pgQueryFunc        = "moonji_owned_query"
	pgOwnerColumn      = "search_owner"
	messagesWordsIndex = "idx_messages_owned_words"
	titlesWordsIndex   = "idx_conversations_owned_words"
	pgMessageTrigger   = "messages_search_owner"
	pgConvTrigger      = "conversations_search_owner"
)

// pgSearchFunctions: moonji_owned_words(owner, text) is the tsvector of
// the text (as pgContentVector cuts it) with "owner_" before each lexeme,
// positions kept (a word the parser cuts in two becomes a phrase in the
// tsquery); a lexeme longer than 2,000 bytes keeps its first 500
// characters, so that the tag fits under the 2,046-byte limit. A tsvector
// holds at most 1 MB, and the tags must fit too: when they would not (a
// text of 100,000 characters of distinct one-letter words), the positions
// go (such a text's cut words are not found), then the text's second half.
// moonji_owned_query(owner, q) is to_tsquery('simple', q) with the same
// tag on each lexeme (q's are letters and digits only: no quote in them).
// The trigger functions copy a conversation's owner into its messages'
// search_owner.
var pgSearchFunctions = []string{
	`CREATE OR REPLACE FUNCTION ` + pgWordsFunc + `(owner bigint, body text) RETURNS tsvector
		LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
		DECLARE
			tag text := owner::text || '_';
			v tsvector := to_tsvector('simple'::regconfig, ` + pgWords("left(body, 100000)") + `);
		BEGIN
			IF pg_column_size(v) + length(v) * (octet_length(tag) + 1) > 1000000 THEN
				v := strip(v);
				IF pg_column_size(v) + length(v) * (octet_length(tag) + 1) > 1000000 THEN
					v := strip(to_tsvector('simple'::regconfig, ` + pgWords("left(body, 50000)") + `));
				END IF;
			END IF;
			RETURN (SELECT coalesce(string_agg('''' || replace(replace(tag ||
				CASE WHEN octet_length(lexeme) > 2000 THEN left(lexeme, 500) ELSE lexeme END,
				'\', '\\'), '''', '''''') || '''' || coalesce(':' || array_to_string(positions, ','), ''), ' '), '')::tsvector
				FROM unnest(v));
		END
		$$`,
	`CREATE OR REPLACE FUNCTION ` + pgQueryFunc + `(owner bigint, query text) RETURNS tsquery
		LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
		SELECT regexp_replace(to_tsquery('simple'::regconfig, query)::text, '''([^'']*)''', '''' || owner::text || '_\1''', 'g')::tsquery
		$$`,
	`CREATE OR REPLACE FUNCTION moonji_message_owner() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			NEW.search_owner := (SELECT user_id FROM conversations WHERE id = NEW.conversation_id);
			RETURN NEW;
		END
		$$`,
	`CREATE OR REPLACE FUNCTION moonji_conversation_owner() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_OP = 'DELETE' THEN
				UPDATE messages SET search_owner = NULL WHERE conversation_id = OLD.id AND search_owner IS NOT NULL;
				RETURN OLD;
			END IF;
			UPDATE messages SET search_owner = NEW.user_id WHERE conversation_id = NEW.id AND search_owner IS DISTINCT FROM NEW.user_id;
			RETURN NEW;
		END
		$$`,
}

// pgSearchTriggers, recreated whole when one is missing.
var pgSearchTriggers = []string{
	"DROP TRIGGER IF EXISTS " + pgMessageTrigger + " ON messages",
	"CREATE TRIGGER " + pgMessageTrigger + " BEFORE INSERT OR UPDATE OF conversation_id ON messages FOR EACH ROW EXECUTE FUNCTION moonji_message_owner()",
	"DROP TRIGGER IF EXISTS " + pgConvTrigger + " ON conversations",
	"CREATE TRIGGER " + pgConvTrigger + " AFTER INSERT OR DELETE OR UPDATE OF user_id ON conversations FOR EACH ROW EXECUTE FUNCTION moonji_conversation_owner()",
}

// pgSearchState is what of the search's objects a PostgreSQL schema has.
type pgSearchState struct {
	WordsIndex, TitlesIndex, OneStreaming, QueryFunc bool
	OldWords, OldTitles                              bool
	Triggers                                         int
}

func (s pgSearchState) complete() bool {
	return s.WordsIndex && s.TitlesIndex && s.OneStreaming && s.QueryFunc && !s.OldWords && !s.OldTitles && s.Triggers == 2
}

func pgSearchObjects(db *gorm.DB) (pgSearchState, error) {
	var s pgSearchState
	err := db.Raw(`SELECT to_regclass(?) IS NOT NULL AS words_index, to_regclass(?) IS NOT NULL AS titles_index,
		to_regclass(?) IS NOT NULL AS one_streaming, to_regprocedure(?) IS NOT NULL AS query_func,
		to_regclass(?) IS NOT NULL AS old_words, to_regclass(?) IS NOT NULL AS old_titles,
		(SELECT count(*) FROM pg_trigger WHERE (tgname = ? AND tgrelid = to_regclass('messages'))
			OR (tgname = ? AND tgrelid = to_regclass('conversations'))) AS triggers`,
		messagesWordsIndex, titlesWordsIndex, oneStreamingIndex, pgQueryFunc+"(bigint,text)", oldMessagesGIN, oldTitlesGIN,
		pgMessageTrigger, pgConvTrigger).Scan(&s).Error
	if err != nil {
		return s, fmt.Errorf("look for the search indexes: %w", err)
	}
	return s, nil
}

func migrateSearchPostgres(db *gorm.DB) error {
	s, err := pgSearchObjects(db)
	if err != nil || s.complete() {
		return err
	}
	// Replicas starting together take turns; the one that waited finds
	// the indexes made.
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", searchMigrationKey).Error; err != nil {
			return fmt.Errorf("migrate search: lock: %w", err)
		}
		s, err := pgSearchObjects(tx)
		if err != nil || s.complete() {
			return err
		}
		// Both tables locked first, in the order a new exchange writes
		// them (StartExchange), so an older replica still writing cannot
		// deadlock with the locks taken below; this mode lets reads
		// through and waits out writes, so no streaming message appears
		// between closing the duplicates and building the unique index.
		stmts := []string{"LOCK TABLE conversations, messages IN SHARE ROW EXCLUSIVE MODE"}
		if !s.OneStreaming {
			stmts = append(stmts, "") // createOneStreamingIndex
		}
		stmts = append(stmts,
			"DROP INDEX IF EXISTS "+oldMessagesGIN,
			"DROP INDEX IF EXISTS "+oldTitlesGIN,
			"ALTER TABLE messages ADD COLUMN IF NOT EXISTS "+pgOwnerColumn+" bigint")
		stmts = append(stmts, pgSearchFunctions...)
		stmts = append(stmts, pgSearchTriggers...)
		stmts = append(stmts,
			// Owners the triggers did not set: rows from before them.
			"UPDATE messages m SET "+pgOwnerColumn+" = c.user_id FROM conversations c WHERE c.id = m.conversation_id AND m."+
				pgOwnerColumn+" IS DISTINCT FROM c.user_id",
			// fastupdate off: a GIN index's pending list of recent entries
			// is read whole by every search, so with it one person's
			// fresh messages would cost everyone's searches.
			"CREATE INDEX IF NOT EXISTS "+messagesWordsIndex+" ON messages USING gin ("+pgOwnedContent+") WITH (fastupdate = off)",
			"CREATE INDEX IF NOT EXISTS "+titlesWordsIndex+" ON conversations USING gin ("+pgOwnedTitle+") WITH (fastupdate = off)")
		if !s.WordsIndex {
			// Statistics on the new expressions now, not at autovacuum's
			// next pass: pgCommon's choice of plan reads them.
			stmts = append(stmts, "ANALYZE messages", "ANALYZE conversations")
		}
		for _, st := range stmts {
			if st == "" {
				err = createOneStreamingIndex(tx)
			} else {
				err = tx.Exec(st).Error
			}
			if err != nil {
				return fmt.Errorf("migrate search index (%.60s…): %w", st, err)
			}
		}
		return nil
	})
}

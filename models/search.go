package models

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"gorm.io/gorm"
)

// History search finds a person's conversations whose title, or one of
// whose messages, holds every word of the search, each as the start of a
// word ("kube" finds "Kubernetes"), whatever the case. It is full-text
// search in the database, with the same meaning on both dialects, and what
// it reads is bounded by the searcher's own history: every indexed word
// carries its owner's tag (search_words.go), so other people's messages,
// however many and whatever they say, are never read for it (issue 42).
//
//   - SQLite: one FTS5 index, search_fts, with the unicode61 tokenizer and
//     remove_diacritics 2 (so "cafe" also finds "café"), kept in sync by
//     triggers. It is contentless (it holds the index only; its rows are
//     deleted by rowid, contentless_delete) and holds one row per title
//     and per message, whose rowid is the conversation's rowid << 32 + the
//     message's rowid (0 for the title): a match names its conversation
//     without reading the messages table. That is what keeps a search for
//     a common word fast: joining each match to its message costs ~1.5 µs
//     a row in this pure-Go SQLite, so "the" (in 95 % of 100,000 messages)
//     took 160 ms that way and ~30 ms this way. A row's text is its
//     owner's tag before each word (moonji_search_words), so a search
//     term "kube"* becomes "<tag>kube"*, whose prefix only the searcher's
//     words start. A message is in the index exactly while its
//     conversation exists (triggers on both tables), and the index has
//     prefix indexes for the tag and 1 to 3 characters, since a short
//     prefix ("go") otherwise merges the lists of every word it starts.
//   - PostgreSQL: GIN indexes on moonji_owned_words(owner, text): the
//     tsvector of to_tsvector('simple', …) with the owner's id before
//     each lexeme ('simple': no stemming, no stop words, lower case;
//     accents stay, so "cafe" does not find "café" there), over the text
//     with the characters that glue words into host names, paths and
//     versions blanked (pgWords), so that words are cut as FTS5 cuts them.
//     A message's owner is its conversation's, copied into
//     messages.search_owner by triggers. The tsquery is tagged the same
//     way (moonji_owned_query).
//
// Titles go through full-text search too rather than LIKE: a person's
// titles alone would be cheap to scan (they are few and indexed by
// user_id), but LIKE would give them another meaning than the messages
// under them (substrings instead of word starts; in SQLite, case folding
// of ASCII only).
//
// Searches never pass the person's text as query syntax: it is cut into
// words (runs of letters, digits and combining marks) and each is quoted
// (FTS5: "tagword"*, inner quotes doubled) or reduced to letters and
// digits and passed as a bound parameter (PostgreSQL: word:* joined with
// &, to to_tsquery). A search without any word (only punctuation) finds
// nothing.

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

// pgContentVector is the tsvector of a message's text, as the walk computes
// it for one conversation (the index holds the same words, tagged). Only
// its first 100,000 characters count: a tsvector holds at most 1 MB of
// distinct words, and a longer one makes the INSERT or UPDATE itself fail
// ("string is too long for tsvector"); 100,000 characters cannot reach it.
var pgContentVector = "to_tsvector('simple'::regconfig, " + pgWords("left(content, 100000)") + ")"

// pgTitleVector is the tsvector of a conversation's title, for the walk.
var pgTitleVector = "to_tsvector('simple'::regconfig, " + pgWords("title") + ")"

// The indexed expressions: queries must spell them exactly like this to
// use the indexes.
const (
	pgOwnedContent = pgWordsFunc + "(search_owner, content)"
	pgOwnedTitle   = pgWordsFunc + "(user_id, title)"
	pgOwnedQuery   = pgQueryFunc + "(?::bigint, ?)"
)

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

// ftsQuery is the FTS5 query for terms searched in the words tagged tag:
// each a quoted prefix phrase of the tagged term, all required
// ("<tag>a"* "<tag>b"*).
func ftsQuery(tag string, terms []string) string {
	var b strings.Builder
	for i, t := range terms {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('"')
		b.WriteString(strings.ReplaceAll(ownedWords(tag, t), `"`, `""`))
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
//   - index: find the person's matches through the full-text index at
//     once, then walk the person's conversations newest first, keeping
//     those matched. Its cost grows with the person's matches.
//   - walk: walk the person's next conversations newest first and check
//     each (SQLite: a lookup in search_fts's rowid range of the
//     conversation; PostgreSQL: the tsvector of its messages, computed up
//     to the first match). Its cost grows with the conversations walked.
//
// The walk wins by far when the words are in most of the person's
// messages ("the", "go", a letter: 95,000 matches of 100,000 messages cost
// 140–280 ms on PostgreSQL and ~30 ms on SQLite through the index, 5–8 ms
// walking) and loses by far when they are rare. It is
// tried when the words look common (SQLite: all short enough for the
// prefix indexes, which also makes a check cheap; PostgreSQL: the planner
// expects them in pgWalkShare of the person's messages), over at most a
// window of conversations; a window without a full page of matches hands
// over to the index plan, so a person whose history differs from
// everyone else's still gets a bounded wait.
const (
	// sqliteWalkChars: words up to this long are in search_fts's prefix
	// indexes.
	sqliteWalkChars = 3
	// sqliteWalk: conversations the walk checks on SQLite (~30 µs each).
	sqliteWalk = 200
	// pgWalkShare: PostgreSQL walks when the planner expects the words in
	// at least this share of the person's messages.
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
// (person userID's, after the cursor, in order) whose title or one of
// whose messages holds every word of query; none when it has no word.
func searchConversations(ctx context.Context, db *gorm.DB, userID uint, base func() *gorm.DB, query string, limit int) ([]Conversation, error) {
	terms := searchTerms(query)
	if len(terms) == 0 {
		return nil, nil
	}
	var index, walk string // conditions over conversations
	var indexArgs, walkArgs []any
	window := 0
	if db.Dialector.Name() == "postgres" {
		tsq := tsQuery(terms)
		if tsq == "" {
			return nil, nil
		}
		owner := int64(userID)
		indexArgs = []any{owner, tsq, owner, tsq}
		// Both subqueries under OR become hashed subplans: each index is
		// read once, for the person's words only.
		index = "conversations.id IN (SELECT id FROM conversations WHERE " + pgOwnedTitle + " @@ " + pgOwnedQuery + ")" +
			" OR conversations.id IN (SELECT conversation_id FROM messages WHERE " + pgOwnedContent + " @@ " + pgOwnedQuery + ")"
		// The subquery with LIMIT 1 stays a check per conversation: the
		// planner can neither hash it nor make it a join, whatever its
		// estimates (which a cached generic plan lacks).
		const q = "to_tsquery('simple'::regconfig, ?)"
		walkArgs = []any{tsq, tsq}
		walk = "(" + pgTitleVector + " @@ " + q + ") OR (SELECT true FROM messages WHERE messages.conversation_id = conversations.id AND " +
			pgContentVector + " @@ " + q + " LIMIT 1)"
		if forcePlan == "walk" || forcePlan == "" && pgCommon(ctx, db, owner, tsq) {
			window = pgWalk
		}
	} else {
		m := ftsQuery(ownerTag(uint64(userID)), terms)
		indexArgs, walkArgs = []any{m}, []any{m}
		// A match names its conversation: rowid >> 32.
		index = "conversations.rowid IN (SELECT rowid >> 32 FROM " + searchFTS + " WHERE " + searchFTS + " MATCH ?)"
		walk = "EXISTS (SELECT 1 FROM " + searchFTS + " WHERE " + searchFTS + " MATCH ? AND " + searchFTS + ".rowid" +
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
		q := base().Where(walk, walkArgs...)
		if forcePlan != "walk" {
			var end ConversationCursor
			res := base().Select("conversations.pinned, conversations.updated_at, conversations.id").Offset(window - 1).Limit(1).Scan(&end)
			if res.Error != nil {
				return nil, res.Error
			}
			if res.RowsAffected > 0 {
				q = upToCursor(q, &end)
			}
		}
		err := q.Limit(limit).Find(&out).Error
		if err != nil || len(out) >= limit || forcePlan == "walk" {
			return out, err
		}
		out = nil
	}
	err := base().Where(index, indexArgs...).Limit(limit).Find(&out).Error
	return out, err
}

// pgCommon tells whether PostgreSQL's planner expects tsq to match at least
// pgWalkShare of person owner's messages (from the statistics ANALYZE
// keeps on the index's expression and on search_owner; without them it
// expects few).
func pgCommon(ctx context.Context, db *gorm.DB, owner int64, tsq string) bool {
	var plan string
	err := db.WithContext(ctx).Raw("EXPLAIN (FORMAT JSON) SELECT 1 FROM messages WHERE "+pgOwnedContent+" @@ "+pgOwnedQuery+
		" UNION ALL SELECT 1 FROM messages WHERE search_owner = ?", owner, tsq, owner).Row().Scan(&plan)
	if err != nil {
		return false
	}
	type node struct {
		Rows  float64 `json:"Plan Rows"`
		Plans []node  `json:"Plans"`
	}
	var p []struct{ Plan node }
	if json.Unmarshal([]byte(plan), &p) != nil || len(p) == 0 || len(p[0].Plan.Plans) != 2 {
		return false
	}
	matches, mine := p[0].Plan.Plans[0].Rows, p[0].Plan.Plans[1].Rows
	return mine > 0 && matches >= pgWalkShare*mine
}

package web_test

import (
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// seedThread stores a conversation of n messages (a person's, then an
// answer of about answerBytes of Markdown, in turn) for the person with
// email, each following the one before.
func seedThread(t testing.TB, db *gorm.DB, userID uint, n, answerBytes int) string {
	t.Helper()
	conv := &models.Conversation{ID: models.NewConversationID(), UserID: userID, Title: "Long", Model: "m1"}
	if err := db.Create(conv).Error; err != nil {
		t.Fatal(err)
	}
	para := "Lighthouses keep **ships** off the rocks; their keepers trim the `wick` at dusk. "
	var answer strings.Builder
	for answer.Len() < answerBytes {
		answer.WriteString(para)
		if answer.Len()%3 == 0 {
			answer.WriteString("\n\n```go\nfmt.Println(\"beam\")\n```\n\n")
		}
	}
	msgs := make([]models.Message, 0, n)
	var parent *string
	for i := range n {
		m := models.Message{ID: models.NewMessageID(), ConversationID: conv.ID, ParentID: parent, Status: models.MessageDone, Model: "m1"}
		if i%2 == 0 {
			m.Role, m.Content = models.RoleUser, fmt.Sprintf("Question %d about lighthouses", i/2)
		} else {
			m.Role, m.Content = models.RoleAssistant, fmt.Sprintf("Answer %d. %s", i/2, answer.String())
		}
		msgs = append(msgs, m)
		parent = &msgs[len(msgs)-1].ID
	}
	if err := db.CreateInBatches(msgs, 100).Error; err != nil {
		t.Fatal(err)
	}
	return conv.ID
}

var articleID = regexp.MustCompile(`<article class="msg [a-z]+" id="m-(m_[0-9a-z]+)"`)

// A long conversation's page draws its last messages and a button for
// the ones before; the button loads them a page at a time, in order, to
// the first; every message shows once.
func TestLongConversationLoadsEarlierMessages(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/long.db")
	p := e.chatter("long@example.com")
	var user models.User
	e.DB.Where("email = ?", "long@example.com").Take(&user)
	conv := seedThread(t, e.DB, user.ID, 70, 300)

	pg := p.page("/c/" + conv)
	first := articleID.FindAllStringSubmatch(pg.body, -1)
	if pg.status != http.StatusOK || len(first) != 30 || !strings.Contains(pg.body, "Show earlier messages") ||
		!strings.Contains(pg.body, "Answer 34.") || strings.Contains(pg.body, "Answer 19.") {
		t.Fatalf("first screen: %d, %d messages", pg.status, len(first))
	}
	var ids []string
	for _, m := range first {
		ids = append(ids, m[1])
	}
	for range 3 {
		next := regexp.MustCompile(`hx-get="(/c/[^"]+/earlier\?before=[^"]+)"`).FindStringSubmatch(pg.body)
		if next == nil {
			break
		}
		pg = p.page(strings.ReplaceAll(next[1], "&amp;", "&"))
		var got []string
		for _, m := range articleID.FindAllStringSubmatch(pg.body, -1) {
			got = append(got, m[1])
		}
		if pg.status != http.StatusOK || len(got) == 0 {
			t.Fatalf("earlier: %d %d messages", pg.status, len(got))
		}
		ids = append(got, ids...)
	}
	msgs, _ := models.ConversationMessages(t.Context(), e.DB, conv)
	var want []string
	for _, m := range msgs {
		want = append(want, m.ID)
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("loaded %d messages, want the conversation's %d in order", len(ids), len(want))
	}
	// Someone else's conversation, or a message not on the path: 404.
	other := e.chatter("other-long@example.com")
	if got := other.page("/c/" + conv + "/earlier?before=" + want[40]); got.status != http.StatusNotFound {
		t.Errorf("another person's earlier messages: %d", got.status)
	}
	if got := p.page("/c/" + conv + "/earlier?before=m_nope"); got.status != http.StatusNotFound {
		t.Errorf("earlier than an unknown message: %d", got.status)
	}
}

// TestThreadPageBenchmark measures the page of a 500-message conversation
// (answers of ~1.5 KB of Markdown): the first load of each of 20 such
// conversations (nothing rendered before), then 200 loads of one, p50 and
// p95, on SQLite and PostgreSQL:
//
//	MOONJI_BENCH_THREAD=1 MOONJI_TEST_POSTGRES_DSN=… go test -count=1 -run TestThreadPageBenchmark -v ./web/
func TestThreadPageBenchmark(t *testing.T) {
	if os.Getenv("MOONJI_BENCH_THREAD") == "" {
		t.Skip("set MOONJI_BENCH_THREAD=1 to run the long conversation benchmark")
	}
	eachDatabaseInTurn(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL)
		p := e.chatter("bench-long@example.com")
		var user models.User
		e.DB.Where("email = ?", "bench-long@example.com").Take(&user)
		var convs []string
		for range 20 {
			convs = append(convs, seedThread(t, e.DB, user.ID, 500, 1500))
		}
		load := func(conv string) (time.Duration, int) {
			start := time.Now()
			pg := p.page("/c/" + conv)
			if pg.status != http.StatusOK {
				t.Fatalf("page: %d", pg.status)
			}
			return time.Since(start), len(pg.body)
		}
		var cold []time.Duration
		size := 0
		for _, c := range convs {
			d, n := load(c)
			cold = append(cold, d)
			size = n
		}
		var warm []time.Duration
		for range 200 {
			d, _ := load(convs[0])
			warm = append(warm, d)
		}
		q := func(ds []time.Duration, f float64) time.Duration {
			s := slices.Clone(ds)
			slices.Sort(s)
			return s[int(float64(len(s)-1)*f)]
		}
		t.Logf("500-message conversation page (%d KB uncompressed): first loads p50 %v p95 %v; again p50 %v p95 %v",
			size>>10, q(cold, .5), q(cold, .95), q(warm, .5), q(warm, .95))
	})
}

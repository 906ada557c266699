package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

// A chat stopped from the web with "seen": 0 — Stop pressed before the
// page applied a chunk — saves an empty answer, yet the ledger bills what
// the engine generated and the gateway delivered: seen decides only what
// the saved answer keeps, never what the request cost.
func TestChatStopWithSeenZeroStillBills(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("zero@example.com")
	e.mockBody(map[string]any{"tokens": 500, "tps": 40})
	conv := p.newConversation()
	s := p.send(conv, "a long one")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, _ := p.follow(ctx, s.InferenceID, "")
	awaitChunks(t, ch, 4)
	status, body := p.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`","seen":0}`)
	if status != http.StatusOK || !strings.Contains(body, `"acknowledged":true`) {
		t.Fatalf("stop: %d %s", status, body)
	}
	drain(ch)

	// The saved answer keeps what the page showed: nothing.
	m := p.reply(conv)
	if m.Status != models.MessageStopped || m.Content != "" {
		t.Fatalf("saved answer %+v, want stopped and empty", m)
	}
	// The bill: at least the 4 chunks generated and delivered, and the prompt.
	row := e.final(s.InferenceID)
	if row.Outcome != models.OutcomeStopped || row.CompletionTokens < 4 || row.PromptTokens == 0 || row.Source != "web" {
		t.Errorf("usage row %+v, want stopped with at least 4 completion tokens and the prompt", row)
	}
	var msg models.Message
	if err := e.DB.Where("id = ?", m.ID).Take(&msg).Error; err != nil {
		t.Fatal(err)
	}
	if msg.CompletionTokens != row.CompletionTokens || msg.PromptTokens != row.PromptTokens {
		t.Errorf("message tokens %d+%d, usage row %d+%d: the message shows what was billed",
			msg.PromptTokens, msg.CompletionTokens, row.PromptTokens, row.CompletionTokens)
	}
}

// The same through another replica: the stop's seen of 0 crosses the bus
// (it must not read as "no seen"), and the owner bills what it delivered.
func TestChatStopWithSeenZeroFromAnotherReplica(t *testing.T) {
	c := startCluster(t, 2, false)
	a, b := c.replicas[0], c.replicas[1]
	pa := a.chatter("zero@example.com")
	a.mockBody(map[string]any{"tokens": 500, "tps": 40})
	conv := pa.newConversation()
	s := pa.send(conv, "a long one")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, _ := pa.follow(ctx, s.InferenceID, "")
	awaitChunks(t, ch, 4)
	pb := b.chatter("zero@example.com")
	status, body := pb.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`","seen":0}`)
	if status != http.StatusOK || !strings.Contains(body, `"acknowledged":true`) {
		t.Fatalf("stop through B: %d %s", status, body)
	}
	drain(ch)
	if m := pa.reply(conv); m.Status != models.MessageStopped || m.Content != "" {
		t.Fatalf("saved answer %+v, want stopped and empty", m)
	}
	if row := a.final(s.InferenceID); row.Outcome != models.OutcomeStopped || row.CompletionTokens < 4 || row.PromptTokens == 0 {
		t.Errorf("usage row %+v, want stopped with at least 4 completion tokens and the prompt", row)
	}
}

// awaitChunks reads a generation's events until n chunks have come, and
// fails the test if it ends sooner.
func awaitChunks(t *testing.T, ch <-chan sseEvent, n int) {
	t.Helper()
	received := 0
	for ev := range ch {
		if ev.Event == "chunk" {
			received++
		}
		if received == n {
			return
		}
	}
	t.Fatalf("the generation ended after %d chunks, before %d", received, n)
}

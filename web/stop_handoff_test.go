package web_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"moonji/models"
)

// TestChatStopRightAfterSend: a chat reply is its replica's to stop from the
// moment the send is answered. A stop through another replica sent right
// after the 202 — before the reply has any event, while its request (padded
// to 1 MiB) is still on its way through the gateway to the engine — is
// acknowledged by the replica that owns the reply, not decided from storage
// (B's stop counts: one "acked", nothing else); the reply is saved stopped
// before that 200, with nothing written, and leaves one usage row, stopped.
func TestChatStopRightAfterSend(t *testing.T) {
	for _, real := range realModes(t) {
		t.Run(modeName(real), func(t *testing.T) {
			c := startCluster(t, 2, real)
			a, b := c.replicas[0], c.replicas[1]
			const email = "hasty@example.com"
			pa, pb := a.chatter(email), b.chatter(email)
			// The pad (1 MiB the gateway parses and writes to the engine)
			// holds the request back long enough that the stop reaches A
			// before the gateway has begun it: while only the gateway
			// registered a reply, every such stop was answered from storage
			// (without the pad, some were). The engine would not say
			// anything for 10 s anyway.
			a.mockBody(map[string]any{"tokens": 1000, "tps": 50, "ttft_ms": 10000, "pad": strings.Repeat("x", 1<<20)})
			conv := pa.newConversation()
			results := []string{"acked", "local", "finished", "timeout", "not_found", "unavailable"}
			counts := func() map[string]float64 {
				m := map[string]float64{}
				for _, r := range results {
					m[r] = metricValue(t, b, "moonji_stops_total", `result="`+r+`"`)
				}
				return m
			}

			for i := range 3 {
				before := counts()
				s := pa.send(conv, fmt.Sprintf("message %d", i))
				st, body := pb.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`"}`)
				if st != http.StatusOK || !strings.Contains(body, `"state":"stopped"`) || !strings.Contains(body, `"acknowledged":true`) {
					t.Fatalf("stop %d through B right after the send: %d %s", i, st, body)
				}
				after := counts()
				for _, r := range results {
					want := 0.0
					if r == "acked" {
						want = 1
					}
					if got := after[r] - before[r]; got != want {
						t.Errorf("stop %d: B's moonji_stops_total{result=%q} grew by %v, want %v", i, r, got, want)
					}
				}
				msgs := pa.conversation(conv).Messages
				if m := msgs[len(msgs)-1]; m.InferenceID != s.InferenceID || m.Status != models.MessageStopped || m.Content != "" {
					t.Fatalf("reply %d right after the stop's 200: %+v, want stopped, empty", i, m)
				}
				if row := a.final(s.InferenceID); row.Outcome != models.OutcomeStopped {
					t.Errorf("row %d = %+v, want stopped", i, row)
				}
				if n := storedRows(t, a, s.InferenceID); n != 1 {
					t.Errorf("%d rows for reply %d, want 1", n, i)
				}
			}
		})
	}
}

package web_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

// youngAge is how old a stream is when these tests stop it: far younger
// than the 500 ms after which its replica writes its pending row, so that
// no replica but its own knows it exists.
const youngAge = 50 * time.Millisecond

// untilAge waits until since is age old: the stimulus of these tests is a
// stop at a given age, not a condition to wait for.
func untilAge(since time.Time, age time.Duration) {
	<-time.After(time.Until(since.Add(age)))
}

// storedRows counts the rows of id in the database.
func storedRows(t *testing.T, e *testEnv, id string) int64 {
	t.Helper()
	var n int64
	if err := e.DB.Model(&models.Usage{}).Where("inference_id = ?", id).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestYoungStopAcrossReplicas: a stop through another replica of a stream
// 50 ms old — its row written nowhere yet — is decided by the replica that
// runs it, which knows whose it is. Someone else's stop gets the 404 of an
// unknown id and the stream goes on; the owner's is acknowledged by that
// replica (not found through storage) and the stream ends exactly there:
// no content after the 200, one usage row, stopped. For both stop routes:
// /v1/inferences/{id}/cancel with a key, and the chat's
// /api/v1/inference/stop with a session.
func TestYoungStopAcrossReplicas(t *testing.T) {
	for _, real := range realModes(t) {
		t.Run(modeName(real), func(t *testing.T) {
			c := startCluster(t, 2, real)
			a, b := c.replicas[0], c.replicas[1]
			acked := func() float64 { return metricValue(t, b, "moonji_stops_total", `result="acked"`) }

			t.Run("v1_cancel", func(t *testing.T) {
				other := a.newKey("someone-else@example.com", 0)
				body := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":1000}}`

				s := startStream(t, a, a.Key, body)
				untilAge(s.started, youngAge)
				refused := cancelVia(t, b, other, s.id)
				unknown := cancelVia(t, b, other, "inf_"+strings.Repeat("0", 26))
				if refused.status != http.StatusNotFound || fmt.Sprint(refused.body["error"].(map[string]any)["code"]) != "inference_not_found" ||
					unknown.status != refused.status || fmt.Sprint(unknown.body["error"].(map[string]any)["code"]) != "inference_not_found" {
					t.Fatalf("someone else's stop: %d %v; an unknown id's: %d %v; want the same 404", refused.status, refused.body, unknown.status, unknown.body)
				}
				waitFor(t, "content after someone else's stop", 5*time.Second, func() bool { return s.contentAfter(refused.at) >= 2 })
				if ans := cancelVia(t, b, a.Key, s.id); ans.status != http.StatusOK || ans.body["state"] != "stopped" {
					t.Fatalf("the owner's stop of the stream someone else tried to stop: %d %v", ans.status, ans.body)
				}
				s.wait(t)

				before := acked()
				s = startStream(t, a, a.Key, body)
				untilAge(s.started, youngAge)
				if n := storedRows(t, a, s.id); n != 0 {
					t.Fatalf("the row of a %v old stream is stored already (%d): the test would prove nothing", youngAge, n)
				}
				ans := cancelVia(t, b, a.Key, s.id)
				if ans.status != http.StatusOK || ans.body["state"] != "stopped" || ans.body["acknowledged"] != true {
					t.Fatalf("the owner's stop of a young stream through B: %d %v", ans.status, ans.body)
				}
				all := s.wait(t)
				if n := s.contentAfter(ans.at); n != 0 {
					t.Errorf("%d content chunks reached the client after the stop's 200", n)
				}
				if !strings.HasSuffix(all, "data: [DONE]\n\n") || strings.Count(all, `"usage"`) != 1 {
					t.Errorf("stopped stream does not end with its usage and [DONE]: %q", tail(all))
				}
				if row := a.final(s.id); row.Outcome != models.OutcomeStopped || row.CompletionTokens != s.contentCount() {
					t.Errorf("row = %+v, delivered %d", row, s.contentCount())
				}
				if n := storedRows(t, a, s.id); n != 1 {
					t.Errorf("%d rows for the stopped stream, want 1", n)
				}
				// Decided by the owner's acknowledgement, not from storage.
				if got := acked() - before; got != 1 {
					t.Errorf("B's moonji_stops_total{result=acked} grew by %v, want 1", got)
				}
			})

			t.Run("chat_stop", func(t *testing.T) {
				const email = "young@example.com"
				pa, pb, other := a.chatter(email), b.chatter(email), b.chatter("not-young@example.com")
				a.mockBody(map[string]any{"tokens": 1000, "tps": 50})
				conv := pa.newConversation()
				stop := func(p *chatter, id string) (int, string) {
					return p.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+id+`"}`)
				}

				s := pa.send(conv, "a long one")
				untilAge(time.Now(), youngAge)
				st, refused := stop(other, s.InferenceID)
				stUnknown, unknown := stop(other, "inf_"+strings.Repeat("1", 26))
				if st != http.StatusNotFound || stUnknown != st || !strings.Contains(refused, `"inference_not_found"`) || !strings.Contains(unknown, `"inference_not_found"`) {
					t.Fatalf("someone else's stop: %d %s; an unknown id's: %d %s; want the same 404", st, refused, stUnknown, unknown)
				}
				// It went on: the owner's stop, later, finds it running.
				if st, body := stop(pb, s.InferenceID); st != http.StatusOK || !strings.Contains(body, `"state":"stopped"`) {
					t.Fatalf("the owner's stop after someone else's: %d %s", st, body)
				}
				if m := pa.reply(conv); m.Status != models.MessageStopped || m.Content == "" {
					t.Fatalf("the reply someone else tried to stop: %+v, want stopped with what it had written", m)
				}

				before := acked()
				s = pa.send(conv, "again")
				untilAge(time.Now(), youngAge)
				if n := storedRows(t, a, s.InferenceID); n != 0 {
					t.Fatalf("the row of a %v old reply is stored already (%d): the test would prove nothing", youngAge, n)
				}
				st, body := stop(pb, s.InferenceID)
				if st != http.StatusOK || !strings.Contains(body, `"state":"stopped"`) || !strings.Contains(body, `"acknowledged":true`) {
					t.Fatalf("the owner's stop of a young reply through B: %d %s", st, body)
				}
				// Saved before the 200, and nothing added after it.
				msgs := pa.conversation(conv).Messages
				atAck := msgs[len(msgs)-1]
				if atAck.Status != models.MessageStopped {
					t.Fatalf("the reply right after the stop's 200: %+v, want stopped", atAck)
				}
				if m := pa.reply(conv); m.Content != atAck.Content || m.Status != models.MessageStopped {
					t.Errorf("the reply changed after the stop's 200: %+v, then %+v", atAck, m)
				}
				if row := a.final(s.InferenceID); row.Outcome != models.OutcomeStopped {
					t.Errorf("row = %+v", row)
				}
				if n := storedRows(t, a, s.InferenceID); n != 1 {
					t.Errorf("%d rows for the stopped reply, want 1", n)
				}
				if got := acked() - before; got != 1 {
					t.Errorf("B's moonji_stops_total{result=acked} grew by %v, want 1", got)
				}
			})
		})
	}
}

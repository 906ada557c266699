package web_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A request refused because the backend's queue is full is on the
// dashboard's recent rejections with its reason, status and key prefix:
// one slot, a queue of one, both taken, and a third request.
func TestDashboardShowsQueueFullRejection(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", limits(1, 1, 30*time.Second))
	admin := e.signedIn("ada@example.com", true)
	slow := `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tag":"TAG","ttft_ms":1500,"tokens":1}}`
	done := make(chan struct{}, 2)
	send := func(tag string) {
		go func() {
			defer func() { done <- struct{}{} }()
			resp := e.post(strings.Replace(slow, "TAG", tag, 1))
			readAll(t, resp.Body)
		}()
	}
	send("holder")
	if _, err := e.Mock.WaitFor(ctxTimeout(t, 5*time.Second), "holder", nil); err != nil {
		t.Fatal(err)
	}
	send("waiter")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(e.adminPage(admin, "/admin/backends"), `data-queued="1" data-max-queue="1"`) {
		if time.Now().After(deadline) {
			t.Fatal("the second request never queued")
		}
		time.Sleep(10 * time.Millisecond)
	}

	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
	body := readAll(t, resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "queue_full") {
		t.Fatalf("third request: %d %s, want 503 queue_full", resp.StatusCode, body)
	}
	id := resp.Header.Get("X-Inference-Id")
	if row := e.final(id); row.Reason != "queue_full" {
		t.Fatalf("ledger row: %+v", row)
	}

	rej := tableOf(t, e.adminPage(admin, "/admin"), "rejected")
	row := regexp.MustCompile(`(?s)<tr data-inference-id="` + regexp.QuoteMeta(id) + `"[^>]*>.*?</tr>`).FindString(rej)
	key := keyOf(t, e, "owner@example.com")
	for _, want := range []string{`data-reason="queue_full" data-status="503"`, "<code>queue_full</code>", key.Prefix + "…", "owner@example.com", ">m1<"} {
		if !strings.Contains(row, want) {
			t.Errorf("the queue_full rejection lacks %q:\n%s", want, row)
		}
	}
	for range 2 {
		<-done
	}
}

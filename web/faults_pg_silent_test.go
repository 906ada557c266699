package web_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/internal/mockllm"
	"moonji/models"
)

// PostgreSQL goes silent under load: its connections stay open and nothing
// comes back, as behind a NAT entry or a firewall that dropped the flow
// without a word. The ledger's commit gives up after its commit wait, the
// writer treats the database as away (rows kept in the journal, /readyz says
// so) instead of waiting for TCP to notice hours later, every request is
// answered meanwhile, and once the path is back every answered request has
// exactly one final row.
func TestPostgresSilentKeepsEveryRow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs load through a silent PostgreSQL")
	}
	direct, proxied := proxiedPostgres(t)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	dir := t.TempDir()
	cfg, addr := faultReplicaConfig(t, dir, "a", proxied, ms.URL)
	a := startInProcess(t, cfg, addr)
	const wait = time.Second
	a.Ledger.SetCommitWait(wait)

	db, err := models.Open(direct)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	u, err := models.EnsureUser(context.Background(), db, "silent@example.com")
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := apikey.Create(context.Background(), db, u.ID, "silent", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr
	l := &faultLoad{key: key, client: &http.Client{Timeout: 30 * time.Second}}
	l.start(t, 50, map[string]string{"a": base})
	l.waitAnswered(t, "a", 10)

	currentProxy.Blackhole(0) // held open, nothing through, until Clear
	silent := time.Now()
	// The ledger's own outage (database_down_since), not only /readyz's
	// ping: the writer was inside a commit when the path went silent.
	waitFor(t, "the ledger to hold its rows once a commit outlived its wait", 20*wait+10*time.Second, func() bool {
		code, body := get(t, base+"/readyz")
		return code == http.StatusOK && strings.Contains(body, `"database_down_since"`)
	})
	t.Logf("database known away %v after it went silent", time.Since(silent).Round(time.Millisecond))
	// Requests keep being answered while it stays silent a while longer:
	// past the key cache's TTL too, so that the key's refresh is out when
	// its entry expires.
	l.waitAnswered(t, "a", l.answered("a")+50)
	for time.Since(silent) < apikey.DefaultCacheTTL+2*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	if l.failures() > 0 {
		t.Errorf("%d requests failed while the database was silent: %s", l.failures(), l.firstFailure())
	}

	currentProxy.Clear()
	ids := l.stop("a")
	waitFor(t, "every row in the database, final", 90*time.Second, func() bool {
		var n int64
		db.Model(&models.Usage{}).Where("inference_id IN ? AND outcome <> ?", ids, models.OutcomePending).Count(&n)
		return n == int64(len(ids))
	})
	var rows []models.Usage
	if err := db.Where("inference_id IN ?", ids).Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rows {
		seen[r.InferenceID]++
		if r.Outcome != "success" {
			t.Errorf("row %s: %s/%s, want success", r.InferenceID, r.Outcome, r.Reason)
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("inference id %s: %d rows", id, seen[id])
		}
	}
	t.Logf("%d requests, every one with one final row", len(ids))
	waitFor(t, "/readyz to say the database is back", 30*time.Second, func() bool {
		_, body := get(t, base+"/readyz")
		return strings.Contains(body, `"database":"ok"`) && !strings.Contains(body, `"ledger"`)
	})
	assertRollupIsRebuild(t, db)
}

// answered is how many requests name has answered so far.
func (l *faultLoad) answered(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids[name])
}

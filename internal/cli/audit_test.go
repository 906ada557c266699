package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"moonji/internal/audit"
	"moonji/models"
)

// Commands that change something record it: actor "cli" (with the OS
// user), no address, the target and what changed, never the key's secret.
func TestCLIRecordsAudit(t *testing.T) {
	cfg := writeConfig(t)
	dbURL := "sqlite://" + filepath.Join(filepath.Dir(cfg), "moonji.db")
	steps := [][]string{
		{"keys", "create", "--config", cfg, "--owner", "ann@example.com", "--name", "ci", "--rpm", "9", "--budget", "3", "--models", "moonji-demo"},
		{"keys", "revoke", "--config", cfg, "1"},
		{"people", "add", "--config", cfg, "--email", "ann@example.com", "--admin"},
		{"people", "budget", "--config", cfg, "ann@example.com", "7", "day"},
		{"people", "disable", "--config", cfg, "ann@example.com"},
		{"people", "enable", "--config", cfg, "ann@example.com"},
		{"teams", "create", "--config", cfg, "Lab"},
		{"teams", "add", "--config", cfg, "Lab", "ann@example.com"},
		{"teams", "remove", "--config", cfg, "Lab", "ann@example.com"},
	}
	var secret string
	for i, args := range steps {
		out, err := run(t, args...)
		if err != nil {
			t.Fatalf("%v: %q %v", args, out, err)
		}
		if i == 0 {
			secret = strings.TrimSpace(out)
		}
	}
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	rows, _, err := models.ListAuditEvents(context.Background(), db, models.AuditFilter{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ action, target, detail string }{
		{audit.TeamMemberRemove, `team 1 "Lab"`, "removed ann@example.com"},
		{audit.TeamMemberAdd, `team 1 "Lab"`, "added ann@example.com"},
		{audit.TeamCreate, `team 1 "Lab"`, "budget none; models all"},
		{audit.PersonEnable, "person ann@example.com", ""},
		{audit.PersonDisable, "person ann@example.com", "0 sessions ended"},
		{audit.BudgetUpdate, "person ann@example.com", "budget none→7.00/day"},
		{audit.PersonUpdate, "person ann@example.com", "admin false→true"},
		{audit.KeyRevoke, `key 1 "ci" of ann@example.com`, ""},
		{audit.KeyCreate, `key 1 "ci" of ann@example.com`, "rpm 9; expires never; budget 3.00/month; models moonji-demo"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.Action != w.action || r.Target != w.target || r.Detail != w.detail || !strings.HasPrefix(r.Actor, "cli") ||
			r.Address != "" || r.ActorID != 0 {
			t.Errorf("event %d: %+v, want %+v", i, r, w)
		}
		if strings.Contains(r.Detail+r.Target+r.Actor, secret) || len(secret) < 20 {
			t.Errorf("the key's secret %q is in %+v", secret, r)
		}
	}
}

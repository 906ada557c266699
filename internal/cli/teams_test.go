package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gorm.io/gorm"

	"moonji/models"
)

// withDB opens the database of the configuration at cfg for a look.
func withDB(t *testing.T, cfg string, fn func(db *gorm.DB)) {
	t.Helper()
	db, err := models.Open("sqlite://" + filepath.Join(filepath.Dir(cfg), "moonji.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	fn(db)
}

// writeConfigWithModels is writeConfig with models qwen, llama, a and b,
// on the built-in engine: --models names only configured models.
func writeConfigWithModels(t *testing.T) string {
	t.Helper()
	path := writeConfig(t)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("backends: [{name: demo, kind: builtin}]\nmodels: [{name: qwen, backend: demo}, " +
		"{name: llama, backend: demo}, {name: a, backend: demo}, {name: b, backend: demo}]\n"); err != nil {
		t.Fatal(err)
	}
	return path
}

// hundredAndOne is a model list of 101 names.
func hundredAndOne() string {
	names := make([]string, 101)
	for i := range names {
		names[i] = fmt.Sprintf("m%d", i)
	}
	return strings.Join(names, ",")
}

// keys create with a budget and models: stored with the key, shown by keys
// list; the period is month unless given.
func TestKeysCreateWithLimits(t *testing.T) {
	cfg := writeConfigWithModels(t)
	if _, err := run(t, "keys", "create", "--config", cfg, "--owner", "a@example.com", "--name", "typo", "--models", "qwen,lama"); err == nil ||
		!strings.Contains(err.Error(), `there is no model "lama"`) {
		t.Fatalf("a model that is not configured: %v", err)
	}
	if _, err := run(t, "keys", "create", "--config", cfg, "--owner", "a@example.com", "--name", "capped",
		"--budget", "5.00", "--budget-period", "day", "--models", "qwen, llama,qwen"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "keys", "create", "--config", cfg, "--owner", "a@example.com", "--name", "monthly", "--budget", "0.0025"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "keys", "create", "--config", cfg, "--owner", "a@example.com", "--name", "free"); err != nil {
		t.Fatal(err)
	}
	withDB(t, cfg, func(db *gorm.DB) {
		keys, err := models.ListAPIKeys(context.Background(), db, 0)
		if err != nil || len(keys) != 3 {
			t.Fatalf("keys: %d, %v", len(keys), err)
		}
		free, monthly, capped := keys[0], keys[1], keys[2]
		if capped.Budget == nil || *capped.Budget != 5_000_000_000 || capped.BudgetPeriod != "day" || capped.Models != "qwen,llama" {
			t.Errorf("capped key: %v %q %q", capped.Budget, capped.BudgetPeriod, capped.Models)
		}
		if monthly.Budget == nil || *monthly.Budget != 2_500_000 || monthly.BudgetPeriod != "month" || monthly.Models != "" {
			t.Errorf("monthly key: %v %q %q", monthly.Budget, monthly.BudgetPeriod, monthly.Models)
		}
		if free.Budget != nil || free.BudgetPeriod != "" || free.Models != "" {
			t.Errorf("key without limits: %v %q %q", free.Budget, free.BudgetPeriod, free.Models)
		}
	})
	out, err := run(t, "keys", "list", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	for _, want := range []string{"BUDGET", "PERIOD", "MODELS"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("keys list's header lacks %s: %s", want, lines[0])
		}
	}
	for _, want := range [][]string{{"capped", "5.00", "day", "qwen,llama"}, {"monthly", "0.0025", "month", "all"}, {"free", "-", "all"}} {
		line := ""
		for _, l := range lines {
			if strings.Contains(l, " "+want[0]+" ") {
				line = l
			}
		}
		for _, w := range want[1:] {
			if !strings.Contains(line, w) {
				t.Errorf("keys list's line of %s lacks %q: %q", want[0], w, line)
			}
		}
	}
}

// teams create, add, remove and list, with flags after the name.
func TestTeamsCommands(t *testing.T) {
	cfg := writeConfigWithModels(t)
	out, err := run(t, "teams", "create", "engineering", "--config", cfg, "--budget", "100", "--budget-period", "total", "--models", "a,b")
	if err != nil || !strings.Contains(out, "engineering") {
		t.Fatalf("teams create: %q, %v", out, err)
	}
	if _, err := run(t, "teams", "create", "--config", cfg, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "teams", "create", "--config", cfg, "ops"); err == nil || !errors.Is(err, models.ErrTeamExists) {
		t.Errorf("a second team ops: %v", err)
	}
	// A person is created when new, as keys create does.
	if out, err := run(t, "teams", "add", "engineering", "New@Example.com", "--config", cfg); err != nil || !strings.Contains(out, "new@example.com") {
		t.Fatalf("teams add: %q, %v", out, err)
	}
	if _, err := run(t, "teams", "add", "--config", cfg, "engineering", "old@example.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "teams", "add", "--config", cfg, "ops", "old@example.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "teams", "add", "--config", cfg, "nosuch", "old@example.com"); err == nil || !strings.Contains(err.Error(), "no team") {
		t.Errorf("add to an unknown team: %v", err)
	}
	if _, err := run(t, "teams", "remove", "--config", cfg, "ops", "old@example.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "teams", "remove", "--config", cfg, "ops", "old@example.com"); err == nil {
		t.Error("removing twice succeeded")
	}
	if _, err := run(t, "teams", "remove", "--config", cfg, "ops", "nobody@example.com"); err == nil {
		t.Error("removing an unknown person succeeded")
	}
	out, err = run(t, "teams", "list", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "MEMBERS") {
		t.Fatalf("teams list:\n%s", out)
	}
	for _, w := range []string{"engineering", " 2 ", "100.00", "total", "a,b"} {
		if !strings.Contains(lines[1], w) {
			t.Errorf("teams list's engineering line lacks %q: %q", w, lines[1])
		}
	}
	for _, w := range []string{"ops", " 0 ", "-", "all"} {
		if !strings.Contains(lines[2], w) {
			t.Errorf("teams list's ops line lacks %q: %q", w, lines[2])
		}
	}
	withDB(t, cfg, func(db *gorm.DB) {
		u, _ := models.UserByEmail(context.Background(), db, "old@example.com")
		teams, _ := models.TeamsOf(context.Background(), db, u.ID)
		if len(teams) != 1 || teams[0].Name != "engineering" {
			t.Errorf("old@ is in %+v", teams)
		}
	})
}

// people budget sets and removes a person's budget.
func TestPeopleBudget(t *testing.T) {
	cfg := writeConfig(t)
	if _, err := run(t, "people", "add", "--config", cfg, "--email", "pia@example.com"); err != nil {
		t.Fatal(err)
	}
	budget := func() (*int64, string) {
		var b *int64
		var p string
		withDB(t, cfg, func(db *gorm.DB) {
			u, err := models.UserByEmail(context.Background(), db, "pia@example.com")
			if err != nil {
				t.Fatal(err)
			}
			b, p = u.Budget, u.BudgetPeriod
		})
		return b, p
	}
	if out, err := run(t, "people", "budget", "--config", cfg, "pia@example.com", "12.5", "day"); err != nil || !strings.Contains(out, "12.50") {
		t.Fatalf("people budget: %q, %v", out, err)
	}
	if b, p := budget(); b == nil || *b != 12_500_000_000 || p != "day" {
		t.Errorf("budget %v %q", b, p)
	}
	out, err := run(t, "people", "list", "--config", cfg)
	if err != nil || !strings.Contains(out, "12.50") || !strings.Contains(out, "day") {
		t.Errorf("people list: %q, %v", out, err)
	}
	if _, err := run(t, "people", "budget", "pia@example.com", "none", "--config", cfg); err != nil {
		t.Fatal(err)
	}
	if b, p := budget(); b != nil || p != "" {
		t.Errorf("after none: %v %q", b, p)
	}
	if _, err := run(t, "people", "budget", "--config", cfg, "nobody@example.com", "1", "day"); err == nil {
		t.Error("a budget for nobody succeeded")
	}
}

// Hostile and mistaken input: usage errors that name what is wrong, and
// nothing stored.
func TestBudgetUsageErrors(t *testing.T) {
	cfg := writeConfig(t)
	key := []string{"keys", "create", "--config", cfg, "--owner", "a@example.com", "--name", "k"}
	cases := []struct {
		args []string
		name string // what the error must name
	}{
		{append(key, "--budget", "-1"), "--budget"},
		{append(key, "--budget", "1e3"), "--budget"},
		{append(key, "--budget", "abc"), "--budget"},
		{append(key, "--budget", ""), "--budget"},
		{append(key, "--budget", "1.0000000001"), "--budget"},
		{append(key, "--budget", "99999999999999"), "--budget"},
		{append(key, "--budget", "5", "--budget-period", "week"), "--budget-period"},
		{append(key, "--budget", "5", "--budget-period", ""), "--budget-period"},
		{append(key, "--budget-period", "day"), "--budget-period"},
		{append(key, "--models", "a,b\x1b[2J"), "--models"},
		{append(key, "--models", "a\nb"), "--models"},
		{append(key, "--models", hundredAndOne()), "--models"},
		{append(key, "--models", strings.Repeat("x", 201)), "--models"},
		{append(key, "--models", ","), "--models"},
		{[]string{"teams"}, "teams"},
		{[]string{"teams", "frobnicate"}, "teams"},
		{[]string{"teams", "create", "--config", cfg}, "team name"},
		{[]string{"teams", "create", "--config", cfg, "a", "b"}, "team name"},
		{[]string{"teams", "create", "--config", cfg, strings.Repeat("t", 101)}, "NAME"},
		{[]string{"teams", "create", "--config", cfg, "tab\tname"}, "NAME"},
		{[]string{"teams", "create", "--config", cfg, "   "}, "NAME"},
		{[]string{"teams", "create", "--config", cfg, "x", "--budget", "abc"}, "--budget"},
		{[]string{"teams", "create", "--config", cfg, "x", "--budget-period", "month"}, "--budget-period"},
		{[]string{"teams", "create", "--config", cfg, "x", "--models", hundredAndOne()}, "--models"},
		{[]string{"teams", "add", "--config", cfg, "x"}, "teams add"},
		{[]string{"teams", "add", "--config", cfg, strings.Repeat("t", 101), "a@example.com"}, "NAME"},
		{[]string{"teams", "remove", "--config", cfg, "x", "a@example.com", "b@example.com"}, "teams remove"},
		{[]string{"teams", "list", "--config", cfg, "extra"}, "teams list"},
		{[]string{"people", "budget", "--config", cfg, "a@example.com"}, "people budget"},
		{[]string{"people", "budget", "--config", cfg, "a@example.com", "5"}, "people budget"},
		{[]string{"people", "budget", "--config", cfg, "a@example.com", "abc", "day"}, "AMOUNT"},
		{[]string{"people", "budget", "--config", cfg, "a@example.com", "1e3", "day"}, "AMOUNT"},
		{[]string{"people", "budget", "--config", cfg, "a@example.com", "-1", "day"}, "people budget"}, // -1 reads as a flag
		{[]string{"people", "budget", "--config", cfg, "a@example.com", "5", "fortnight"}, "PERIOD"},
		{[]string{"people", "budget", "--config", cfg, "a@example.com", "5", "day", "extra"}, "people budget"},
	}
	for _, c := range cases {
		_, err := run(t, c.args...)
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("moonji %.120q: %v, want a usage error naming %s", c.args, err, c.name)
		}
	}
	withDB(t, cfg, func(db *gorm.DB) {
		var keys, teams int64
		db.Model(&models.APIKey{}).Count(&keys)
		db.Model(&models.Team{}).Count(&teams)
		if keys != 0 || teams != 0 {
			t.Errorf("refused commands stored %d keys and %d teams", keys, teams)
		}
	})
}

package cli

import (
	"context"
	"errors"
	"strings"
	"testing"

	"moonji/models"
)

// TestKeysCreateScope: --scope admin issues an admin-scoped key to an admin,
// and is refused, with a sentence saying why and what to do, for a person
// who is not one or does not exist (who is then not created either); the
// default scope is inference, and an unknown scope is a usage error.
func TestKeysCreateScope(t *testing.T) {
	cfg := writeConfig(t)
	if _, err := run(t, "people", "add", "--config", cfg, "--email", "boss@example.com", "--admin"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "keys", "create", "--config", cfg, "--owner", "Boss@example.com", "--name", "terraform", "--scope", "admin")
	if err != nil || !strings.HasPrefix(out, "mj-") || strings.Count(out, "\n") != 1 {
		t.Fatalf("admin key for an admin: %q %v", out, err)
	}
	if out, err = run(t, "keys", "create", "--config", cfg, "--owner", "dev@example.com", "--name", "laptop"); err != nil {
		t.Fatalf("inference key: %q %v", out, err)
	}

	for _, owner := range []string{"dev@example.com", "nobody@example.com"} {
		out, err = run(t, "keys", "create", "--config", cfg, "--owner", owner, "--name", "x", "--scope", "admin")
		if err == nil || out != "" || !strings.Contains(err.Error(), "admin scope") || !strings.Contains(err.Error(), owner) {
			t.Errorf("admin key for %s: %q %v", owner, out, err)
		}
	}
	if _, err = run(t, "keys", "create", "--config", cfg, "--owner", "boss@example.com", "--name", "x", "--scope", "root"); !errors.Is(err, ErrUsage) {
		t.Errorf("unknown scope: %v", err)
	}

	out, err = run(t, "keys", "list", "--config", cfg)
	if err != nil || !strings.Contains(out, "SCOPE") {
		t.Fatalf("keys list: %q %v", out, err)
	}
	db, err := openFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	keys, err := models.ListAPIKeys(context.Background(), db, 0)
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys: %d %v", len(keys), err)
	}
	scopes := map[string]string{}
	for _, k := range keys {
		scopes[k.Name] = k.Scope
	}
	if scopes["terraform"] != models.ScopeAdmin || scopes["laptop"] != models.ScopeInference {
		t.Errorf("scopes stored: %v", scopes)
	}
	if _, err := models.UserByEmail(context.Background(), db, "nobody@example.com"); !errors.Is(err, models.ErrNotFound) {
		t.Errorf("a refused admin key created its owner: %v", err)
	}
}

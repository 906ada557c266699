package web_test

import (
	"net"
	"net/http"
	"testing"

	"moonji/internal/config"
)

func TestHealthAndReadiness(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(e.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d %s", path, resp.StatusCode, body)
		}
	}

	// Redis configured but gone: ready says 503 and names it.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	e = startEnv(t, "sqlite://"+t.TempDir()+"/r.db", func(c *config.Config) { c.RedisURL = "redis://" + dead })
	resp, err := http.Get(e.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !contains(body, `"redis":"unreachable"`) || !contains(body, `"database":"ok"`) {
		t.Errorf("/readyz with Redis down: %d %s", resp.StatusCode, body)
	}
}

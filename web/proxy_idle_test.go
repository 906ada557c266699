package web_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/keepalive"
	"moonji/models"
)

// nginxBinary finds nginx; without it the test skips outside CI (make test
// installs it: scripts/ensure-nginx.sh).
func nginxBinary(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"nginx", "/usr/sbin/nginx"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("MOONJI_TEST_REDIS_URL") != "" {
		t.Fatal("nginx is missing in CI: scripts/ensure-nginx.sh installs it")
	}
	t.Skip("nginx is not installed (scripts/ensure-nginx.sh installs it)")
	return ""
}

// startNginx runs deploy/nginx/moonji.conf — the configuration the README
// shows — in a real nginx in front of upstream, with its
// proxy_read_timeout set to readTimeout, and returns its base URL.
func startNginx(t *testing.T, upstream, readTimeout string) string {
	t.Helper()
	bin := nginxBinary(t)
	site, err := os.ReadFile("../deploy/nginx/moonji.conf")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conf := string(site)
	for old, repl := range map[string]string{
		"server 127.0.0.1:8080;":   "server " + upstream + ";",
		"listen 80;":               "listen " + addr + ";",
		"proxy_read_timeout 120s;": "proxy_read_timeout " + readTimeout + ";",
	} {
		if !strings.Contains(conf, old) {
			t.Fatalf("deploy/nginx/moonji.conf no longer has %q", old)
		}
		conf = strings.Replace(conf, old, repl, 1)
	}
	dir := t.TempDir()
	// One process (no master and worker): killing it leaves nothing behind.
	main := fmt.Sprintf(`master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
daemon off;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[1]s/body; proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fcgi; uwsgi_temp_path %[1]s/uwsgi; scgi_temp_path %[1]s/scgi;
%[2]s
}
`, dir, conf)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitFor(t, "nginx listening", 10*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, func() {
		b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		t.Logf("nginx error.log:\n%s", b)
	})
	return "http://" + addr
}

// postVia sends a chat completion to base (nginx) with the env's key.
func postVia(t *testing.T, e *testEnv, base, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// thinking is a stream whose engine is silent for 2.5 s before its first
// token and again between its second and third: longer than the proxy's
// 1 s idle timeout, each time.
const thinking = `{"model":"m1","stream":true,"messages":[{"role":"user","content":"think"}],` +
	`"mock":{"tokens":4,"ttft_ms":2500,"pause_after":2,"pause_ms":2500}}`

// Behind nginx with a 1 s proxy_read_timeout, a stream whose model thinks
// for 2.5 s (before its first token and between two) arrives whole with
// keep-alives, and is cut by nginx without them: the keep-alives are what
// keeps it.
func TestStreamSurvivesAnIdleTimeoutProxy(t *testing.T) {
	t.Run("keep-alives", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(300*time.Millisecond))
		base := startNginx(t, strings.TrimPrefix(e.URL, "http://"), "1s")
		resp := postVia(t, e, base, thinking)
		body := readAll(t, resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("through nginx: %d, ends %q", resp.StatusCode, tail(body))
		}
		if !strings.Contains(body, string(keepalive.Comment)) {
			t.Fatal("no keep-alive reached the client")
		}
		row := e.final(resp.Header.Get("X-Inference-Id"))
		if row.Outcome != models.OutcomeSuccess {
			t.Fatalf("row = %+v", row)
		}
	})
	t.Run("without", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(0))
		base := startNginx(t, strings.TrimPrefix(e.URL, "http://"), "1s")
		resp := postVia(t, e, base, thinking)
		b, _ := readAllQuiet(resp) // nginx ends the chunked body short
		body := string(b)
		if strings.Contains(body, "[DONE]") {
			t.Fatalf("a stream silent for 2.5 s passed a 1 s idle timeout without keep-alives: the test proves nothing\n%s", body)
		}
		// Moonji saw its client (nginx) leave.
		row := e.final(resp.Header.Get("X-Inference-Id"))
		if row.Outcome != models.OutcomeCancelled || row.Reason != "client_disconnected" {
			t.Fatalf("row = %+v, want cancelled/client_disconnected", row)
		}
	})
}

// The chat's event stream through the same nginx: a reply whose model
// thinks for longer than the idle timeout reaches the page whole.
func TestChatEventStreamSurvivesAnIdleTimeoutProxy(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(300*time.Millisecond))
	base := startNginx(t, strings.TrimPrefix(e.URL, "http://"), "1s")
	p := e.chatter("thinker@example.com")
	e.mockBody(map[string]any{"tokens": 4, "ttft_ms": 2500, "pause_after": 2, "pause_ms": 2500})
	s := p.send(p.newConversation(), "think first")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/generations/"+s.InferenceID+"/events", nil)
	resp, err := p.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := readAll(t, resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "event: done") {
		t.Fatalf("event stream through nginx: %d\n%s", resp.StatusCode, body)
	}
	if n := strings.Count(body, "event: chunk"); n != 4 {
		t.Fatalf("%d chunks, want 4\n%s", n, body)
	}
}

// A request waiting in Moonji's queue gets nothing until it leaves it: a
// proxy whose idle timeout is shorter than the wait answers its client 504
// (nginx's Gateway Timeout) and hangs up, and Moonji takes the request out
// of the queue with its row cancelled / client_disconnected. Hence the
// README's advice: queue_timeout below the proxy's timeout.
func TestQueuedRequestBehindAnIdleTimeoutProxy(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(300*time.Millisecond), func(c *config.Config) {
		c.Backends[0].MaxConcurrency = 1
		c.Backends[0].QueueTimeout = time.Minute
	})
	base := startNginx(t, strings.TrimPrefix(e.URL, "http://"), "1s")
	holder := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tokens":200,"tps":20}}`)
	defer holder.Body.Close()
	resp := postVia(t, e, base, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"queued"}],"mock":{"tokens":2}}`)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("a request queued past the proxy's timeout: %d %s", resp.StatusCode, readAll(t, resp.Body))
	}
	var row models.Usage
	waitFor(t, "the queued request's row", 10*time.Second, func() bool {
		_ = e.srv.Ledger.Flush(context.Background())
		return e.DB.Where("outcome = ? AND reason = ?", models.OutcomeCancelled, "client_disconnected").First(&row).Error == nil
	})
	if row.QueueMs < 900 {
		t.Fatalf("row = %+v: it left the queue before nginx gave up", row)
	}
}

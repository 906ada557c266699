package faultproxy

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// get asks the upstream through the proxy for one HTTP answer.
func get(t *testing.T, addr string) error {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func TestDownUpLatencyBlackhole(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer up.Close()
	p := Start(t, up.Listener.Addr().String())
	if err := get(t, p.Addr()); err != nil {
		t.Fatalf("healthy path: %v", err)
	}
	addr := p.Addr()
	p.Down()
	if err := get(t, addr); err == nil {
		t.Fatal("a request went through a proxy that is down")
	}
	p.Up()
	if p.Addr() != addr {
		t.Fatalf("the proxy came back on %s, not %s", p.Addr(), addr)
	}
	if err := get(t, p.Addr()); err != nil {
		t.Fatalf("after Up: %v", err)
	}

	p.Latency(300, 0)
	start := time.Now()
	if err := get(t, p.Addr()); err != nil {
		t.Fatalf("with latency: %v", err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("a request with 300 ms latency each way took %v", took)
	}
	p.Clear()

	// A silent path: the connection is accepted, nothing comes back.
	p.Blackhole(0)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := bufio.NewReader(conn).ReadByte(); err == nil {
		t.Fatal("a blackholed path answered")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a blackholed path ended the connection (%v) instead of going silent", err)
	}
}

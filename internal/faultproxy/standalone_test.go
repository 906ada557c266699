package faultproxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A proxy made outside a test (New) goes down, comes back on its address,
// takes and clears toxics, and closes, with no testing.TB behind it.
func TestNewWithoutATest(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer up.Close()
	p, err := New("standalone", up.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	addr := p.Addr()
	if err := get(t, addr); err != nil {
		t.Fatalf("healthy path: %v", err)
	}
	p.Down()
	if err := get(t, addr); err == nil {
		t.Fatal("a request went through a proxy that is down")
	}
	p.Up()
	if err := get(t, addr); err != nil {
		t.Fatalf("after Up: %v", err)
	}
	p.ResetPeer(1, 0)
	if err := get(t, addr); err == nil {
		t.Fatal("a request went through a path that resets every connection")
	}
	p.Clear()
	if err := get(t, addr); err != nil {
		t.Fatalf("after Clear: %v", err)
	}
	p.Close()
	if err := get(t, addr); err == nil {
		t.Fatal("a request went through a closed proxy")
	}
}

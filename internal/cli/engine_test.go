package cli

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/enginelink/protocol"
)

// `moonji engine` serves the configuration's builtin model to a gateway
// that brings the token, and stops cleanly when its context ends.
func TestEngineCommand(t *testing.T) {
	if _, err := run(t, "engine", "extra"); !errors.Is(err, ErrUsage) {
		t.Fatalf("a stray argument: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "engine.yaml")
	cfg := "backends: [{name: demo, kind: builtin, tokens_per_second: 1000}]\nmodels: [{name: demo-model, backend: demo}]\nengine: {token: tok}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("MOONJI_ENGINE_TOKEN", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- Run(ctx, []string{"engine", "--listen", addr, "--config", path}, io.Discard, io.Discard)
	}()

	var ws *websocket.Conn
	deadline := time.Now().Add(15 * time.Second)
	for {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		ws, _, err = websocket.Dial(dctx, "ws://"+addr+"/engine", &websocket.DialOptions{
			Subprotocols: []string{protocol.Subprotocol(protocol.Version)},
			HTTPHeader:   http.Header{"Authorization": {"Bearer tok"}},
		})
		dcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine never accepted: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer ws.CloseNow()
	send := func(id, typ string, payload any) {
		env, err := protocol.New(id, typ, "s1", payload)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := protocol.Encode(env)
		if err := ws.Write(ctx, websocket.MessageText, data); err != nil {
			t.Fatal(err)
		}
	}
	send("g1", protocol.TypeSessionOpen, protocol.SessionOpen{Model: "demo-model"})
	send("g2", protocol.TypeChatRequest, protocol.ChatRequest{Body: `{"model":"demo-model","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`})
	rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
	defer rcancel()
	chunks := 0
	for {
		_, data, err := ws.Read(rctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		env, err := protocol.Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if env.Type == protocol.TypeChatChunk {
			chunks++
		}
		if env.Type == protocol.TypeChatDone {
			break
		}
		if env.Type == protocol.TypeChatError || env.Type == protocol.TypeError {
			t.Fatalf("got %s %s", env.Type, env.Payload)
		}
	}
	if chunks < 3 {
		t.Fatalf("%d chunks for 3 tokens", chunks)
	}
	// Keep reading, as a gateway does, so the engine's close handshake
	// completes.
	go func() {
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("engine ended with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("engine did not stop")
	}
}

package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/enginelink/protocol"
)

// engineWait bounds every wait of the engine command's tests: generous,
// for a loaded machine.
const engineWait = 20 * time.Second

// writeEngineConfig writes an engine's configuration: the builtin demo
// model, and engine.token when token is not empty.
func writeEngineConfig(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "engine.yaml")
	cfg := "backends: [{name: demo, kind: builtin, tokens_per_second: 1000}]\nmodels: [{name: demo-model, backend: demo}]\n"
	if token != "" {
		cfg += "engine: {token: " + token + "}\n"
	}
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// freePort returns a TCP port free on every interface just now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// runningEngine is `moonji engine` running in a goroutine of the test.
type runningEngine struct {
	cancel context.CancelFunc
	errc   chan error
	log    *watchWriter
}

// startEngine runs `moonji engine` with args until the test ends, and
// waits until it says it is listening (or ends first: the test fails).
func startEngine(t *testing.T, args ...string) *runningEngine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &runningEngine{cancel: cancel, errc: make(chan error, 1),
		log: &watchWriter{needle: "moonji engine is listening", seen: make(chan struct{})}}
	go func() { e.errc <- Run(ctx, append([]string{"engine"}, args...), io.Discard, e.log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-e.errc:
		case <-time.After(engineWait):
			t.Error("the engine did not stop")
		}
	})
	select {
	case <-e.log.seen:
	case err := <-e.errc:
		t.Fatalf("the engine ended before listening: %v\n%s", err, e.log)
	case <-time.After(engineWait):
		t.Fatalf("the engine never said it listens:\n%s", e.log)
	}
	return e
}

// stop ends the engine as a signal would and returns how it ended.
func (e *runningEngine) stop(t *testing.T) error {
	t.Helper()
	e.cancel()
	select {
	case err := <-e.errc:
		e.errc <- err // for the cleanup
		return err
	case <-time.After(engineWait):
		t.Fatal("the engine did not stop")
	}
	return nil
}

// dialEngine opens a gateway's WebSocket to the engine at addr.
func dialEngine(t *testing.T, addr, token string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), engineWait)
	defer cancel()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/engine", &websocket.DialOptions{
		Subprotocols: []string{protocol.Subprotocol(protocol.Version)},
		HTTPHeader:   h,
		HTTPClient:   &http.Client{Transport: &http.Transport{}},
	})
	if err != nil {
		t.Fatalf("dial the engine at %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = ws.CloseNow() })
	return ws
}

// watchWriter keeps what is written and closes seen once needle appears.
type watchWriter struct {
	needle string
	seen   chan struct{}
	mu     sync.Mutex
	buf    bytes.Buffer
	once   sync.Once
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.needle) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// `moonji engine` serves the configuration's builtin model to a gateway
// that brings the token, and stops cleanly when its context ends.
func TestEngineCommand(t *testing.T) {
	if _, err := run(t, "engine", "extra"); !errors.Is(err, ErrUsage) {
		t.Fatalf("a stray argument: %v", err)
	}
	if _, err := run(t, "engine", "--listen", "127.0.0.1"); !errors.Is(err, ErrUsage) {
		t.Fatalf("--listen without a port: %v", err)
	}
	path := writeEngineConfig(t, "tok")
	addr := "127.0.0.1:" + freePort(t)
	t.Setenv("MOONJI_ENGINE_TOKEN", "")
	e := startEngine(t, "--listen", addr, "--config", path)
	ws := dialEngine(t, addr, "tok")
	ctx, cancel := context.WithTimeout(context.Background(), engineWait)
	defer cancel()
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
	chunks := 0
	for {
		_, data, err := ws.Read(ctx)
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
	if err := e.stop(t); err != nil {
		t.Fatalf("engine ended with %v", err)
	}
}

// The reviewer's finding: without a token the engine listened on any
// address it was given, logging only token=false. Now an address that is
// not loopback, without a token, is refused before anything listens, with
// an error that says how to set one. The port is held by the test on every
// interface, so an engine that tried to listen would fail another way
// (address in use) and the check is seen to come first.
func TestEngineWithoutTokenRefusesNonLoopback(t *testing.T) {
	t.Setenv("MOONJI_ENGINE_TOKEN", "")
	path := writeEngineConfig(t, "")
	held, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	for _, listen := range []string{
		"0.0.0.0:" + port,
		":" + port,
		"[::]:" + port,
		"192.168.1.20:" + port,
		"10.0.0.7:" + port,
		"engine.example.invalid:" + port,
		"my-host:" + port,
	} {
		errc := make(chan error, 1)
		go func() {
			errc <- Run(context.Background(), []string{"engine", "--listen", listen, "--config", path}, io.Discard, io.Discard)
		}()
		select {
		case err := <-errc:
			if err == nil || !strings.Contains(err.Error(), "MOONJI_ENGINE_TOKEN") || !strings.Contains(err.Error(), "engine.token") {
				t.Errorf("--listen %s without a token: %v, want a refusal naming MOONJI_ENGINE_TOKEN and engine.token", listen, err)
			}
		case <-time.After(engineWait):
			t.Fatalf("--listen %s without a token: the engine is serving", listen)
		}
	}
}

// A token lets the engine listen on every interface (here: the token from
// MOONJI_ENGINE_TOKEN, the file has none).
func TestEngineWithTokenListensAnywhere(t *testing.T) {
	t.Setenv("MOONJI_ENGINE_TOKEN", "from-env")
	port := freePort(t)
	e := startEngine(t, "--listen", "0.0.0.0:"+port, "--config", writeEngineConfig(t, ""))
	ws := dialEngine(t, "127.0.0.1:"+port, "from-env")
	_ = ws.Close(websocket.StatusNormalClosure, "")
	if err := e.stop(t); err != nil {
		t.Fatalf("engine ended with %v", err)
	}
}

// Without a token, a loopback address is served, named by IPv4 address,
// IPv6 address or localhost, and says so in its log.
func TestEngineWithoutTokenOnLoopback(t *testing.T) {
	t.Setenv("MOONJI_ENGINE_TOKEN", "")
	path := writeEngineConfig(t, "")
	for _, host := range []string{"127.0.0.1", "[::1]", "localhost"} {
		port := freePort(t)
		if host == "[::1]" {
			if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
				t.Logf("no IPv6 loopback here: %v", err)
				continue
			} else {
				ln.Close()
			}
		}
		e := startEngine(t, "--listen", host+":"+port, "--config", path)
		ws := dialEngine(t, host+":"+port, "")
		_ = ws.Close(websocket.StatusNormalClosure, "")
		if err := e.stop(t); err != nil {
			t.Fatalf("%s: engine ended with %v", host, err)
		}
	}
}

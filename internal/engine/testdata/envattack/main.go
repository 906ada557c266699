// Command envattack is the envelope attack of issue 42 against a running
// `moonji engine`: N connections at once, each sending one envelope of SIZE
// bytes (a chat.request for a session that does not exist, so that no
// request runs), optionally after opening a session. It reports the
// engine's VmRSS before and after, and its VmHWM, read from
// /proc/PID/status. bench/bench-engine-envelopes.sh runs it.
//
// It lives under testdata so that `go build ./...` and the tests skip it:
//
//	go run ./internal/engine/testdata/envattack -url ws://127.0.0.1:9300/engine -pid PID -conns 4 -size 34603008
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:9300/engine", "the engine's WebSocket URL")
	pid := flag.Int("pid", 0, "the engine's process id, for /proc/PID/status")
	conns := flag.Int("conns", 4, "connections, each sending one envelope")
	size := flag.Int("size", 33<<20, "bytes of each envelope")
	session := flag.String("session", "", "open a session of this model first (the envelope then comes inside a session)")
	token := flag.String("token", "", "the engine's token, if it has one")
	flag.Parse()
	if *pid == 0 {
		fmt.Fprintln(os.Stderr, "envattack: -pid is required")
		os.Exit(2)
	}
	before := status(*pid)
	var wg sync.WaitGroup
	results := make([]string, *conns)
	held := make([]*websocket.Conn, *conns)
	for i := range *conns {
		wg.Go(func() { results[i], held[i] = attack(*url, *token, *session, *size) })
	}
	wg.Wait()
	after := status(*pid)
	for i, r := range results {
		fmt.Printf("connection %d: %s\n", i+1, r)
	}
	fmt.Printf("engine before: VmRSS %s\n", before["VmRSS"])
	fmt.Printf("engine after:  VmRSS %s, VmHWM %s (peak)\n", after["VmRSS"], after["VmHWM"])
	for _, ws := range held {
		if ws != nil {
			_ = ws.CloseNow()
		}
	}
}

// attack dials, opens a session when asked, streams one envelope of size
// bytes and waits for the engine's answer to it (an `error` envelope) or
// the connection's end. The connection is returned open, if it still is,
// so that the engine holds whatever it holds for it until the reading.
func attack(url, token, model string, size int) (string, *websocket.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		Subprotocols: []string{"moonji-engine.v1"}, HTTPHeader: h,
		HTTPClient: &http.Client{Transport: &http.Transport{}},
	})
	if err != nil {
		if resp != nil {
			return fmt.Sprintf("refused: %d", resp.StatusCode), nil
		}
		return "dial: " + err.Error(), nil
	}
	ws.SetReadLimit(1 << 20)
	answered := make(chan string, 1)
	go func() {
		for {
			_, data, err := ws.Read(context.Background())
			if err != nil {
				answered <- "connection closed: " + err.Error()
				return
			}
			if s := string(data); strings.Contains(s, `"type":"error"`) && !strings.Contains(s, `"ref":"open"`) {
				answered <- "answered: " + s
				return
			}
		}
	}()
	if model != "" {
		open := fmt.Sprintf(`{"v":1,"id":"open","type":"session.open","session":"s1","payload":{"model":%q}}`, model)
		if err := ws.Write(ctx, websocket.MessageText, []byte(open)); err != nil {
			return "session.open: " + err.Error(), nil
		}
	}
	sent, err := stream(ctx, ws, size)
	outcome := fmt.Sprintf("%d of %d bytes sent", sent, size)
	if err != nil {
		outcome += " (write failed: " + err.Error() + ")"
	}
	select {
	case a := <-answered:
		return outcome + "; " + clip(a), ws
	case <-ctx.Done():
		return outcome + "; no answer", ws
	}
}

// stream writes one text message of size bytes in 64 KiB frames: a
// chat.request for session "none" whose body is filler.
func stream(ctx context.Context, ws *websocket.Conn, size int) (int, error) {
	w, err := ws.Writer(ctx, websocket.MessageText)
	if err != nil {
		return 0, err
	}
	head := []byte(`{"v":1,"id":"big","type":"chat.request","session":"none","payload":{"body":"`)
	tail := []byte(`"}}`)
	n, err := w.Write(head)
	if err != nil {
		return n, err
	}
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	for n < size-len(tail) {
		m, err := w.Write(chunk[:min(len(chunk), size-len(tail)-n)])
		n += m
		if err != nil {
			return n, err
		}
	}
	m, err := w.Write(tail)
	n += m
	if err != nil {
		return n, err
	}
	return n, w.Close()
}

// status reads /proc/PID/status's fields.
func status(pid int) map[string]string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		fmt.Fprintln(os.Stderr, "envattack:", err)
		os.Exit(1)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func clip(s string) string {
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

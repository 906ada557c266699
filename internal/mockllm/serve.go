package mockllm

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ServeDemo serves the demo engine for models, paced at tokensPerSecond, on
// a loopback port of its own, so that its caller (the gateway's builtin
// backend, or `moonji engine`'s) reaches it through exactly the path a real
// engine takes. It returns the server (to Close) and its base URL (…/v1).
func ServeDemo(models []string, tokensPerSecond float64, log *slog.Logger) (*http.Server, string, error) {
	o := DemoOptions()
	o.Models = models
	o.TokensPerSecond = tokensPerSecond
	o.Logger = log
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("serve the demo engine: %w", err)
	}
	srv := &http.Server{Handler: New(o), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("demo engine stopped", "err", err)
		}
	}()
	return srv, "http://" + ln.Addr().String() + "/v1", nil
}

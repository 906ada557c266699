package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"moonji/internal/config"
	"moonji/internal/engine"
)

// engineShutdownGrace is how long running sessions may go on after a stop
// signal before the engine cuts them short.
const engineShutdownGrace = 15 * time.Second

// cmdEngine serves the configuration's models to gateways over the engine
// protocol at ws://ADDR/engine until ctx is done, then shuts down
// gracefully: goaway, running sessions finish, connections close. Without
// engine.token it serves loopback only, and refuses to start elsewhere.
func cmdEngine(ctx context.Context, args []string, stderr io.Writer) error {
	fs, path := newFlagSet("engine")
	listen := fs.String("listen", "127.0.0.1:9300", "address gateways connect to (other than loopback only with engine.token)")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: engine takes no arguments", ErrUsage)
	}
	if _, _, err := net.SplitHostPort(*listen); err != nil {
		return fmt.Errorf("%w: --listen %q: want HOST:PORT, e.g. 127.0.0.1:9300: %v", ErrUsage, *listen, err)
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	tokenless := cfg.Engine.Token == ""
	if tokenless && !config.IsLoopback(*listen) {
		// Before anything starts: without a token, anyone who reaches the
		// address could run requests on this engine's models.
		return fmt.Errorf("engine: --listen %s is not a loopback address and no token is set; "+
			"set engine.token in the configuration file or MOONJI_ENGINE_TOKEN (and the same token as the gateway's backend api_key), "+
			"or listen on 127.0.0.1, [::1] or localhost", *listen)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	models, stopBuiltins, err := engine.ModelsFromConfig(cfg, log)
	if err != nil {
		return err
	}
	defer stopBuiltins()
	srv := engine.New(engine.Options{Models: models, Token: cfg.Engine.Token, Logger: log})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	if tokenless && !config.IsLoopback(ln.Addr().String()) {
		// "localhost" resolved to another address (an /etc/hosts entry).
		ln.Close()
		return fmt.Errorf("engine: --listen %s bound %s, not a loopback address, and no token is set; set engine.token or MOONJI_ENGINE_TOKEN", *listen, ln.Addr())
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	names := make([]string, 0, len(models))
	for _, m := range models {
		names = append(names, m.Name)
	}
	log.Info("moonji engine is listening", "url", "ws://"+ln.Addr().String()+engine.Path, "models", names,
		"token", !tokenless, "max_connections", engine.DefaultMaxConns)
	if tokenless {
		log.Info("no engine token: only loopback peers are served (set engine.token or MOONJI_ENGINE_TOKEN to serve other hosts)")
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err = <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
	case <-ctx.Done():
		log.Info("shutting down")
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineShutdownGrace)
	defer cancel()
	// The engine first: http.Server's Shutdown does not wait for (or tell)
	// the WebSockets it handed over.
	if serr := srv.Shutdown(sctx); serr != nil {
		log.Warn("engine shutdown cut sessions short", "err", serr)
	}
	if serr := hs.Shutdown(sctx); serr != nil && err == nil {
		err = fmt.Errorf("shut down: %w", serr)
	}
	return err
}

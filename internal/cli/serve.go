package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/reload"
	"moonji/web"
)

func cmdServe(ctx context.Context, args []string, stderr io.Writer) error {
	fs, path := newFlagSet("serve")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: serve takes no arguments", ErrUsage)
	}
	var raw []byte
	var err error
	if *path != "" {
		// Read once: the version of the configuration is that of exactly
		// these bytes.
		if raw, err = os.ReadFile(*path); err != nil {
			return fmt.Errorf("read config: %w", err)
		}
	}
	cfg, err := config.Parse(raw, *path)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	// The garbage collector keeps Go's default target (GOGC 100), or the
	// operator's. Earlier builds set 400, chosen when a request allocated
	// several times what it does now: at ~8 KB a request, collecting the
	// ~6 MB live heap about once a second at 1,000 req/s costs a few
	// milliseconds of CPU, while 400 let the heap grow to five times the
	// live heap, ~15 MB more RSS for no CPU or latency gain alternated runs
	// could see.
	if addr := os.Getenv("MOONJI_PPROF"); addr != "" {
		startPprof(addr, log)
	}
	srv, err := web.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	if *path != "" {
		srv.UseConfigFile(*path, raw)
	}
	ln, err := srv.Listen("")
	if err != nil {
		srv.Shutdown(time.Second)
		return err
	}
	models := make([]string, 0, len(cfg.Models))
	for _, m := range cfg.Models {
		models = append(models, m.Name)
	}
	log.Info("moonji is listening", "url", cfg.PublicURL, "addr", ln.Addr().String(), "models", models)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	// SIGHUP reloads the configuration file (web.Server.Reload): a bad
	// file changes nothing, and the log says why.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case err = <-errc:
		case <-ctx.Done():
			log.Info("shutting down")
		case <-hup:
			log.Info("SIGHUP: reloading the configuration", "path", *path)
			_, _ = srv.Reload(ctx, reload.By{Actor: "system"}) // logged, counted and audited there
			continue
		}
		break
	}
	srv.Shutdown(15 * time.Second)
	return err
}

// startPprof serves Go's profiler on addr (MOONJI_PPROF, e.g.
// 127.0.0.1:6060), for finding where a busy gateway spends its time. Only a
// loopback address is accepted: profiles reveal internals.
func startPprof(addr string, log *slog.Logger) {
	if !config.IsLoopback(addr) {
		log.Warn("MOONJI_PPROF ignored: not a loopback address", "addr", addr)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	go func() {
		if err := http.ListenAndServe(addr, mux); err != nil {
			log.Warn("pprof server stopped", "err", err)
		}
	}()
	log.Info("profiler listening", "addr", addr)
}

func cmdMockLLM(ctx context.Context, args []string, stdout io.Writer) error {
	return mockllm.Run(ctx, args, stdout)
}

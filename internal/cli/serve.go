package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"moonji/internal/mockllm"
	"moonji/web"
)

func cmdServe(ctx context.Context, args []string, stderr io.Writer) error {
	fs, path := newFlagSet("serve")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: serve takes no arguments", ErrUsage)
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	web.TuneRuntime()
	srv, err := web.New(ctx, cfg, log)
	if err != nil {
		return err
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
	select {
	case err = <-errc:
	case <-ctx.Done():
		log.Info("shutting down")
	}
	srv.Shutdown(15 * time.Second)
	return err
}

func cmdMockLLM(ctx context.Context, args []string, stdout io.Writer) error {
	return mockllm.Run(ctx, args, stdout)
}

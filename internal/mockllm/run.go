package mockllm

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// shutdownGrace bounds how long Run waits for in-flight responses to end.
// Handlers see the cancelled context at once, so this is rarely reached.
const shutdownGrace = 5 * time.Second

// Run is the "moonji mockllm" subcommand: it parses args, serves the mock on
// --listen and returns when ctx is done (after a graceful shutdown) or when
// serving fails. Logs and flag usage go to stdout.
func Run(ctx context.Context, args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("mockllm", flag.ContinueOnError)
	fset.SetOutput(stdout)
	listen := fset.String("listen", "127.0.0.1:8000", "address to listen on")
	tps := fset.Float64("tps", 0, "tokens per second between content chunks (0 = as fast as possible)")
	ttft := fset.Duration("ttft", 0, "delay before the first token, e.g. 300ms")
	tokens := fset.Int("tokens", 16, "completion length when the request sets no max_tokens")
	models := fset.String("models", "mock", "comma-separated list of served model ids")
	replayDir := fset.String("replay-dir", "", "directory of recorded responses for the mock.replay knob")
	apiList := fset.String("apis", "", "comma-separated APIs to serve among chat, completions, embeddings, responses (empty = all)")
	embeddingDims := fset.Int("embedding-dims", defaultEmbeddingDims, "length of the vectors /v1/embeddings returns by default")
	if err := fset.Parse(args); err != nil {
		return fmt.Errorf("mockllm: parsing flags: %w", err)
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("mockllm: unexpected arguments %q", fset.Args())
	}
	apis, err := ParseAPIs(*apiList)
	if err != nil {
		return fmt.Errorf("mockllm: --apis: %w", err)
	}
	var ids []string
	for m := range strings.SplitSeq(*models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			ids = append(ids, m)
		}
	}

	logger := slog.New(slog.NewTextHandler(stdout, nil))
	srv := New(Options{
		Models:          ids,
		TokensPerSecond: *tps,
		TTFT:            *ttft,
		Tokens:          *tokens,
		ReplayDir:       *replayDir,
		APIs:            apis,
		EmbeddingDims:   *embeddingDims,
		Logger:          logger,
		// A long-running mock must not keep every request body forever.
		MaxRecords: 1000,
	})

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", *listen)
	if err != nil {
		return fmt.Errorf("mockllm: listening on %s: %w", *listen, err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		// Request contexts derive from ctx so that hanging and streaming
		// handlers stop when the command is told to stop; otherwise a "hang"
		// request would hold Shutdown until its grace period ran out.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	logger.Info("mockllm listening", "addr", "http://"+ln.Addr().String(), "models", strings.Join(srv.opts.Models, ","),
		"apis", *apiList, "tps", *tps, "ttft", *ttft, "tokens", srv.opts.Tokens, "replay_dir", *replayDir)

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("mockllm: serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	logger.Info("mockllm shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("mockllm: shutting down: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("mockllm: serving: %w", err)
	}
	return nil
}

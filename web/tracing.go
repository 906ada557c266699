package web

import (
	"context"
	"time"

	"moonji/internal/config"
	"moonji/internal/tracing"
)

// startTracing starts the OTLP exporter when the configuration sets one
// (nil otherwise: tracing off). Its spans are flushed at shutdown, after
// the chat has ended its replies (closers run in reverse) and before the
// ledger and database close.
func (s *Server) startTracing(ctx context.Context, cfg *config.Config) (*tracing.Tracer, error) {
	if !cfg.Tracing.Enabled() {
		return nil, nil
	}
	t, err := tracing.New(ctx, tracing.Options{Endpoint: cfg.Tracing.OTLPEndpoint, Ratio: cfg.Tracing.Ratio(),
		Replica: cfg.ReplicaID, Log: s.log.With("component", "tracing")})
	if err != nil {
		return nil, err
	}
	s.Tracer = t
	s.closers = append(s.closers, func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(fctx); err != nil {
			s.log.Warn("flush traces at shutdown", "err", err)
		}
	})
	s.log.Info("tracing on: spans exported over OTLP/HTTP", "endpoint", cfg.Tracing.OTLPEndpoint, "sample_ratio", cfg.Tracing.Ratio())
	return t, nil
}

package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/proxy"
)

// ModelsFromConfig maps a configuration's models to their upstreams, the
// way `moonji serve` does: an openai backend is called at its url, a builtin
// one is the demo engine (internal/mockllm) served in-process on a loopback
// port of its own. stop shuts the builtin engines down; call it after the
// Server's Shutdown.
func ModelsFromConfig(cfg *config.Config, log *slog.Logger) (models []Model, stop func(), err error) {
	var servers []*http.Server
	stop = func() {
		for _, srv := range servers {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = srv.Shutdown(ctx)
			cancel()
		}
	}
	upstreams := map[string]proxy.Upstream{}
	timeouts := map[string]time.Duration{}
	for _, b := range cfg.Backends {
		up := proxy.Upstream{Name: b.Name, BaseURL: b.URL, APIKey: b.APIKey}
		if b.CAFile != "" {
			if up.RootCAs, err = proxy.LoadCAFile(b.CAFile); err != nil {
				stop()
				return nil, nil, fmt.Errorf("backend %s: %w", b.Name, err)
			}
		}
		if b.Kind == config.KindBuiltin {
			srv, url, err := startBuiltin(cfg, b, log)
			if err != nil {
				stop()
				return nil, nil, err
			}
			servers = append(servers, srv)
			up.BaseURL = url
		}
		upstreams[b.Name], timeouts[b.Name] = up, b.Timeout
	}
	for _, m := range cfg.Models {
		if len(m.Backends) > 1 {
			// Spreading over several backends is the gateway's job: run
			// one engine per backend and list them in the gateway's file.
			stop()
			return nil, nil, fmt.Errorf("model %s: moonji engine serves a model from one backend; run one engine per backend and list the engines in the gateway's backends", m.Name)
		}
		up, ok := upstreams[m.BackendNames()[0]]
		if !ok {
			stop()
			return nil, nil, fmt.Errorf("model %s: unknown backend %q", m.Name, m.BackendNames()[0])
		}
		models = append(models, Model{Name: m.Name, UpstreamModel: m.UpstreamModel, Upstream: up, Timeout: timeouts[up.Name]})
	}
	return models, stop, nil
}

// startBuiltin serves the demo engine for backend b on a loopback port. It
// mirrors web's startBuiltin (the gateway's own in-process engine), so a
// builtin model answers the same through either (both use mockllm.ServeDemo).
func startBuiltin(cfg *config.Config, b config.Backend, log *slog.Logger) (*http.Server, string, error) {
	srv, url, err := mockllm.ServeDemo(cfg.ServedBy(b.Name), b.TokensPerSecond, log.With("backend", b.Name))
	if err != nil {
		return nil, "", fmt.Errorf("start builtin backend %s: %w", b.Name, err)
	}
	return srv, url, nil
}

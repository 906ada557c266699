package web

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"moonji/internal/admission"
	"moonji/internal/config"
	"moonji/internal/enginelink"
	"moonji/internal/gateway"
	"moonji/internal/health"
	"moonji/internal/lease"
	"moonji/internal/mockllm"
	"moonji/internal/proxy"
)

// startBackends creates each backend with its health check and starts the
// in-process engines of builtin backends.
func (s *Server) startBackends(cfg *config.Config) (map[string]*gateway.Backend, error) {
	out := map[string]*gateway.Backend{}
	s.Health = map[string]*health.Checker{}
	s.engines = map[string]*engine{}
	for _, b := range cfg.Backends {
		e, err := s.newEngine(cfg, b)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, e.close)
		s.addEngineLocked(b.Name, e)
		out[b.Name] = e.gb
	}
	if len(s.links) > 0 {
		s.watchLinks.Do(func() { s.Metrics.WatchEngineLinks(s.engineLinkStats) })
	}
	return out, nil
}

// engine is one configured backend's running parts: the gateway's view of
// it and what must be closed when it goes (its health check, an engine
// backend's link, a builtin backend's in-process engine).
type engine struct {
	cfg     config.Backend
	served  []string // the models a builtin engine answers to
	gb      *gateway.Backend
	checker *health.Checker
	link    *enginelink.Link
	closers []func()
}

// close stops the engine's parts; it may run more than once.
func (e *engine) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// addEngineLocked makes e the running engine of name (s.stateMu held, or
// the server not serving yet).
func (s *Server) addEngineLocked(name string, e *engine) {
	s.engines[name] = e
	s.Health[name] = e.checker
	if e.link != nil {
		s.links = append(s.links, e.link)
	}
}

// probeClient is the health probes' client: a probe must not wait behind,
// or hold, the connections that carry requests.
var probeClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}}

// newEngine creates backend b's parts: its health check, and its link or
// in-process engine, started.
func (s *Server) newEngine(cfg *config.Config, b config.Backend) (*engine, error) {
	e := &engine{cfg: b, served: cfg.ServedBy(b.Name)}
	gb := &gateway.Backend{Name: b.Name, Kind: b.Kind,
		Upstream: proxy.Upstream{Name: b.Name, BaseURL: b.URL, APIKey: b.APIKey}}
	probes := probeClient
	if b.CAFile != "" {
		// A private CA signed the engine's certificate: its requests
		// and its probes trust that CA alone.
		roots, err := proxy.LoadCAFile(b.CAFile)
		if err != nil {
			return nil, fmt.Errorf("backend %s: %w", b.Name, err)
		}
		gb.Upstream.RootCAs = roots
		probes = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute,
			TLSClientConfig: &tls.Config{RootCAs: roots}}}
	}
	var probe func(context.Context) error
	switch b.Kind {
	case config.KindBuiltin:
		srv, url, err := mockllm.ServeDemo(e.served, b.TokensPerSecond, s.log.With("backend", b.Name))
		if err != nil {
			return nil, fmt.Errorf("start builtin backend %s: %w", b.Name, err)
		}
		// Shutdown waits for the requests it serves: a stream that started
		// on it before a reload removed it finishes.
		e.closers = append(e.closers, func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = srv.Shutdown(ctx)
			cancel()
		})
		gb.Upstream.BaseURL = url
	case config.KindEngine:
		// One link per engine backend per replica; it dials in the
		// background, so a replica starts whether the engine is up or not.
		link := enginelink.New(enginelink.Options{Name: b.Name, URL: b.URL, Token: b.APIKey,
			QueueSize: b.Link.QueueSize, MessageTTL: b.Link.MessageTTL, PingInterval: b.Link.PingInterval,
			Log: s.log.With("component", "enginelink")})
		link.Start()
		e.closers = append(e.closers, link.Close)
		e.link = link
		gb.Link = link
		// The link's own heartbeat knows whether the engine is there.
		probe = func(context.Context) error {
			if link.Stats().Connected != 1 {
				return errors.New("engine not connected")
			}
			return nil
		}
	default:
		probe = health.HTTPProbe(probes, b.URL, b.APIKey)
	}
	name := b.Name
	s.Metrics.BackendUp.WithLabelValues(name).Set(1)
	checker := health.New(name, health.Options{
		Backoff: cfg.Health.Backoff, MaxBackoff: cfg.Health.MaxBackoff, ProbeTimeout: cfg.Health.ProbeTimeout,
		Probe: probe, Log: s.log.With("component", "health"),
		OnChange: func(up bool) {
			v := 0.0
			if up {
				v = 1
				// Its free slots go to the requests waiting for them.
				if s.Scheduler != nil {
					s.Scheduler.Wake()
				}
			}
			s.Metrics.BackendUp.WithLabelValues(name).Set(v)
		},
	})
	e.closers = append(e.closers, checker.Close)
	e.checker = checker
	gb.Health = checker
	e.gb = gb
	return e, nil
}

// startAdmission builds the scheduler — one pool per set of backends that
// serve a model, so that models served by the same backends share one queue
// — and, with Redis, the leases that make each max_concurrency hold across
// replicas. It returns the routes.
func (s *Server) startAdmission(cfg *config.Config, backends map[string]*gateway.Backend) ([]*gateway.Route, error) {
	c := admissionSpecs(cfg, s.Health)
	c.OnChange = func(backend string, inFlight, queued int) {
		b := s.Metrics.Backend(backend)
		b.InFlight.Set(float64(inFlight))
		b.Queued.Set(float64(queued))
	}
	c.Log = s.log.With("component", "admission")
	if s.Redis != nil && !cfg.LocalConcurrency {
		s.Leases = lease.New(s.Redis, lease.Options{Prefix: cfg.RedisPrefix, Replica: leaseReplica(cfg.ReplicaID), TTL: cfg.LeaseTTL,
			Log: s.log.With("component", "lease"),
			OnReleased: func(string) {
				if s.Scheduler != nil {
					s.Scheduler.Wake()
				}
			}})
		c.Shared = sharedLimit{s.Leases, s}
		c.OnDegraded = func(degraded bool) {
			v := 0.0
			if degraded {
				v = 1
			}
			s.Metrics.SharedDegraded.Set(v)
		}
		s.log.Info("each backend's max_concurrency holds across replicas (slots leased in Redis)", "lease_ttl", cfg.LeaseTTL)
	} else if s.Redis != nil {
		s.log.Info("each backend's max_concurrency holds per replica (local_concurrency is set)")
	} else {
		s.log.Info("each backend's max_concurrency holds per replica: set redis_url to share it across replicas")
	}
	sched, err := admission.New(c)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	s.Scheduler = sched
	if s.Leases != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := s.Leases.Start(ctx)
		cancel()
		if err != nil {
			s.log.Warn("Redis does not answer yet: concurrency limits are shared out per replica until it does", "err", err)
		}
		// Closed after the scheduler (closers run in reverse): the store
		// gives back the slots still held.
		s.closers = append(s.closers, func() {
			if err := s.Leases.Close(); err != nil {
				s.log.Warn("release the slots held in Redis", "err", err)
			}
		})
	}
	sched.Start()
	s.closers = append(s.closers, sched.Close)
	return routesFor(cfg, backends, sched), nil
}

// admissionSpecs are cfg's backends and pools for the scheduler: one pool
// per set of backends that serve a model.
func admissionSpecs(cfg *config.Config, checkers map[string]*health.Checker) admission.Config {
	var c admission.Config
	for _, b := range cfg.Backends {
		c.Backends = append(c.Backends, admission.BackendSpec{Name: b.Name, MaxConcurrency: b.MaxConcurrency,
			Weight: b.Weight, Up: checkers[b.Name].Up})
	}
	byName := map[string]config.Backend{}
	for _, b := range cfg.Backends {
		byName[b.Name] = b
	}
	pools := map[string]bool{}
	for _, m := range cfg.Models {
		names := m.BackendNames()
		pool := admission.PoolName(names)
		if pools[pool] {
			continue
		}
		pools[pool] = true
		// The queue of several backends holds what theirs would together
		// and waits as long as the most patient of them.
		ps := admission.PoolSpec{Name: pool, Backends: names}
		for _, n := range names {
			ps.MaxQueue += byName[n].MaxQueue
			ps.QueueTimeout = max(ps.QueueTimeout, byName[n].QueueTimeout)
		}
		c.Pools = append(c.Pools, ps)
	}
	return c
}

// routesFor maps cfg's models to their backends and the scheduler's pools.
func routesFor(cfg *config.Config, backends map[string]*gateway.Backend, sched *admission.Scheduler) []*gateway.Route {
	byName := map[string]config.Backend{}
	for _, b := range cfg.Backends {
		byName[b.Name] = b
	}
	var routes []*gateway.Route
	for _, m := range cfg.Models {
		r := &gateway.Route{Model: m.Name, UpstreamModel: m.UpstreamModel, Pool: sched.Pool(admission.PoolName(m.BackendNames())),
			Price: m.PriceOf(), ReserveOutput: cmp.Or(m.MaxOutputTokens, config.DefaultMaxOutputTokens), Vision: m.Vision}
		if m.Price != nil {
			r.MaxOutput = m.MaxOutputTokens
		}
		// Validation made every backend of a model serve the same APIs.
		for _, name := range byName[m.BackendNames()[0]].APIs {
			if api, ok := proxy.ParseAPI(name); ok {
				r.APIs = r.APIs.With(api)
			}
		}
		none := false
		for _, n := range m.BackendNames() {
			r.Backends = append(r.Backends, backends[n])
			// A request may take as long as its most patient backend
			// allows; no timeout on any of them means none.
			t := byName[n].Timeout
			none = none || t == 0
			r.Timeout = max(r.Timeout, t)
		}
		if none {
			r.Timeout = 0
		}
		routes = append(routes, r)
	}
	return routes
}

// sharedLimit is the lease store as the scheduler's Shared limit; Ping
// asks Redis itself.
type sharedLimit struct {
	*lease.Store
	s *Server
}

func (l sharedLimit) Ping(ctx context.Context) error { return l.s.Redis.Ping(ctx).Err() }

// leaseReplica is the replica id in the form the lease store's member names
// allow (no '/' or '|'; the default id is host/listen), escaped so that two
// ids never map to one.
func leaseReplica(id string) string {
	return strings.NewReplacer("%", "%25", "/", "%2F", "|", "%7C").Replace(id)
}

package web

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"moonji/internal/audit"
	"moonji/internal/config"
	"moonji/internal/gateway"
	"moonji/internal/health"
	"moonji/internal/ratelimit"
	"moonji/internal/reload"
	"moonji/models"
)

// Configuration reload: the file is read again and what the running gateway
// applies — backends, models (their backends, prices, output limits),
// the backends' concurrency and queue limits, the default per-key rate
// limits — swapped in whole, or nothing at all when the file is bad. A
// request keeps the route (and so the backend) it started with: the
// engines a reload replaced are closed once no request holds them.

// reloadState is the server's part of reloads.
type reloadState struct {
	// path is the configuration file ("" when the server was built from a
	// configuration in code and no file was given: nothing to re-read).
	path    string
	live    atomic.Pointer[config.Config]
	version atomic.Pointer[reload.Version]
	// recorded is the version id last written to this replica's row.
	recorded atomic.Pointer[string]
	audit    *audit.Log
	total    *prometheus.CounterVec

	mu sync.Mutex // one reload at a time; guards what follows
	// routes are the gateway's current routes; old the routes a reload
	// replaced that requests may still hold; retired the engines it
	// replaced, closed once no old route that reaches them is held.
	routes  []*gateway.Route
	old     []*gateway.Route
	retired []*engine
	created []*engine // every engine a reload started, closed at shutdown
	janitor bool
}

// initReloads sets the reload state up once the server is assembled.
func (s *Server) initReloads(routes []*gateway.Route, al *audit.Log) {
	r := &s.reloads
	r.live.Store(s.Config)
	// Built in code (tests, embedding): the version is that of the
	// configuration written out, until UseConfigFile names the file.
	raw, _ := yaml.Marshal(s.Config)
	v := reload.NewVersion(raw, s.started)
	r.version.Store(&v)
	r.routes, r.audit = routes, al
	r.total = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "moonji_config_reloads_total",
		Help: "Configuration reloads by result: applied, or rejected (a bad or unreadable file; nothing changed)."},
		[]string{"result"})
	r.total.WithLabelValues("applied")
	r.total.WithLabelValues("rejected")
	s.Metrics.Registry.MustRegister(r.total)
	s.closers = append(s.closers, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, e := range r.created {
			e.close()
		}
	})
}

// UseConfigFile names the file the server's configuration was read from,
// and its bytes: a reload reads that file again, and the version is the
// file's. Call it before serving.
func (s *Server) UseConfigFile(path string, raw []byte) {
	s.reloads.path = path
	v := reload.NewVersion(raw, s.started)
	s.reloads.version.Store(&v)
	s.recordVersion(context.Background())
}

// ConfigVersion is the version of the configuration this replica runs.
func (s *Server) ConfigVersion() reload.Version { return *s.reloads.version.Load() }

// LiveConfig is the configuration this replica runs: the one it started
// with, or the last one a reload applied. Never changed; do not change it.
func (s *Server) LiveConfig() *config.Config { return s.reloads.live.Load() }

// Reload reads the configuration file again and applies it (see the top of
// this file). A file that cannot be read, parsed or validated, or whose
// backends cannot be started, changes nothing: the error says why. Settings
// that only a restart changes are left as they run and named in the result
// (Changes.Restart). Every reload is logged, counted and audited.
func (s *Server) Reload(ctx context.Context, by reload.By) (reload.Result, error) {
	r := &s.reloads
	r.mu.Lock()
	defer r.mu.Unlock()
	res := reload.Result{Old: s.ConfigVersion()}
	res.New = res.Old
	res, err := s.reloadLocked(res)
	if err != nil {
		r.total.WithLabelValues("rejected").Inc()
		s.log.Error("configuration reload refused: nothing changed", "path", r.path, "by", by.Actor, "err", err)
		r.audit.Record(ctx, audit.Event{Action: audit.ConfigRejected, Actor: by.Actor, ActorID: by.ActorID,
			Target: r.path, Address: by.Address, Detail: "version " + res.Old.ID + " kept: " + err.Error()})
		return res, err
	}
	r.total.WithLabelValues("applied").Inc()
	summary := res.Changes.Summary()
	s.log.Info("configuration reloaded", "path", r.path, "by", by.Actor, "old_version", res.Old.ID,
		"version", res.New.ID, "changes", summary)
	if len(res.Changes.Restart) > 0 {
		s.log.Warn("configuration reload: these settings changed but apply only after a restart",
			"settings", res.Changes.Restart)
	}
	r.audit.Record(ctx, audit.Event{Action: audit.ConfigReload, Actor: by.Actor, ActorID: by.ActorID,
		Target: r.path, Address: by.Address, Detail: res.Old.ID + " → " + res.New.ID + ": " + summary})
	s.recordVersion(ctx)
	return res, nil
}

func (s *Server) reloadLocked(res reload.Result) (reload.Result, error) {
	r := &s.reloads
	if r.path == "" {
		return res, errors.New("the gateway was started without a configuration file: there is nothing to read again")
	}
	raw, err := os.ReadFile(r.path)
	if err != nil {
		return res, fmt.Errorf("read the configuration: %w", err)
	}
	cfg, err := config.Parse(raw, r.path)
	if err != nil {
		return res, err
	}
	old := r.live.Load()
	res.Changes = reload.Compare(old, cfg)

	// The engines: one that is reached the same way stays (its
	// connections, its health), with its new limits; another starts.
	s.stateMu.Lock()
	running := s.engines
	s.stateMu.Unlock()
	engines := map[string]*engine{}
	var started []*engine
	abandon := func() {
		for _, e := range started {
			e.close()
		}
	}
	for _, b := range cfg.Backends {
		if e := running[b.Name]; e != nil && reload.SameEngine(e.cfg, b) &&
			(b.Kind != config.KindBuiltin || slices.Equal(e.served, cfg.ServedBy(b.Name))) {
			engines[b.Name] = e
			continue
		}
		e, err := s.newEngine(cfg, b)
		if err != nil {
			abandon()
			return res, err
		}
		started = append(started, e)
		engines[b.Name] = e
	}
	checkers := map[string]*health.Checker{}
	backends := map[string]*gateway.Backend{}
	var list []*gateway.Backend
	for _, b := range cfg.Backends {
		checkers[b.Name], backends[b.Name] = engines[b.Name].checker, engines[b.Name].gb
		list = append(list, engines[b.Name].gb)
	}
	if err := s.Scheduler.Update(admissionSpecs(cfg, checkers)); err != nil {
		abandon()
		return res, err
	}
	// From here nothing fails: the new table goes in whole.
	routes := routesFor(cfg, backends, s.Scheduler)
	s.Gateway.Reconfigure(routes, list, ratelimit.Limit{RequestsPerMinute: cfg.RateLimit.RequestsPerMinute,
		TokensPerMinute: cfg.RateLimit.TokensPerMinute})
	for _, b := range cfg.Backends {
		engines[b.Name].cfg = b // the limits, for the next comparison
	}
	s.stateMu.Lock()
	s.engines, s.Health, s.links = map[string]*engine{}, map[string]*health.Checker{}, nil
	for name, e := range engines {
		s.addEngineLocked(name, e)
	}
	hasLinks := len(s.links) > 0
	s.stateMu.Unlock()
	if hasLinks {
		s.watchLinks.Do(func() { s.Metrics.WatchEngineLinks(s.engineLinkStats) })
	}
	for name, e := range running {
		if engines[name] != e {
			r.retired = append(r.retired, e)
		}
	}
	r.created = append(r.created, started...)
	r.old = append(r.old, r.routes...)
	r.routes = routes
	if len(r.retired) > 0 && !r.janitor {
		r.janitor = true
		go s.closeRetired()
	}
	v := reload.NewVersion(raw, time.Now())
	r.version.Store(&v)
	r.live.Store(cfg)
	res.New = v
	return res, nil
}

// closeRetiredEvery is how often the engines a reload replaced are checked
// for requests still on them.
const closeRetiredEvery = 500 * time.Millisecond

// closeRetired closes each engine a reload replaced once no request holds
// a route that reaches it, and returns when none is left (or the server
// stops: shutdown closes them).
func (s *Server) closeRetired() {
	t := time.NewTicker(closeRetiredEvery)
	defer t.Stop()
	for {
		select {
		case <-s.bg:
			return
		case <-t.C:
		}
		if s.closeIdleRetired() {
			return
		}
	}
}

// closeIdleRetired closes the retired engines no held route reaches and
// tells whether none is left. A route is read after its table was
// replaced: one that reads 0 then can take no request again
// (gateway.Gateway.Reconfigure).
func (s *Server) closeIdleRetired() (done bool) {
	r := &s.reloads
	r.mu.Lock()
	defer r.mu.Unlock()
	held := r.old[:0]
	for _, rt := range r.old {
		if rt.InUse() > 0 {
			held = append(held, rt)
		}
	}
	clear(r.old[len(held):])
	r.old = held
	busy := map[*gateway.Backend]bool{}
	for _, rt := range held {
		for _, b := range rt.Backends {
			busy[b] = true
		}
	}
	kept := r.retired[:0]
	for _, e := range r.retired {
		if busy[e.gb] {
			kept = append(kept, e)
			continue
		}
		s.log.Info("backend replaced by a reload closed: no request holds it any more", "backend", e.gb.Name)
		e.close()
	}
	clear(r.retired[len(kept):])
	r.retired = kept
	if len(kept) == 0 {
		r.janitor = false
		return true
	}
	return false
}

// recordVersion writes this replica's configuration version to its row, so
// that /admin on any replica shows every replica's; while the database is
// away the heartbeat tries again.
func (s *Server) recordVersion(ctx context.Context) {
	v := s.ConfigVersion()
	if p := s.reloads.recorded.Load(); p != nil && *p == v.ID+v.LoadedAt.String() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := models.SetReplicaConfig(ctx, s.DB, s.Config.ReplicaID, v.ID, v.LoadedAt); err != nil {
		s.log.Warn("record the configuration version", "err", err)
		return
	}
	id := v.ID + v.LoadedAt.String()
	s.reloads.recorded.Store(&id)
}

// ReplicaVersions lists the live replicas (heartbeat within replicaStale)
// with the configuration version each runs.
func (s *Server) ReplicaVersions(ctx context.Context) ([]models.Replica, error) {
	return models.LiveReplicas(ctx, s.DB, time.Now().Add(-replicaStale))
}

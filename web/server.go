// Package web assembles Moonji's server: configuration in, a Fiber app with
// its routes and middleware out, and the lifecycle (start, graceful stop) of
// everything behind it.
package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
	"gorm.io/gorm"

	"moonji/handlers"
	"moonji/internal/admission"
	"moonji/internal/apikey"
	"moonji/internal/attachment"
	"moonji/internal/audit"
	"moonji/internal/budget"
	"moonji/internal/chat"
	"moonji/internal/config"
	"moonji/internal/enginelink"
	"moonji/internal/fairshare"
	"moonji/internal/gateway"
	"moonji/internal/health"
	"moonji/internal/journal"
	"moonji/internal/lease"
	"moonji/internal/ledger"
	"moonji/internal/markdown"
	"moonji/internal/metrics"
	"moonji/internal/proxy"
	"moonji/internal/ratelimit"
	"moonji/internal/retention"
	"moonji/internal/spending"
	"moonji/internal/stop"
	"moonji/internal/tracing"
	"moonji/models"
)

// Server is one running gateway replica.
type Server struct {
	Config  *config.Config
	DB      *gorm.DB
	App     *fiber.App
	Ledger  *ledger.Ledger
	Metrics *metrics.Metrics
	// Retention deletes old usage rows and conversations (nil until New
	// has made the metrics).
	Retention *retention.Job
	Gateway   *gateway.Gateway
	Stops     *stop.Service
	Redis     *redis.Client
	// Policies and Budgets decide what each sender may use and spend.
	Policies *spending.Resolver
	Budgets  *budget.Store
	Chat     *chat.Service
	// Scheduler hands out backend slots; Leases, with Redis, makes their
	// limits hold across replicas.
	Scheduler *admission.Scheduler
	Leases    *lease.Store
	// Health is each backend's passive health, by name.
	Health map[string]*health.Checker
	// Tracer exports the requests' spans (nil: tracing off).
	Tracer *tracing.Tracer

	log  *slog.Logger
	keys *apikey.Store
	// stateMu guards what a reload changes and others read: Health,
	// engines, links, live.
	stateMu sync.Mutex
	// engines are the running backends by name; links the connections of
	// engine backends (for the metrics).
	engines    map[string]*engine
	links      []*enginelink.Link
	watchLinks sync.Once
	reloads    reloadState
	closers    []func()
	ln         net.Listener
	started    time.Time
	bg         chan struct{} // closed to stop the replica loop
	bgDone     chan struct{}
}

// Heartbeats tell siblings this replica is alive; a replica silent for
// replicaStale is taken for dead and its unfinished rows are closed.
const (
	heartbeatEvery = 10 * time.Second
	replicaStale   = 60 * time.Second
)

// pendingAfter is how long a request runs before its pending usage row is
// written: one that ends sooner is a single final insert. Its begin is in
// the journal meanwhile, so a crash does not lose it; a stop on another
// replica waits up to this long for the row to appear.
const pendingAfter = 500 * time.Millisecond

// recordLeftovers gives the requests this replica's previous life began and
// never wrote their one row (gateway_restart, or the final state the
// journal kept while the database was away), then lets the old segments go.
func (s *Server) recordLeftovers(ctx context.Context, j *journal.Journal, left []models.Usage) error {
	if len(left) == 0 {
		j.Recovered()
		return nil
	}
	n, err := models.RecordUnwritten(ctx, s.DB, left)
	if err != nil {
		return fmt.Errorf("record the %d usage rows the journal kept: %w", len(left), err)
	}
	j.Recovered()
	s.log.Warn("recorded usage rows a stopped gateway began and never wrote", "rows", n, "journaled", len(left))
	return nil
}

// prepareDatabase is what a replica does in the database before its ledger
// writes anything: the schema (when the start had to skip it), its
// heartbeat, its previous life's rows from the journal, then its previous
// life's pending rows closed — in that order, so that a row the journal
// kept final is finished with that state rather than closed.
func (s *Server) prepareDatabase(ctx context.Context, migrate bool, j *journal.Journal, left []models.Usage) error {
	if migrate {
		if err := models.Migrate(s.DB); err != nil {
			return err
		}
	}
	if err := models.Heartbeat(ctx, s.DB, s.Config.ReplicaID, s.started); err != nil {
		return err
	}
	if err := s.recordLeftovers(ctx, j, left); err != nil {
		if !models.Reachable(ctx, s.DB, 2*time.Second) {
			return err
		}
		// Not the database's absence: kept for the next start.
		s.log.Error("record the usage rows a crash left in the journal", "err", err)
	}
	s.closeOrphans(ctx, s.Config.ReplicaID)
	return nil
}

// closeOrphans closes unfinished rows of replicas that stopped sending
// heartbeats and, at start-up (restarted = this replica's id), those of
// this replica's previous life.
func (s *Server) closeOrphans(ctx context.Context, restarted string) {
	n, err := models.CloseUnfinishedUsage(ctx, s.DB, restarted, time.Now().Add(-replicaStale))
	if err != nil {
		s.log.Error("close unfinished usage rows", "err", err)
		return
	}
	if n > 0 {
		s.log.Warn("closed usage rows left unfinished by a stopped gateway", "rows", n, "reason", "gateway_restart")
	}
	n, err = models.CloseUnfinishedMessages(ctx, s.DB, restarted, time.Now().Add(-replicaStale))
	if err != nil {
		s.log.Error("close unfinished chat messages", "err", err)
		return
	}
	if n > 0 {
		s.log.Warn("closed chat replies left unfinished by a stopped gateway", "messages", n, "reason", "gateway_restart")
	}
}

// replicaLoop sends heartbeats and, now and then, closes orphaned rows.
func (s *Server) replicaLoop() {
	defer close(s.bgDone)
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	// After the database was away, every replica's heartbeat is as old as
	// the outage: orphans are closed only once the siblings have had
	// replicaStale to beat again, or their running requests' rows (and
	// this replica's own) would be closed as if they had died.
	var unreachableAt time.Time
	for i := 1; ; i++ {
		select {
		case <-s.bg:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := models.Heartbeat(ctx, s.DB, s.Config.ReplicaID, s.started); err != nil {
			s.log.Warn("replica heartbeat", "err", err)
			unreachableAt = time.Now()
		} else {
			s.recordVersion(ctx) // when the database was away at start or at a reload
		}
		if i%3 == 0 && time.Since(unreachableAt) > replicaStale {
			s.closeOrphans(ctx, "") // this replica is alive: its rows stay
			if n, err := s.Chat.Reconcile(ctx); err != nil {
				s.log.Warn("finish chat replies whose final save failed", "err", err)
			} else if n > 0 {
				s.log.Warn("finished chat replies whose final save had failed", "messages", n)
			}
		}
		if i%360 == 0 { // hourly: the hourly rollup rows nobody reads any more
			if err := models.PruneRollup(ctx, s.DB, time.Now().Add(-models.KeepHours)); err != nil {
				s.log.Warn("prune the hourly usage rollup", "err", err)
			}
		}
		cancel()
	}
}

// New builds a server from cfg: database, ledger, backends, routes. It does
// not listen yet.
func New(ctx context.Context, cfg *config.Config, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{Config: cfg, log: log}
	ok := false
	defer func() {
		if !ok {
			s.closeAll()
		}
	}()

	// A replica starts and serves while PostgreSQL is away: its rows wait
	// in the journal, known keys are served from their last look-up
	// (apikey, spending), and the ledger does the database's part of the
	// start once it answers (prepareDatabase). Any other failure stops it.
	db, err := models.OpenUnmigrated(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	s.DB = db
	s.closers = append(s.closers, func() { models.Close(db) })
	s.started = time.Now()
	migrated := true
	if err := models.Migrate(db); err != nil {
		if db.Dialector.Name() != "postgres" || models.Reachable(ctx, db, 2*time.Second) {
			return nil, err
		}
		migrated = false
	}
	j, left, err := journal.Open(cfg.JournalDir, cfg.ReplicaID, log)
	if err != nil {
		return nil, fmt.Errorf("usage journal (journal_dir %s): %w", cfg.JournalDir, err)
	}
	s.closers = append(s.closers, func() {
		if err := j.Close(); err != nil {
			log.Warn("close the usage journal", "err", err)
		}
	})
	s.Ledger = ledger.New(db, log)
	s.Ledger.UseJournal(j, pendingAfter)
	s.closers = append(s.closers, s.Ledger.Close)
	if err := s.prepareDatabase(ctx, !migrated, j, left); err != nil {
		if models.Reachable(ctx, db, 2*time.Second) {
			return nil, err
		}
		log.Error("database unreachable at start: serving; usage rows wait in the journal until it answers", "err", err)
		s.Ledger.StartDown(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return s.prepareDatabase(ctx, !migrated, j, left)
		})
	}
	s.bg, s.bgDone = make(chan struct{}), make(chan struct{})
	go s.replicaLoop()
	s.closers = append(s.closers, func() { close(s.bg); <-s.bgDone })
	s.keys = apikey.NewStore(db, log, 30*time.Second)
	s.closers = append(s.closers, s.keys.Close)

	var modelNames, backendNames []string
	for _, m := range cfg.Models {
		modelNames = append(modelNames, m.Name)
	}
	for _, b := range cfg.Backends {
		backendNames = append(backendNames, b.Name)
	}
	s.Metrics = metrics.New(append(modelNames, "unknown"), backendNames)
	s.Metrics.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "moonji_ledger_backlog",
			Help: "Usage rows the ledger holds in memory while the database is unreachable (at most ledger.MaxBacklog final rows, and the running requests' pending rows)."},
			func() float64 { return float64(s.Ledger.Status().Backlog) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "moonji_ledger_journal_only",
			Help: "Final usage rows only the journal holds while the database is unreachable: read back from it once it answers."},
			func() float64 { return float64(s.Ledger.Status().InJournal) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "moonji_database_up",
			Help: "0 while the ledger's writer cannot reach the database, 1 otherwise."},
			func() float64 {
				if s.Ledger.Status().DatabaseDown {
					return 0
				}
				return 1
			}))
	s.startRetention()

	if cfg.RedisURL != "" {
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("redis_url: %w", err)
		}
		// Short timeouts: a Redis that hangs must turn into the limiter's
		// in-memory fallback or a clear 503 on Stop quickly, not into slow
		// requests.
		opt.ContextTimeoutEnabled = true
		opt.DialTimeout = time.Second
		opt.ReadTimeout = time.Second
		opt.WriteTimeout = time.Second
		opt.MaxRetries = 1
		// One dial per attempt: go-redis otherwise dials 5 times (with
		// 100 ms between) before a command fails, so a Redis whose host
		// drops connections silently held a command 5 s per attempt.
		opt.DialerRetries = 1
		s.Redis = redis.NewClient(opt)
		s.closers = append(s.closers, func() { _ = s.Redis.Close() })
	}

	limiter := s.newLimiter()
	s.Policies = spending.NewResolver(db)
	if s.Redis != nil {
		s.Budgets = budget.NewRedis(s.Redis, cfg.RedisPrefix, spentIn{db}, log)
	} else {
		s.Budgets = budget.NewMemory(spentIn{db})
	}
	if err := s.startStops(ctx); err != nil {
		return nil, err
	}

	client := proxy.NewClient()
	backends, err := s.startBackends(cfg)
	if err != nil {
		return nil, err
	}
	routes, err := s.startAdmission(cfg, backends)
	if err != nil {
		return nil, err
	}
	auditLog := audit.New(db, log)
	var backendList []*gateway.Backend
	for _, b := range cfg.Backends {
		backendList = append(backendList, backends[b.Name])
	}
	tracer, err := s.startTracing(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s.Gateway = gateway.New(gateway.Options{
		Routes: routes, Backends: backendList, Scheduler: s.Scheduler, Client: client, Ledger: s.Ledger, Metrics: s.Metrics,
		Limiter: limiter, Limit: ratelimit.Limit{RequestsPerMinute: cfg.RateLimit.RequestsPerMinute, TokensPerMinute: cfg.RateLimit.TokensPerMinute},
		Stops: s.Stops, Replica: cfg.ReplicaID, StreamWriteTimeout: cfg.StreamWriteTimeout, Keepalive: cfg.Keepalive(), Log: log,
		Policies: s.Policies, Budgets: s.Budgets, Currency: cfg.Currency, Tracer: tracer,
	})
	s.initReloads(routes, auditLog)

	s.App = fiber.New(fiber.Config{
		AppName:               "moonji",
		DisableStartupMessage: true,
		// Bodies are streamed: fasthttp reads 8 KiB with the headers and
		// leaves the rest to the handler, which checks the caller first
		// and reads within its own limit (handlers.ReadBody). Read whole
		// before any handler, 16 key-less 31 MB requests took a gigabyte.
		// BodyLimit only bounds that read-ahead now; fasthttp answers no
		// 413 of its own.
		StreamRequestBody: true,
		BodyLimit:         int(cfg.MaxBodyBytes),
		// A multipart body would otherwise be parsed (and spooled to
		// disk) before any handler runs; no endpoint takes one.
		DisablePreParseMultipartForm: true,
		ReadTimeout:                  60 * time.Second,
		// No WriteTimeout: fasthttp would set it once per response, so it
		// would cut every long-lived answer (a chat's event stream) at that
		// age. A /v1 stream's relay sets its own deadline per frame instead.
		IdleTimeout: 120 * time.Second,
		// A connection keeps its write buffer while it is open, and an
		// open stream is one connection: 2 KiB holds a few common frames
		// (a larger write bypasses the buffer), where the default is 4.
		WriteBufferSize: 2 << 10,
		ErrorHandler:    s.errorHandler,
	})
	markUnread(s.App.Server())
	lim := cfg.Limits
	// Which models see images follows reloads (gateway.Vision).
	attachments := attachment.New(attachment.Options{DB: db, VisionOf: s.Gateway.Vision, Limiter: limiter, Log: log.With("component", "attachments"),
		Limits: attachment.Limits{MaxBytes: cfg.Attachments.MaxBytes, MaxPerMessage: cfg.Attachments.MaxPerMessage}})
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	go attachments.Run(sweepCtx)
	s.closers = append(s.closers, stopSweep)
	s.Chat = chat.New(chat.Options{Gateway: s.Gateway, DB: db, Replica: cfg.ReplicaID, Currency: cfg.Currency,
		ContextTokens: cfg.Chat.ContextTokens, Log: log.With("component", "chat"),
		Render: markdown.Render,
		Stop: func(ctx context.Context, id string) error {
			_, err := s.Stops.RequestSeen(ctx, id, -1)
			return err
		},
		Limits: chat.Limits{GenerationsPerPerson: lim.ChatGenerationsPerPerson, ConversationsPerMinute: lim.ConversationsPerMinute,
			ConversationsPerPerson: lim.ConversationsPerPerson, SearchesPerMinute: lim.SearchesPerMinute},
		Limiter: limiter, Attachments: attachments})
	// Closed before the stop service, the ledger and the database (closers
	// run in reverse): stopped replies are saved through all three.
	s.closers = append(s.closers, s.Chat.Close)
	streams := fairshare.New(lim.EventStreamsPerPerson)
	withdrawals := &fairshare.Withdrawals{Holders: []fairshare.Holder{s.Gateway, streams}, Every: apikey.DefaultCacheTTL,
		Log: log, Disabled: func(ctx context.Context, people []uint) ([]uint, error) { return models.DisabledAmong(ctx, db, people) }}
	wctx, stopWithdrawals := context.WithCancel(context.Background())
	go withdrawals.Run(wctx)
	s.closers = append(s.closers, stopWithdrawals)
	h := &handlers.Handler{DB: db, Gateway: s.Gateway, APIKeys: s.keys, Log: log, Audit: auditLog, Reloader: s, Chat: s.Chat, Attachments: attachments, Currency: s.Config.Currency,
		Policies: s.Policies, Budgets: s.Budgets,
		Stopper: &gateway.Stopper{DB: db, Stops: s.Stops, Metrics: s.Metrics, Running: s.Ledger.Running,
			RowWait: pendingAfter + time.Second}, StreamWriteTimeout: cfg.StreamWriteTimeout, Keepalive: cfg.Keepalive(),
		Streams: streams, Withdrawals: withdrawals}
	s.routes(h)
	if err := s.setupAuth(ctx, h); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

func (s *Server) newLimiter() *ratelimit.Limiter {
	o := ratelimit.Options{
		Prefix: s.Config.RedisPrefix + "rl:",
		Logger: s.log,
		OnDegraded: func(degraded bool) {
			v := 0.0
			if degraded {
				v = 1
			}
			s.Metrics.RateLimitDegrad.Set(v)
		},
	}
	if s.Redis != nil {
		o.Redis = s.Redis
	}
	l := ratelimit.New(o)
	s.closers = append(s.closers, l.Close)
	return l
}

func (s *Server) startStops(ctx context.Context) error {
	holder := stop.NewHolder(s.Config.Stop.TTL)
	var bus stop.Bus = stop.NewLocalBus()
	if s.Redis != nil {
		bus = stop.NewRedisBus(s.Redis, stop.RedisOptions{Prefix: s.Config.RedisPrefix, KeyTTL: s.Config.Stop.TTL,
			PingInterval: s.Config.Stop.PingInterval, Logger: s.log})
	}
	s.Stops = stop.NewService(holder, bus, stop.Options{AckTimeout: s.Config.Stop.AckTimeout, Logger: s.log})
	s.closers = append(s.closers, s.Stops.Close, holder.Close)
	// A replica must come up even while Redis is away: it then serves with
	// per-replica limits and local stops, and the bus keeps retrying.
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.Stops.Start(startCtx); err != nil {
		s.log.Warn("stop bus not subscribed yet; stops from other replicas will work once Redis answers", "err", err)
	}
	return nil
}

// engineLinkStats is the engine backends' links for the metrics.
func (s *Server) engineLinkStats() []metrics.EngineLink {
	s.stateMu.Lock()
	links := s.links
	s.stateMu.Unlock()
	out := make([]metrics.EngineLink, len(links))
	for i, l := range links {
		st := l.Stats()
		out[i] = metrics.EngineLink{Backend: l.Name(), Connected: st.Connected == 1, SessionsOpen: st.SessionsOpen,
			Queued: st.Queued, Reconnects: st.Reconnects, Dropped: map[string]int64{
				"unknown_session": st.DroppedUnknownSession, "expired": st.DroppedExpired, "queue_full": st.DroppedQueueFull,
				"invalid": st.DroppedInvalid, "slow_reader": st.DroppedSlowReader,
			}}
	}
	return out
}

// Listen opens the configured address (or addr, when not empty).
func (s *Server) Listen(addr string) (net.Listener, error) {
	if addr == "" {
		addr = s.Config.Listen
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	s.ln = ln
	return ln, nil
}

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.App.Listener(ln); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// Shutdown stops accepting requests, lets running ones finish for up to
// timeout, then flushes the ledger and closes everything.
func (s *Server) Shutdown(timeout time.Duration) {
	if s.App != nil {
		if err := s.App.ShutdownWithTimeout(timeout); err != nil {
			s.log.Warn("shutdown", "err", err)
		}
	}
	if s.Chat != nil {
		// Before the builtin engines go: a reply they serve is stopped and
		// saved, not cut off as an error.
		s.Chat.Close()
	}
	s.closeAll()
}

func (s *Server) closeAll() {
	// Close in reverse order of creation: the ledger flushes before the
	// database closes.
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// errorHandler answers errors that escape handlers, and those fasthttp
// raises before any handler runs (headers too large: 431, unreadable
// request: 400, read timeout: 408), which Fiber passes here: OpenAI's format
// and a request id under /v1, plain text elsewhere. Such an answer leaves no
// usage row: no key was checked. A wrong method or path (405, 404) never
// reaches a handler, a body too large for any endpoint but the chat one is
// refused before its handler (413, smallBodies), and fasthttp's refusals
// come before any route; the chat endpoint writes its own refusals, with
// their rows.
func (s *Server) errorHandler(c *fiber.Ctx, err error) error {
	status := fiber.StatusInternalServerError
	var fe *fiber.Error
	if errors.As(err, &fe) {
		status = fe.Code
	}
	if status >= 500 {
		s.log.Error("request failed", "path", c.Path(), "err", err)
	}
	msg := err.Error()
	if status >= 500 {
		msg = "internal error"
	}
	if !openAIShaped(c) {
		return c.Status(status).SendString(msg)
	}
	if c.GetRespHeader("X-Inference-Id") == "" {
		handlers.SetRequestID(c, gateway.NewInferenceID())
	}
	typ, code := "invalid_request_error", ""
	switch {
	case status >= 500:
		typ = "server_error"
	case status == fiber.StatusRequestEntityTooLarge:
		code = "request_too_large"
	case status == fiber.StatusRequestHeaderFieldsTooLarge:
		code = "request_headers_too_large"
	case status == fiber.StatusMethodNotAllowed:
		code = "method_not_allowed"
	case status == fiber.StatusNotFound:
		code = "not_found"
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(status).Send(gateway.ErrorBody(msg, typ, code))
}

// unreadRequest marks (in the fasthttp context's user values) an error
// fasthttp raised while reading a request, before any route.
const unreadRequest = "moonji.unread_request"

// markUnread wraps the fasthttp server's error handler (Fiber's, which maps
// fasthttp's errors and calls errorHandler) to mark such errors.
func markUnread(srv *fasthttp.Server) {
	fiberHandler := srv.ErrorHandler
	srv.ErrorHandler = func(ctx *fasthttp.RequestCtx, err error) {
		ctx.SetUserValue(unreadRequest, true)
		fiberHandler(ctx, err)
	}
}

// onV1 reports whether c is a request to /v1 (Fiber matches paths without
// regard to case). A request fasthttp could not read has no path (its
// headers are reset: it reads as GET /); it may well have been one, and
// takes /v1's answer, which any client can read.
func openAIShaped(c *fiber.Ctx) bool {
	if c.Context().UserValue(unreadRequest) != nil {
		return true
	}
	p := c.Path()
	if len(p) >= 8 && strings.EqualFold(p[:8], "/api/v1/") {
		return true // the JSON API (chat, stop) answers in OpenAI's shape too
	}
	return len(p) >= 3 && strings.EqualFold(p[:3], "/v1") && (len(p) == 3 || p[3] == '/')
}

// spentIn reads what a budget's scope spent from the database's rollups.
type spentIn struct{ db *gorm.DB }

func (s spentIn) Spent(ctx context.Context, l budget.Limit, since time.Time) (int64, error) {
	return models.SpentSince(ctx, s.db, string(l.Scope), l.ID, since)
}

// retentionDelay is how long after start the retention job first runs (0:
// its default, a minute); tests shorten it (SetRetentionDelay).
var retentionDelay time.Duration

// startRetention starts this replica's retention job (internal/retention)
// when the configuration keeps usage or conversations for a limited time.
// The audit log is pruned at the usage age.
func (s *Server) startRetention() {
	cfg := s.Config.Retention
	s.Retention = &retention.Job{DB: s.DB, Usage: cfg.Usage.Duration(), Conversations: cfg.Conversations.Duration(),
		Share: cfg.Share, Delay: retentionDelay, Deleted: s.Metrics.RetentionDeleted, Log: s.log.With("job", "retention"),
		// The audit log is kept as long as the usage it sits beside.
		WithUsage: []retention.Table{{Name: "audit", Prune: models.DeleteAuditEventsBefore}}}
	if !s.Retention.Enabled() {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Retention.Run(ctx)
	}()
	s.closers = append(s.closers, func() { cancel(); <-done })
}

//go:build bench

package web_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/engine"
	"moonji/internal/metrics"
	"moonji/internal/mockllm"
	"moonji/internal/proxy"
	"moonji/models"
)

// TestEngineBench is issue 11's benchmark: what an `engine` backend (the
// gateway → one WebSocket → `moonji engine` → its upstream) costs against an
// `openai` backend (the gateway → HTTP → the upstream), and what 1,000
// sessions on one connection take. It is a measurement, so it runs only when
// asked:
//
//	MOONJI_BENCH_ENGINE=1 go test ./web -run '^TestEngineBench$' -count=1 -v -timeout 30m
//	# knobs: MOONJI_BENCH_ENGINE_ROUNDS (4: ABBA rounds of the latency part),
//	# MOONJI_BENCH_ENGINE_STREAMS (75 streams per side per round), MOONJI_BENCH_ENGINE_CHUNKS (20),
//	# MOONJI_BENCH_ENGINE_TPS (200: their pace), MOONJI_BENCH_ENGINE_WHOLE (300 non-streamed
//	# requests per side per round), MOONJI_BENCH_ENGINE_DIRECT (1; 0 leaves the direct column out),
//	# MOONJI_BENCH_ENGINE_SESSIONS (1000 concurrent streams), MOONJI_BENCH_ENGINE_SESSION_TPS (3),
//	# MOONJI_BENCH_ENGINE_SESSION_SECONDS (20: the length of each of those streams),
//	# MOONJI_BENCH_ENGINE_PROFILE (a directory: G1, G2 and E write CPU profiles of the 6 s
//	# CPU window of the sessions part there, e.g. go tool pprof -top DIR/G2-sessions.cpu)
//
// Processes. This one (the coordinator) runs the mock engine (one, for
// everything) and the clients. Three more are this test binary again
// (TestEngineBenchServer), each measuring only itself: G1, a gateway on
// SQLite with an openai backend to the mock; G2, a gateway on SQLite with an
// engine backend; E, an engine.Server (what `moonji engine` runs) in front of
// the same mock, which G2's backend dials.
//
// Latency. Sequential requests, one at a time, in ABBA rounds so that drift
// (other work on the machine) hits every side alike: round 1 direct, openai,
// engine; round 2 engine, openai, direct; and so on. Streams: each
// MOONJI_BENCH_ENGINE_CHUNKS content chunks paced by the mock at
// MOONJI_BENCH_ENGINE_TPS. First token is the request's start (before the
// client sends it) to the first content chunk's arrival; a chunk's lateness
// is its arrival minus when the mock meant to send it (the mock's recorded
// start of the request + i/tps): the answer's path back alone. The request's
// path out is the mock's recorded start minus the request's start. Whole
// answers: 16 tokens, unpaced, start to the last byte. "Direct" is the mock
// without any gateway (the client and the mock share this process).
//
// Sessions. MOONJI_BENCH_ENGINE_SESSIONS streams at once, first through G1,
// then through G2, each at MOONJI_BENCH_ENGINE_SESSION_TPS. Once every
// client has its headers, the mock has that many running requests, and (for
// G2) moonji_engine_sessions says so with connected 1 and no reconnect and
// E has accepted one connection, the CPU of G and E is read from /proc over
// 6 s, then each process snapshots itself twice (live heap after two GCs,
// goroutine stacks, goroutines, RSS; vbSnap). Per session = (with − before)
// / sessions. Chunk lateness is reported for the chunks due from 0.5 s after
// every stream was open to the first snapshot (the CPU window: no snapshot
// stops any process in it), with the chunks later than 10 ms grouped in
// bursts (arrivals less than 50 ms apart): many sessions late in one burst is
// a stall they share, not one slow stream.
//
// Correctness, which fails the test: every stream (latency and sessions)
// got status 200, all its chunks and data: [DONE]; every session stream's
// text is exactly the mock's; every session left one success row with its
// completion tokens on its gateway's backend; the link stayed one
// connection (no reconnect, and no message dropped for any reason:
// since c94f608 the link waits for chat.done after the reader took
// data: [DONE], so not even unknown_session).
func TestEngineBench(t *testing.T) {
	if os.Getenv("MOONJI_BENCH_ENGINE") != "1" {
		t.Skip("a load test; MOONJI_BENCH_ENGINE=1 runs it (BENCHMARKS.md)")
	}
	p := ebParams{
		Rounds: envInt("MOONJI_BENCH_ENGINE_ROUNDS", 4), Streams: envInt("MOONJI_BENCH_ENGINE_STREAMS", 75),
		Chunks: envInt("MOONJI_BENCH_ENGINE_CHUNKS", 20), TPS: envInt("MOONJI_BENCH_ENGINE_TPS", 200),
		Whole: envInt("MOONJI_BENCH_ENGINE_WHOLE", 300), Direct: os.Getenv("MOONJI_BENCH_ENGINE_DIRECT") != "0",
		Sessions: envInt("MOONJI_BENCH_ENGINE_SESSIONS", 1000), SessionTPS: envInt("MOONJI_BENCH_ENGINE_SESSION_TPS", 3),
		SessionSecs: envInt("MOONJI_BENCH_ENGINE_SESSION_SECONDS", 20), Profile: os.Getenv("MOONJI_BENCH_ENGINE_PROFILE"),
	}
	began := time.Now()
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	t.Cleanup(ms.Close)

	eng := ebStart(t, "E", ebSpec{Role: "engine", Upstream: ms.URL + "/v1"})
	g1 := ebStart(t, "G1", ebSpec{Role: "gateway", Kind: config.KindOpenAI, Upstream: ms.URL + "/v1"})
	g2 := ebStart(t, "G2", ebSpec{Role: "gateway", Kind: config.KindEngine, Upstream: eng.ready[0]})
	t.Cleanup(func() { g1.quit(); g2.quit(); eng.quit() }) // the engine last
	g2env := &testEnv{t: t, URL: g2.ready[0]}
	waitFor(t, "G2's link to the engine", 15*time.Second, func() bool {
		return metricValue(t, g2env, "moonji_engine_connected", `backend="e1"`) == 1
	})
	w := os.Stderr
	fmt.Fprintf(w, "\n== engine bench: %d CPUs (GOMAXPROCS %d), %s; load average before: %s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), ebLoadAvg())

	lat := ebLatency(t, mock, ms.URL, g1, g2, p)
	lat.report(w, p)
	// Every latency stream is over: the link must have dropped nothing.
	waitFor(t, "G2's link to have no session left", 10*time.Second, func() bool {
		return metricValue(t, g2env, "moonji_engine_sessions", `backend="e1"`) == 0
	})
	if m := ebLinkMetrics(t, g2env, "e1", true); ebDropped(m) != 0 || m["connected"] != 1 || m["reconnects"] != 0 {
		t.Errorf("engine link after the latency part: %v", m)
	} else {
		fmt.Fprintf(w, "  engine link after the latency part: %v\n", m)
	}

	var mem [2]*ebMemResult
	for i, g := range []*ebProc{g1, g2} {
		var e *ebProc
		if g == g2 {
			e = eng
		}
		mem[i] = ebSessions(t, mock, g, e, p, i)
	}
	ebReportMem(w, p, mem[0], mem[1])
	fmt.Fprintf(w, "\n  whole run: %v; load average after: %s\n", time.Since(began).Round(time.Second), ebLoadAvg())
}

type ebParams struct {
	Rounds, Streams, Chunks, TPS, Whole int
	Direct                              bool
	Sessions, SessionTPS, SessionSecs   int
	Profile                             string // directory for CPU profiles, or ""
}

const (
	ebRoleEnv = "MOONJI_BENCH_ENGINE_ROLE"
	ebMarker  = "ENGINE-BENCH "
	ebToken   = "engine-bench-secret"
)

// ebSpec is what a server process is told to be.
type ebSpec struct {
	Role     string // "engine", "gateway" or "streams-client" (TestOpenStreamsBench)
	Kind     string // a gateway's backend kind
	Upstream string // the mock's /v1 (engine, openai gateway) or the engine's ws:// URL
	// MaxConcurrency is the gateway backend's max_concurrency and max_queue
	// (at least 4096).
	MaxConcurrency int
	// NoFile, when set, is the open-file limit the process raises itself to
	// (see ebRaiseNoFile).
	NoFile uint64
	// Streams is what a streams-client opens.
	Streams ssClientSpec
}

// ebProc is a server process as the coordinator sees it.
type ebProc struct {
	name  string
	child *vbChild
	ready []string // what it said it was ready with: engine: ws URL; gateway: URL and key
	once  sync.Once
}

// ebSnapshot is a server process's snapshot.
type ebSnapshot struct {
	vbSnapshot
	Conns int // engine: connections accepted so far
	// FDs is how many files the process has open, NoFile its limit.
	FDs    int
	NoFile uint64
}

func ebStart(t *testing.T, name string, spec ebSpec, env ...string) *ebProc {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spec.json")
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestEngineBenchServer$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(append(os.Environ(), ebRoleEnv+"="+path), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &vbChild{cmd: cmd, in: in, lines: make(chan string, 16)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), ebMarker); ok {
				c.lines <- l
			} else if l := sc.Text(); l != "PASS" && l != "" {
				fmt.Fprintf(os.Stderr, "%s: %s\n", name, l)
			}
		}
	}()
	p := &ebProc{name: name, child: c}
	t.Cleanup(p.quit)
	p.ready = strings.Fields(c.expect(t, "ready", 60*time.Second))
	return p
}

// quit asks the process to end (its cleanups run) and kills it if it has
// not within 10 s.
func (p *ebProc) quit() {
	p.once.Do(func() {
		p.child.send("quit")
		p.child.in.Close()
		done := make(chan struct{})
		go func() { _ = p.child.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.child.cmd.Process.Kill()
			<-done
		}
	})
}

func (p *ebProc) pid() int { return p.child.cmd.Process.Pid }

func (p *ebProc) snap(t *testing.T) ebSnapshot {
	t.Helper()
	p.child.send("snap")
	var s ebSnapshot
	if err := json.Unmarshal([]byte(p.child.expect(t, "snap", 60*time.Second)), &s); err != nil {
		t.Fatalf("%s's snapshot: %v", p.name, err)
	}
	return s
}

// TestEngineBenchServer is a server process of TestEngineBench (and of
// TestOpenStreamsBench), which runs it in a process of its own; otherwise it
// is skipped. It serves until told "quit" (or its stdin closes), answering
// "snap" with a snapshot of itself, "rows FILE TOKENS BACKEND" with a check
// of the ledger rows of the ids in FILE, "final FILE" with the outcomes of
// those rows (ssFinalRows), "prof FILE" by starting a CPU profile, "unprof"
// by ending it, and "heap FILE" by writing a heap profile after a GC. In
// the role streams-client it is TestOpenStreamsBench's clients instead, and
// answers "open" by opening its streams and "hangup FILE" by closing them
// (ssClient).
func TestEngineBenchServer(t *testing.T) {
	path := os.Getenv(ebRoleEnv)
	if path == "" {
		t.Skip("a server process of TestEngineBench")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec ebSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	say := func(format string, args ...any) { fmt.Printf(ebMarker+format+"\n", args...) }
	if spec.NoFile > 0 {
		ebRaiseNoFile(spec.NoFile) // as far as allowed; snapshots say how far
	}
	var ln *trackedListener
	var e *testEnv
	var sc *ssClient
	switch spec.Role {
	case "streams-client":
		sc = newSSClient(spec.Streams)
		say("ready")
	case "engine":
		// As `moonji engine` serves one model of an openai backend.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln = &trackedListener{Listener: l}
		srv := engine.New(engine.Options{Token: ebToken, Logger: quietLog(),
			Models: []engine.Model{{Name: "m1", Upstream: proxy.Upstream{Name: "mock", BaseURL: spec.Upstream}}}})
		hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
			_ = hs.Close()
		})
		say("ready ws://%s%s", l.Addr(), engine.Path)
	case "gateway":
		mc := max(spec.MaxConcurrency, 4096)
		bk := config.Backend{Name: "mock", Kind: spec.Kind, URL: spec.Upstream, MaxConcurrency: mc, MaxQueue: mc}
		if spec.Kind == config.KindEngine {
			bk.Name, bk.APIKey = "e1", ebToken
		}
		cfg := &config.Config{
			DatabaseURL: "sqlite://" + t.TempDir() + "/ledger.db",
			RateLimit:   config.RateLimit{RequestsPerMinute: 10_000_000},
			Backends:    []config.Backend{bk},
			Models:      []config.Model{{Name: "m1", Backend: bk.Name}},
		}
		e = startWithConfig(t, cfg, nil, "")
		say("ready %s %s", e.URL, e.Key)
	default:
		t.Fatalf("unknown role %q", spec.Role)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "snap":
			s := ebSnapshot{vbSnapshot: vbSnap(), FDs: ebFDs()}
			s.Full = nil
			var rl syscall.Rlimit
			if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil {
				s.NoFile = rl.Cur
			}
			if ln != nil {
				ln.mu.Lock()
				s.Conns = len(ln.conns)
				ln.mu.Unlock()
			}
			out, _ := json.Marshal(s)
			say("snap %s", out)
		case "rows":
			tokens, _ := strconv.Atoi(f[2])
			ok, problem := ebCheckRows(e, f[1], tokens, f[3])
			say("rows %d %s", ok, strconv.Quote(problem))
		case "open":
			out, _ := json.Marshal(sc.open())
			say("open %s", out)
		case "hangup":
			out, _ := json.Marshal(sc.hangUp(f[1]))
			say("hangup %s", out)
		case "final":
			out, _ := json.Marshal(ssFinalRows(e, f[1]))
			say("final %s", out)
		case "heap":
			runtime.GC()
			pf, err := os.Create(f[1])
			if err == nil {
				err = pprof.WriteHeapProfile(pf)
				if cerr := pf.Close(); err == nil {
					err = cerr
				}
			}
			say("heap %v", err)
		case "prof":
			pf, err := os.Create(f[1])
			if err == nil {
				err = pprof.StartCPUProfile(pf)
			}
			say("prof %v", err)
		case "unprof":
			pprof.StopCPUProfile()
			say("unprof")
		case "quit":
			return
		}
	}
}

// ebCheckRows checks that every id in the file (a JSON list) has a final
// success row of backend with tokens completion tokens; it returns how many
// do and the first problem.
func ebCheckRows(e *testEnv, file string, tokens int, backend string) (int, string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err.Error()
	}
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		return 0, err.Error()
	}
	ctx := context.Background()
	left := slices.Clone(ids)
	problem := ""
	for deadline := time.Now().Add(20 * time.Second); len(left) > 0 && time.Now().Before(deadline); {
		_ = e.srv.Ledger.Flush(ctx)
		var still []string
		for _, id := range left {
			u, err := models.UsageByID(ctx, e.DB, id)
			switch {
			case err != nil || u.Outcome == models.OutcomePending:
				still = append(still, id)
			case u.Outcome != models.OutcomeSuccess || u.CompletionTokens != tokens || u.Backend != backend:
				if problem == "" {
					problem = fmt.Sprintf("%s: outcome %s/%s, %d completion tokens, backend %s", id, u.Outcome, u.Reason, u.CompletionTokens, u.Backend)
				}
			}
		}
		if left = still; len(left) > 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(left) > 0 && problem == "" {
		problem = fmt.Sprintf("%d rows missing or still pending after 20 s (first %s)", len(left), left[0])
	}
	ok := len(ids) - len(left)
	if problem != "" && ok == len(ids) {
		ok-- // at least the one named
	}
	return ok, problem
}

// ebRead is what a client read of one stream (or whole answer) saw.
type ebRead struct {
	T0      time.Time
	Status  int
	ID      string
	At      []int64 // arrival of each content chunk, Unix ns
	DoneAt  int64   // arrival of data: [DONE]
	Body    []byte  // kept when asked
	Err     string
	Elapsed time.Duration // start to the last byte
}

// ebDo sends one chat request and reads its answer, timing each content
// chunk. headers, when set, gets nil once the answer's headers are in (or
// the error).
func ebDo(client *http.Client, url, key, body string, keep bool, headers chan<- error) ebRead {
	var r ebRead
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	r.T0 = time.Now()
	resp, err := client.Do(req)
	if err != nil {
		r.Err = err.Error()
		if headers != nil {
			headers <- err
		}
		return r
	}
	defer resp.Body.Close()
	r.Status, r.ID = resp.StatusCode, resp.Header.Get("X-Inference-Id")
	if headers != nil {
		if r.Status != http.StatusOK {
			headers <- fmt.Errorf("status %d", r.Status)
		} else {
			headers <- nil
		}
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		now := time.Now().UnixNano()
		if keep {
			r.Body = append(r.Body, line...)
		}
		if payload, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			payload = bytes.TrimSpace(payload)
			if string(payload) == "[DONE]" {
				r.DoneAt = now
			} else if gjson.GetBytes(payload, "choices.0.delta.content").Str != "" {
				r.At = append(r.At, now)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.Err = err.Error()
			}
			break
		}
	}
	r.Elapsed = time.Since(r.T0)
	return r
}

// ebSide is one way to reach the mock, and what was measured through it.
type ebSide struct {
	name, url, key                   string
	ttft, late, out, doneLate, whole []time.Duration
	roundTTFT, roundLate             [][]time.Duration
	errors                           []string
}

type ebLatResult struct {
	sides []*ebSide
	took  time.Duration
}

// ebLatency runs the latency part.
func ebLatency(t *testing.T, mock *mockllm.Server, mockURL string, g1, g2 *ebProc, p ebParams) ebLatResult {
	client := benchClient()
	defer client.CloseIdleConnections()
	var sides []*ebSide
	if p.Direct {
		sides = append(sides, &ebSide{name: "direct", url: mockURL + "/v1/chat/completions"})
	}
	sides = append(sides,
		&ebSide{name: "openai", url: g1.ready[0] + "/v1/chat/completions", key: g1.ready[1]},
		&ebSide{name: "engine", url: g2.ready[0] + "/v1/chat/completions", key: g2.ready[1]})
	streamBody := func(tag string) string {
		return fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"Latency %s"}],"mock":{"tag":%q,"tps":%d,"tokens":%d}}`,
			tag, tag, p.TPS, p.Chunks)
	}
	wholeBody := func(tag string) string {
		return fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"Whole %s"}],"mock":{"tag":%q,"tokens":16}}`, tag, tag)
	}
	// Warm-up: connections, the key cache, the databases, the link.
	for _, s := range sides {
		for k := range 10 {
			ebDo(client, s.url, s.key, streamBody(fmt.Sprintf("warm-%s-%d", s.name, k)), false, nil)
		}
		for k := range 50 {
			ebDo(client, s.url, s.key, wholeBody(fmt.Sprintf("warmw-%s-%d", s.name, k)), false, nil)
		}
	}
	start := time.Now()
	type pending struct {
		side  *ebSide
		round int
		tag   string
		r     ebRead
	}
	var streams []pending
	for round := range p.Rounds {
		order := slices.Clone(sides)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			for k := range p.Streams {
				tag := fmt.Sprintf("lat-%s-%d-%d", s.name, round, k)
				streams = append(streams, pending{s, round, tag, ebDo(client, s.url, s.key, streamBody(tag), false, nil)})
			}
		}
		for _, s := range order {
			for k := range p.Whole {
				tag := fmt.Sprintf("whole-%s-%d-%d", s.name, round, k)
				r := ebDo(client, s.url, s.key, wholeBody(tag), false, nil)
				if r.Status != http.StatusOK || r.Err != "" {
					s.errors = append(s.errors, fmt.Sprintf("%s: status %d %s", tag, r.Status, r.Err))
					continue
				}
				s.whole = append(s.whole, r.Elapsed)
			}
		}
	}
	took := time.Since(start)
	started := map[string]time.Time{}
	for _, r := range mock.Requests() {
		if strings.HasPrefix(r.Tag, "lat-") {
			started[r.Tag] = r.Started
		}
	}
	interval := time.Second / time.Duration(p.TPS)
	for _, s := range sides {
		s.roundTTFT, s.roundLate = make([][]time.Duration, p.Rounds), make([][]time.Duration, p.Rounds)
	}
	for _, x := range streams {
		s, r := x.side, x.r
		st, ok := started[x.tag]
		switch {
		case r.Status != http.StatusOK || r.Err != "":
			s.errors = append(s.errors, fmt.Sprintf("%s: status %d %s", x.tag, r.Status, r.Err))
			continue
		case len(r.At) != p.Chunks || r.DoneAt == 0:
			s.errors = append(s.errors, fmt.Sprintf("%s: %d chunks of %d, [DONE] %v", x.tag, len(r.At), p.Chunks, r.DoneAt != 0))
			continue
		case !ok:
			s.errors = append(s.errors, fmt.Sprintf("%s: the mock did not see it", x.tag))
			continue
		}
		ttft := time.Duration(r.At[0] - r.T0.UnixNano())
		s.ttft = append(s.ttft, ttft)
		s.roundTTFT[x.round] = append(s.roundTTFT[x.round], ttft)
		s.out = append(s.out, st.Sub(r.T0))
		for i, at := range r.At {
			late := time.Duration(at - st.Add(time.Duration(i+1)*interval).UnixNano())
			s.late = append(s.late, late)
			s.roundLate[x.round] = append(s.roundLate[x.round], late)
		}
		s.doneLate = append(s.doneLate, time.Duration(r.DoneAt-st.Add(time.Duration(p.Chunks)*interval).UnixNano()))
	}
	for _, s := range sides {
		for i, e := range s.errors {
			if i < 10 {
				t.Errorf("%s: %s", s.name, e)
			}
		}
	}
	return ebLatResult{sides: sides, took: took}
}

func (l ebLatResult) side(name string) *ebSide {
	for _, s := range l.sides {
		if s.name == name {
			return s
		}
	}
	return &ebSide{name: name}
}

func (l ebLatResult) report(w io.Writer, p ebParams) {
	o, e := l.side("openai"), l.side("engine")
	fmt.Fprintf(w, "\n== latency: %d ABBA rounds in %v; per side %d streams of %d chunks at %d tok/s (%d chunks) and %d whole answers, one request at a time\n",
		p.Rounds, l.took.Round(time.Second), p.Rounds*p.Streams, p.Chunks, p.TPS, p.Rounds*p.Streams*p.Chunks, p.Rounds*p.Whole)
	row := func(what string, get func(*ebSide) []time.Duration, ps ...int) {
		fmt.Fprintf(w, "  %-34s", what)
		for _, s := range l.sides {
			d := get(s)
			var parts []string
			for _, q := range ps {
				parts = append(parts, ebMs(pct(d, q)))
			}
			fmt.Fprintf(w, " | %-7s %-24s", s.name, strings.Join(parts, " / "))
		}
		var parts []string
		for _, q := range ps {
			parts = append(parts, ebDiff(pct(get(e), q)-pct(get(o), q)))
		}
		fmt.Fprintf(w, " | engine − openai %s\n", strings.Join(parts, " / "))
	}
	fmt.Fprintf(w, "  (ms, p50 / p90 / p99)\n")
	row("first token", func(s *ebSide) []time.Duration { return s.ttft }, 50, 90, 99)
	row("chunk lateness", func(s *ebSide) []time.Duration { return s.late }, 50, 90, 99)
	row("request → the mock's start", func(s *ebSide) []time.Duration { return s.out }, 50, 90, 99)
	row("[DONE] after the last chunk's time", func(s *ebSide) []time.Duration { return s.doneLate }, 50, 90, 99)
	row("whole answer (16 tokens)", func(s *ebSide) []time.Duration { return s.whole }, 50, 90, 99)
	for _, s := range l.sides {
		fmt.Fprintf(w, "  %s: max first token %s, max lateness %s, max whole %s; %d errors\n", s.name,
			ebMs(pctf(s.ttft, 100)), ebMs(pctf(s.late, 100)), ebMs(pctf(s.whole, 100)), len(s.errors))
	}
	fmt.Fprintf(w, "  per round, engine − openai: first token p50, chunk lateness p50 / p99:\n")
	for r := range p.Rounds {
		fmt.Fprintf(w, "    round %d: %s | %s / %s\n", r+1, ebDiff(pct(e.roundTTFT[r], 50)-pct(o.roundTTFT[r], 50)),
			ebDiff(pct(e.roundLate[r], 50)-pct(o.roundLate[r], 50)), ebDiff(pct(e.roundLate[r], 99)-pct(o.roundLate[r], 99)))
	}
}

func ebMs(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }

func ebDiff(d time.Duration) string {
	s := ebMs(d)
	if d >= 0 {
		s = "+" + s
	}
	return s
}

// ebMemResult is the sessions part through one gateway.
type ebMemResult struct {
	kind                   string
	n                      int
	gBefore, gWith, gAfter []ebSnapshot
	eBefore, eWith, eAfter []ebSnapshot
	gCPU, eCPU, cCPU       float64 // % of one core while every stream was open
	cpuWindow              time.Duration
	openTook, firstEnd     time.Duration
	late                   []time.Duration
	ok, rowsOK             int
	bursts                 string
	lateWindow             time.Duration
	metrics                map[string]float64
	metricsEnd             map[string]float64
}

// ebSessions runs the sessions part through g (and e, for the engine
// gateway).
func ebSessions(t *testing.T, mock *mockllm.Server, g, e *ebProc, p ebParams, run int) *ebMemResult {
	n, tps := p.Sessions, p.SessionTPS
	tokens := tps * p.SessionSecs
	res := &ebMemResult{kind: "openai", n: n}
	backend := "mock"
	if e != nil {
		res.kind, backend = "engine", "e1"
	}
	genv := &testEnv{t: t, URL: g.ready[0]}
	snapAll := func(gs, es *[]ebSnapshot) {
		*gs = append(*gs, g.snap(t))
		if e != nil {
			*es = append(*es, e.snap(t))
		}
	}
	time.Sleep(2 * time.Second) // settle after the previous part
	snapAll(&res.gBefore, &res.eBefore)
	time.Sleep(time.Second)
	snapAll(&res.gBefore, &res.eBefore)

	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 8192, MaxIdleConnsPerHost: 8192, DisableCompression: true}}
	defer client.CloseIdleConnections()
	prompt := func(i int) string { return fmt.Sprintf("Session %d of run %d, tell me a story", i, run) }
	tag := func(i int) string { return fmt.Sprintf("sess-%d-%d", run, i) }
	reads := make([]ebRead, n)
	headers := make(chan error, n)
	var wg sync.WaitGroup
	openStart := time.Now()
	for i := range n {
		body := fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":%q}],"mock":{"tag":%q,"tps":%d,"tokens":%d}}`,
			prompt(i), tag(i), tps, tokens)
		wg.Go(func() { reads[i] = ebDo(client, g.ready[0]+"/v1/chat/completions", g.ready[1], body, true, headers) })
		time.Sleep(2 * time.Millisecond) // a 2 s ramp
	}
	for range n {
		select {
		case err := <-headers:
			if err != nil {
				t.Fatalf("%s: a session stream did not start: %v", res.kind, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: the session streams did not all start within 60 s", res.kind)
		}
	}
	running := func() int {
		k := 0
		prefix := fmt.Sprintf("sess-%d-", run)
		for _, r := range mock.Requests() {
			if strings.HasPrefix(r.Tag, prefix) && r.Status == http.StatusOK && !r.Completed && !r.Cancelled {
				k++
			}
		}
		return k
	}
	waitFor(t, fmt.Sprintf("%d running requests at the mock", n), 30*time.Second, func() bool { return running() == n })
	gauge := func(name string) float64 { return metricValue(t, genv, name, `backend="`+backend+`"`) }
	if e != nil {
		waitFor(t, fmt.Sprintf("moonji_engine_sessions = %d", n), 30*time.Second, func() bool {
			return gauge("moonji_engine_sessions") == float64(n)
		})
	}
	res.openTook = time.Since(openStart)
	allOpen := time.Now()
	res.metrics = ebLinkMetrics(t, genv, backend, e != nil)

	// CPU over a quiet window with every stream open, read from outside.
	time.Sleep(time.Second)
	profiled := []*ebProc{g}
	if e != nil {
		profiled = append(profiled, e)
	}
	if p.Profile != "" {
		for _, x := range profiled {
			x.child.send(fmt.Sprintf("prof %s", filepath.Join(p.Profile, x.name+"-sessions.cpu")))
			if got := x.child.expect(t, "prof", 10*time.Second); got != "<nil>" {
				t.Fatalf("%s: CPU profile: %s", x.name, got)
			}
		}
	}
	g0, e0, c0, w0 := ebProcCPU(g.pid()), time.Duration(0), vbCPU(), time.Now()
	if e != nil {
		e0 = ebProcCPU(e.pid())
	}
	time.Sleep(6 * time.Second)
	res.cpuWindow = time.Since(w0)
	res.gCPU = 100 * float64(ebProcCPU(g.pid())-g0) / float64(res.cpuWindow)
	res.cCPU = 100 * float64(vbCPU()-c0) / float64(res.cpuWindow)
	if e != nil {
		res.eCPU = 100 * float64(ebProcCPU(e.pid())-e0) / float64(res.cpuWindow)
	}
	if p.Profile != "" {
		for _, x := range profiled {
			x.child.send("unprof")
			x.child.expect(t, "unprof", 10*time.Second)
		}
	}
	snapAll(&res.gWith, &res.eWith)
	time.Sleep(1500 * time.Millisecond)
	snapAll(&res.gWith, &res.eWith)
	measured := time.Now()
	if k := running(); k != n {
		t.Errorf("%s: only %d of %d streams still running when the snapshots ended: raise MOONJI_BENCH_ENGINE_SESSION_SECONDS", res.kind, k, n)
	}
	if e != nil {
		if m := ebLinkMetrics(t, genv, backend, true); m["sessions"] != float64(n) || m["connected"] != 1 || m["reconnects"] != 0 {
			t.Errorf("engine link while measuring: %v", m)
		}
	}

	wg.Wait()
	// What is left 2 s after the last stream (before the ledger check below,
	// which allocates in the gateway's process).
	time.Sleep(2 * time.Second)
	snapAll(&res.gAfter, &res.eAfter)
	// Correctness, and lateness over the window with every stream open.
	started := map[string]time.Time{}
	for _, r := range mock.Requests() {
		if strings.HasPrefix(r.Tag, fmt.Sprintf("sess-%d-", run)) {
			started[r.Tag] = r.Started
		}
	}
	interval := time.Second / time.Duration(tps)
	firstEnd := time.Time{}
	for i := range n {
		if end := started[tag(i)].Add(time.Duration(tokens) * interval); firstEnd.IsZero() || end.Before(firstEnd) {
			firstEnd = end
		}
	}
	res.firstEnd = firstEnd.Sub(measured)
	lateFrom, lateTo := allOpen.Add(500*time.Millisecond), res.gWith[0].Start
	res.lateWindow = lateTo.Sub(lateFrom)
	var ids []string
	var lates []ebLate
	bad := 0
	for i, r := range reads {
		want := mockllm.CompletionText(prompt(i), tokens)
		body := string(r.Body)
		switch {
		case r.Status != http.StatusOK || r.Err != "":
			bad++
			if bad <= 10 {
				t.Errorf("%s session %d: status %d, %s", res.kind, i, r.Status, r.Err)
			}
		case !strings.HasSuffix(body, "data: [DONE]\n\n") || sseContent(body) != want || len(r.At) != tokens:
			bad++
			if bad <= 10 {
				t.Errorf("%s session %d: %d chunks, %d of %d bytes of text, ends %q", res.kind, i, len(r.At), len(sseContent(body)), len(want), tail(body))
			}
		default:
			res.ok++
		}
		ids = append(ids, r.ID)
		st := started[tag(i)]
		for k, at := range r.At {
			due := st.Add(time.Duration(k+1) * interval)
			if due.Before(lateFrom) || !due.Before(lateTo) {
				continue
			}
			late := time.Duration(at - due.UnixNano())
			res.late = append(res.late, late)
			if late > 10*time.Millisecond {
				lates = append(lates, ebLate{at: at, late: late, session: i})
			}
		}
	}
	res.bursts = ebBursts(lates, lateFrom)
	idFile := filepath.Join(t.TempDir(), "ids.json")
	b, _ := json.Marshal(ids)
	if err := os.WriteFile(idFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	g.child.send(fmt.Sprintf("rows %s %d %s", idFile, tokens, backend))
	f := strings.SplitN(g.child.expect(t, "rows", 60*time.Second), " ", 2)
	res.rowsOK, _ = strconv.Atoi(f[0])
	if problem, _ := strconv.Unquote(f[1]); res.rowsOK != n || problem != "" {
		t.Errorf("%s: %d of %d rows as expected; %s", res.kind, res.rowsOK, n, problem)
	}
	res.metricsEnd = ebLinkMetrics(t, genv, backend, e != nil)
	if e != nil {
		m := res.metricsEnd
		if m["sessions"] != 0 || m["connected"] != 1 || m["reconnects"] != 0 || ebDropped(m) != 0 {
			t.Errorf("engine link after the sessions: %v", m)
		}
		for _, s := range append(res.eWith, res.eAfter...) {
			if s.Conns != 1 {
				t.Errorf("the engine accepted %d connections, want 1", s.Conns)
			}
		}
	}
	return res
}

// ebLinkMetrics reads the backend's gauges (and the engine link's) from a
// gateway's /metrics.
func ebLinkMetrics(t *testing.T, g *testEnv, backend string, link bool) map[string]float64 {
	fams := scrape(t, g)
	lb := `backend="` + backend + `"`
	m := map[string]float64{"in_flight": seriesValue(fams, "moonji_backend_in_flight", lb)}
	if link {
		m["connected"] = seriesValue(fams, "moonji_engine_connected", lb)
		m["sessions"] = seriesValue(fams, "moonji_engine_sessions", lb)
		m["reconnects"] = seriesValue(fams, "moonji_engine_reconnects_total", lb)
		for _, r := range metrics.DroppedReasons {
			m["dropped "+r] = seriesValue(fams, "moonji_engine_messages_dropped_total", lb+`,reason="`+r+`"`)
		}
	}
	return m
}

// ebDropped sums the link's dropped messages of every reason.
func ebDropped(m map[string]float64) float64 {
	n := 0.0
	for _, r := range metrics.DroppedReasons {
		n += m["dropped "+r]
	}
	return n
}

// ebProcCPU is a process's user+system time, from /proc (0 when unknown).
func ebProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100 on Linux
}

func ebLoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:min(3, len(strings.Fields(string(b))))], " ")
}

func ebReportMem(w io.Writer, p ebParams, o, e *ebMemResult) {
	fmt.Fprintf(w, "\n== %d concurrent streams at %d tok/s for %d s, first through G1 (openai backend), then G2 (engine backend, one WebSocket to E)\n",
		p.Sessions, p.SessionTPS, p.SessionSecs)
	per := func(a, b ebSnapshot, n int) string {
		return fmt.Sprintf("heap %.1f KiB + stacks %.1f KiB, %.2f goroutines, RSS %.1f KiB",
			(float64(b.Heap)-float64(a.Heap))/1024/float64(n), (float64(b.Stacks)-float64(a.Stacks))/1024/float64(n),
			float64(b.Goroutines-a.Goroutines)/float64(n), (float64(b.RSS)-float64(a.RSS))/1024/float64(n))
	}
	proc := func(name string, before, with, after []ebSnapshot, n int) {
		if len(before) == 0 {
			return
		}
		b := before[len(before)-1]
		for i, s := range before {
			fmt.Fprintf(w, "    %s before %d  %s\n", name, i+1, s.vbSnapshot)
		}
		for i, s := range with {
			fmt.Fprintf(w, "    %s with %d    %s\n", name, i+1, s.vbSnapshot)
		}
		for i, s := range after {
			fmt.Fprintf(w, "    %s after %d   %s (2 s after the last stream ended)\n", name, i+1, s.vbSnapshot)
		}
		for i, s := range with {
			fmt.Fprintf(w, "    %s per session (with %d − before %d): %s\n", name, i+1, len(before), per(b, s, n))
		}
		fmt.Fprintf(w, "    %s goroutine kinds, before → with 1:\n%s", name, vbGroupDiff(b.vbSnapshot, with[0].vbSnapshot, max(n/10, 2)))
	}
	for _, r := range []*ebMemResult{o, e} {
		fmt.Fprintf(w, "  -- %s backend: %d streams open in %v (headers, the mock running all, the link's gauge)\n", r.kind, r.n, r.openTook.Round(time.Millisecond))
		proc("gateway", r.gBefore, r.gWith, r.gAfter, r.n)
		proc("engine ", r.eBefore, r.eWith, r.eAfter, r.n)
		fmt.Fprintf(w, "    CPU with every stream open (%.1f s, %% of one core): gateway %.0f%%", r.cpuWindow.Seconds(), r.gCPU)
		if r.kind == "engine" {
			fmt.Fprintf(w, ", engine %.0f%%", r.eCPU)
		}
		fmt.Fprintf(w, ", coordinator (mock + clients) %.0f%%; %d chunks/s\n", r.cCPU, p.Sessions*p.SessionTPS)
		fmt.Fprintf(w, "    chunk lateness with every stream open (%.1f s before the snapshots): p50 %s p90 %s p99 %s max %s ms (n=%d)\n",
			r.lateWindow.Seconds(), ebMs(pct(r.late, 50)), ebMs(pct(r.late, 90)), ebMs(pct(r.late, 99)), ebMs(pctf(r.late, 100)), len(r.late))
		fmt.Fprintf(w, "    %s\n", r.bursts)
		fmt.Fprintf(w, "    metrics while open: %v\n    metrics after:      %v\n", r.metrics, r.metricsEnd)
		fmt.Fprintf(w, "    the first stream ended %.1f s after the snapshots; %d streams complete and exact, %d success rows\n",
			r.firstEnd.Seconds(), r.ok, r.rowsOK)
	}
	if len(o.gWith) > 0 && len(e.gWith) > 0 && len(e.eWith) > 0 {
		n := float64(p.Sessions)
		kib := func(a, b uint64) float64 { return (float64(b) - float64(a)) / 1024 / n }
		last := func(s []ebSnapshot) ebSnapshot { return s[len(s)-1] }
		ob, ow, gb, gw, eb, ew := last(o.gBefore), last(o.gWith), last(e.gBefore), last(e.gWith), last(e.eBefore), last(e.eWith)
		fmt.Fprintf(w, "\n  summary per session (last with − last before), | openai gateway | engine gateway | engine process | engine kind total:\n")
		fmt.Fprintf(w, "    heap KiB        | %.1f | %.1f | %.1f | %.1f\n", kib(ob.Heap, ow.Heap), kib(gb.Heap, gw.Heap), kib(eb.Heap, ew.Heap), kib(gb.Heap, gw.Heap)+kib(eb.Heap, ew.Heap))
		fmt.Fprintf(w, "    stacks KiB      | %.1f | %.1f | %.1f | %.1f\n", kib(ob.Stacks, ow.Stacks), kib(gb.Stacks, gw.Stacks), kib(eb.Stacks, ew.Stacks), kib(gb.Stacks, gw.Stacks)+kib(eb.Stacks, ew.Stacks))
		gor := func(a, b ebSnapshot) float64 { return float64(b.Goroutines-a.Goroutines) / n }
		fmt.Fprintf(w, "    goroutines      | %.2f | %.2f | %.2f | %.2f\n", gor(ob, ow), gor(gb, gw), gor(eb, ew), gor(gb, gw)+gor(eb, ew))
		fmt.Fprintf(w, "    RSS KiB         | %.1f | %.1f | %.1f | %.1f\n", kib(ob.RSS, ow.RSS), kib(gb.RSS, gw.RSS), kib(eb.RSS, ew.RSS), kib(gb.RSS, gw.RSS)+kib(eb.RSS, ew.RSS))
		fmt.Fprintf(w, "    CPU %% of a core | %.0f | %.0f | %.0f | %.0f\n", o.gCPU, e.gCPU, e.eCPU, e.gCPU+e.eCPU)
		perChunk := func(pct float64) float64 { return pct / 100 * 1e6 / float64(p.Sessions*p.SessionTPS) }
		fmt.Fprintf(w, "    CPU µs per chunk | %.0f | %.0f | %.0f | %.0f\n", perChunk(o.gCPU), perChunk(e.gCPU), perChunk(e.eCPU), perChunk(e.gCPU+e.eCPU))
		fmt.Fprintf(w, "    lateness p50/p99 ms | %s / %s | %s / %s\n", ebMs(pct(o.late, 50)), ebMs(pct(o.late, 99)), ebMs(pct(e.late, 50)), ebMs(pct(e.late, 99)))
	}
}

// ebLate is one chunk later than 10 ms.
type ebLate struct {
	at      int64
	late    time.Duration
	session int
}

// ebBursts groups late chunks by arrival (less than 50 ms apart) and
// describes the largest groups.
func ebBursts(lates []ebLate, from time.Time) string {
	if len(lates) == 0 {
		return "chunks later than 10 ms: none"
	}
	slices.SortFunc(lates, func(a, b ebLate) int { return int(a.at - b.at) })
	type burst struct {
		first, last int64
		chunks      int
		sessions    map[int]bool
		worst       time.Duration
	}
	var bs []*burst
	for _, l := range lates {
		if len(bs) == 0 || l.at-bs[len(bs)-1].last > int64(50*time.Millisecond) {
			bs = append(bs, &burst{first: l.at, sessions: map[int]bool{}})
		}
		b := bs[len(bs)-1]
		b.last, b.chunks, b.sessions[l.session], b.worst = l.at, b.chunks+1, true, max(b.worst, l.late)
	}
	slices.SortFunc(bs, func(a, b *burst) int { return b.chunks - a.chunks })
	var sb strings.Builder
	fmt.Fprintf(&sb, "chunks later than 10 ms: %d, in %d bursts; the largest:", len(lates), len(bs))
	for _, b := range bs[:min(4, len(bs))] {
		fmt.Fprintf(&sb, " [%d chunks of %d sessions over %.0f ms at +%.1f s, worst %s ms]", b.chunks, len(b.sessions),
			float64(b.last-b.first)/1e6, float64(b.first-from.UnixNano())/1e9, ebMs(b.worst))
	}
	return sb.String()
}

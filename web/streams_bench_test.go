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
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// TestOpenStreamsBench is issue 12's memory benchmark: what a gateway on its
// embedded default (SQLite) holds per open, idle stream, with 10,000 of them
// open at once. It is a measurement, so it runs only when asked:
//
//	MOONJI_BENCH_STREAMS=1 go test ./web -run '^TestOpenStreamsBench$' -count=1 -v -timeout 30m
//	# knobs: MOONJI_BENCH_STREAMS_N (10000 streams), MOONJI_BENCH_STREAMS_INTERVAL (10: seconds
//	# between two content chunks of a stream), MOONJI_BENCH_STREAMS_PROFILE (a directory to keep
//	# the gateway's heap profiles in; by default they go to a temporary one)
//
// Processes. This one (the coordinator) runs the mock engine. Two more are
// this test binary again (TestEngineBenchServer, as in TestEngineBench): G,
// the gateway, alone in its process so that what it measures is the
// gateway's: an openai backend to the mock whose max_concurrency and
// max_queue are N, a SQLite ledger; and C, the clients. Each stream is a socket in C, two in G (its
// client's and its upstream's) and one here, so every process raises its
// open-file soft limit (to the hard limit, or beyond when allowed); the
// test stops at once, naming the largest N that fits, when G's limit is
// short of 2N plus what it had open before plus 64 to spare. (Without
// CAP_SYS_RESOURCE, a hard limit of 20,000 makes that 9,959, not 10,000.)
//
// Streams. Each asks the mock for 100 tokens, one every
// MOONJI_BENCH_STREAMS_INTERVAL seconds: the role chunk comes at once, the
// first content chunk one interval later, and so on, so a stream is open
// and idle but for a chunk now and then. They are opened at most 64 at a
// time (a new one once one has its first frame). Once every stream has its
// first content chunk and the mock runs N requests, the gateway snapshots
// itself twice (live heap after two GCs, goroutine stacks, goroutines, RSS;
// vbSnap) and writes a heap profile; it did the same before. Per stream =
// (with − before) / N, with the last snapshot of each. The heap profiles are
// compared with go tool pprof -base: the in-use space the open streams
// added, by function and by call stack.
//
// Then every client hangs up at once. Checks, which fail the test: every
// stream got 200, its first frame and its first content chunk, and no error
// before the hang-up; afterwards the backend's in-flight gauge returns to 0,
// the mock sees every request end, and every stream has a final usage row
// (cancelled/client_disconnected, or success for one that ended by itself).
func TestOpenStreamsBench(t *testing.T) {
	if os.Getenv("MOONJI_BENCH_STREAMS") != "1" {
		t.Skip("a load test; MOONJI_BENCH_STREAMS=1 runs it (BENCHMARKS.md)")
	}
	n := envInt("MOONJI_BENCH_STREAMS_N", 10000)
	interval := envInt("MOONJI_BENCH_STREAMS_INTERVAL", 10)
	profDir := os.Getenv("MOONJI_BENCH_STREAMS_PROFILE")
	if profDir == "" {
		profDir = t.TempDir()
	} else if err := os.MkdirAll(profDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := ebRaiseNoFile(uint64(n + 1024)); got < uint64(n+1024) {
		t.Fatalf("this process (the mock) needs %d open files; its limit is %d", n+1024, got)
	}
	began := time.Now()
	w := os.Stderr
	fmt.Fprintf(w, "\n== open streams bench: %d streams, a content chunk every %d s; %d CPUs, %s; load average before: %s\n",
		n, interval, runtime.NumCPU(), runtime.Version(), ebLoadAvg())

	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
	ms := httptest.NewUnstartedServer(mock)
	ms.Config.ReadHeaderTimeout = time.Minute
	ms.Start()
	t.Cleanup(ms.Close)
	// GODEBUG memprofilerate: a heap profile sample every 64 KiB allocated
	// (Go's default is 512 KiB), for a finer profile; it changes no
	// allocation.
	g := ebStart(t, "G", ebSpec{Role: "gateway", Kind: config.KindOpenAI, Upstream: ms.URL + "/v1", MaxConcurrency: n, NoFile: uint64(2*n + 1024)},
		"GODEBUG=memprofilerate=65536")
	genv := &testEnv{t: t, URL: g.ready[0]}
	url, key := g.ready[0]+"/v1/chat/completions", g.ready[1]
	c := ebStart(t, "C", ebSpec{Role: "streams-client", NoFile: uint64(n + 1024),
		Streams: ssClientSpec{URL: url, Key: key, N: n, Interval: interval, Tokens: 100}})
	t.Cleanup(func() { c.quit(); g.quit() })
	inFlight := func() float64 { return metricValue(t, genv, "moonji_backend_in_flight", `backend="mock"`) }

	// Warm-up (the key cache, the database, the upstream pool), on a client
	// of its own whose connections are closed before the baseline.
	warm := benchClient()
	for k := range 20 {
		body := fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"Warm-up %d"}],"mock":{"tag":"warm-%d","tps":200,"tokens":4}}`, k, k)
		if r := ssOpen(context.Background(), warm, url, key, body, nil); r.Status != http.StatusOK || r.Err != "" {
			t.Fatalf("warm-up %d: status %d, %s", k, r.Status, r.Err)
		}
	}
	warm.CloseIdleConnections()
	time.Sleep(3 * time.Second)
	var before, with, after []ebSnapshot
	before = append(before, g.snap(t))
	time.Sleep(time.Second)
	before = append(before, g.snap(t))
	b0 := before[len(before)-1]
	// Each stream is two sockets in the gateway (its client's, its
	// upstream's); 64 more to spare: the database pool grows by about 16
	// files while the streams open, and /metrics and the heap profile take
	// one each.
	const spare = 64
	if need := uint64(b0.FDs + 2*n + spare); need > b0.NoFile {
		t.Fatalf("%d streams need %d open files in the gateway (%d open before, 2 per stream, %d to spare); its limit is %d, "+
			"and raising the hard limit needs CAP_SYS_RESOURCE: the largest MOONJI_BENCH_STREAMS_N here is %d",
			n, need, b0.FDs, spare, b0.NoFile, (int(b0.NoFile)-b0.FDs-spare)/2)
	}
	heapBefore, heapWith := filepath.Join(profDir, "G-before.heap"), filepath.Join(profDir, "G-with.heap")
	ssHeap(t, g, heapBefore)

	// Open N streams, and wait for every first content chunk.
	c.child.send("open")
	var op ssOpened
	if err := json.Unmarshal([]byte(c.child.expect(t, "open", time.Duration(interval)*time.Second+8*time.Minute)), &op); err != nil {
		t.Fatal(err)
	}
	if op.Failed > 0 || op.Content != int64(n) {
		c.child.send("hangup " + filepath.Join(t.TempDir(), "ids.json"))
		c.child.expect(t, "hangup", 2*time.Minute)
		t.Fatalf("of %d streams, %d had their first frame, %d their first content chunk, %d failed; the first failure: %s",
			n, op.Framed, op.Content, op.Failed, op.FirstErr)
	}
	running := func() (run int) {
		for _, r := range mock.Requests() {
			if strings.HasPrefix(r.Tag, "s-") && r.Status == http.StatusOK && !r.Completed && !r.Cancelled {
				run++
			}
		}
		return run
	}
	if run := running(); run != n {
		t.Errorf("the mock runs %d requests, want %d", run, n)
	}
	flightWith := inFlight()
	time.Sleep(time.Second)
	c0, w0 := ebProcCPU(g.pid()), time.Now()
	time.Sleep(5 * time.Second)
	cpu := 100 * float64(ebProcCPU(g.pid())-c0) / float64(time.Since(w0))
	with = append(with, g.snap(t))
	time.Sleep(1500 * time.Millisecond)
	with = append(with, g.snap(t))
	ssHeap(t, g, heapWith)
	if run := running(); run != n {
		t.Errorf("only %d of %d streams still running after the snapshots", run, n)
	}

	// Every client hangs up at once.
	closeStart := time.Now()
	idFile := filepath.Join(t.TempDir(), "ids.json")
	c.child.send("hangup " + idFile)
	var cl ssClosed
	if err := json.Unmarshal([]byte(c.child.expect(t, "hangup", 2*time.Minute)), &cl); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the in-flight gauge to return to 0", 2*time.Minute, func() bool { return inFlight() == 0 })
	flightZero := time.Since(closeStart)
	waitFor(t, "the mock to see every request end", time.Minute, func() bool { return running() == 0 })
	time.Sleep(2 * time.Second)
	after = append(after, g.snap(t))
	if cl.Bad > 0 || cl.IDs != n {
		t.Errorf("%d of %d streams as expected (200, first frame, first content chunk, no error before the hang-up), %d inference ids; %v",
			cl.OK, n, cl.IDs, cl.FirstBad)
	}
	g.child.send("final " + idFile)
	var fin ssFinal
	if err := json.Unmarshal([]byte(g.child.expect(t, "final", 3*time.Minute)), &fin); err != nil {
		t.Fatal(err)
	}
	final := 0
	for k, v := range fin.Counts {
		if k == models.OutcomeCancelled+"/client_disconnected" || k == models.OutcomeSuccess+"/" {
			final += v
		} else {
			t.Errorf("%d rows %s", v, k)
		}
	}
	if final != n || fin.Pending+fin.Missing > 0 {
		t.Errorf("%d of %d streams have a final cancelled/client_disconnected or success row; %d pending, %d missing (first %s)",
			final, n, fin.Pending, fin.Missing, fin.First)
	}

	// Report.
	fmt.Fprintf(w, "\n  %d streams had their first frame after %v and their first content chunk after %v; gateway in flight %v\n",
		n, op.FramedAfter.Round(time.Millisecond), op.ContentAfter.Round(time.Millisecond), flightWith)
	for i, s := range before {
		fmt.Fprintf(w, "    before %d  %s, %d files open (limit %d)\n", i+1, s.vbSnapshot, s.FDs, s.NoFile)
	}
	for i, s := range with {
		fmt.Fprintf(w, "    with %d    %s, %d files open\n", i+1, s.vbSnapshot, s.FDs)
	}
	for i, s := range after {
		fmt.Fprintf(w, "    after %d   %s, %d files open (2 s after in-flight was back to 0)\n", i+1, s.vbSnapshot, s.FDs)
	}
	per := func(a, b ebSnapshot) string {
		return fmt.Sprintf("heap %.1f KiB + stacks %.1f KiB = %.1f KiB, %.2f goroutines, RSS %.1f KiB",
			ssKiB(a.Heap, b.Heap, n), ssKiB(a.Stacks, b.Stacks, n), ssKiB(a.Heap+a.Stacks, b.Heap+b.Stacks, n),
			float64(b.Goroutines-a.Goroutines)/float64(n), ssKiB(a.RSS, b.RSS, n))
	}
	for i, s := range with {
		fmt.Fprintf(w, "    per stream (with %d − before %d): %s\n", i+1, len(before), per(b0, s))
	}
	fmt.Fprintf(w, "    left per stream after (after − before): %s\n", per(b0, after[0]))
	fmt.Fprintf(w, "    goroutine kinds, before → with 1:\n%s", vbGroupDiff(b0.vbSnapshot, with[0].vbSnapshot, max(n/10, 2)))
	fmt.Fprintf(w, "    goroutine kinds, before → after:\n%s", vbGroupDiff(b0.vbSnapshot, after[0].vbSnapshot, max(n/100, 2)))
	fmt.Fprintf(w, "    gateway CPU with every stream open: %.1f %% of one core (%.0f chunks/s)\n", cpu, float64(n)/float64(interval))
	fmt.Fprintf(w, "    hang-up: in-flight back to 0 after %v; rows: %v, %d pending, %d missing\n", flightZero.Round(time.Millisecond), fin.Counts, fin.Pending, fin.Missing)
	ssPprof(w, heapBefore, heapWith, n)
	fmt.Fprintf(w, "  heap profiles: %s, %s\n", heapBefore, heapWith)
	fmt.Fprintf(w, "  whole run: %v; load average after: %s\n", time.Since(began).Round(time.Second), ebLoadAvg())
}

// ssClientSpec is what the streams-client process opens: N streams from
// URL with Key, each Tokens content chunks, one every Interval seconds.
type ssClientSpec struct {
	URL, Key            string
	N, Interval, Tokens int
}

// ssClient is the streams-client process's side: the streams it holds.
type ssClient struct {
	spec   ssClientSpec
	client *http.Client
	ctx    context.Context
	cancel context.CancelFunc
	st     ssState
	reads  []ssRead
	wg     sync.WaitGroup
}

func newSSClient(spec ssClientSpec) *ssClient {
	c := &ssClient{spec: spec, client: &http.Client{Transport: &http.Transport{DisableCompression: true}}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// ssOpened is how the opening went.
type ssOpened struct {
	Framed, Content, Failed   int64
	FirstErr                  string
	FramedAfter, ContentAfter time.Duration
}

// open opens the streams, at most 64 waiting for their first frame at a
// time, and waits until every one has its first content chunk (or failed).
func (c *ssClient) open() ssOpened {
	n, sp := c.spec.N, c.spec
	c.reads = make([]ssRead, n)
	sem := make(chan struct{}, 64)
	start := time.Now()
	launched := 0
	for i := range n {
		sem <- struct{}{}
		if c.st.failed.Load() > 0 {
			<-sem
			break
		}
		body := fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"Stream %d, tell me a story"}],"mock":{"tag":"s-%d","tps":%g,"tokens":%d}}`,
			i, i, 1/float64(sp.Interval), sp.Tokens)
		c.wg.Go(func() {
			c.reads[i] = ssOpen(c.ctx, c.client, sp.URL, sp.Key, body, &ssProgress{state: &c.st, sem: sem})
		})
		launched++
	}
	var o ssOpened
	wait := func(counter *atomic.Int64, d time.Duration) time.Duration {
		for deadline := time.Now().Add(d); counter.Load()+c.st.failed.Load() < int64(launched) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(start)
	}
	o.FramedAfter = wait(&c.st.framed, 5*time.Minute)
	o.ContentAfter = wait(&c.st.content, time.Duration(sp.Interval)*time.Second+2*time.Minute)
	o.Framed, o.Content, o.Failed, o.FirstErr = c.st.framed.Load(), c.st.content.Load(), c.st.failed.Load(), c.st.firstErr()
	return o
}

// ssClosed is what the streams saw, checked after the hang-up.
type ssClosed struct {
	OK, Bad, IDs int
	FirstBad     []string
}

// hangUp closes every stream at once, checks what each saw and writes
// their inference ids (a JSON list) to idFile.
func (c *ssClient) hangUp(idFile string) ssClosed {
	c.cancel()
	c.wg.Wait()
	c.client.CloseIdleConnections()
	var cl ssClosed
	var ids []string
	for i, r := range c.reads {
		if r.Status != http.StatusOK || !r.Framed || r.Content < 1 || r.Err != "" {
			if cl.Bad++; len(cl.FirstBad) < 10 {
				cl.FirstBad = append(cl.FirstBad, fmt.Sprintf("stream %d: status %d, first frame %v, %d content chunks, %s", i, r.Status, r.Framed, r.Content, r.Err))
			}
		} else {
			cl.OK++
		}
		if r.ID != "" {
			ids = append(ids, r.ID)
		}
	}
	cl.IDs = len(ids)
	b, _ := json.Marshal(ids)
	if err := os.WriteFile(idFile, b, 0o600); err != nil {
		cl.FirstBad = append(cl.FirstBad, err.Error())
	}
	return cl
}

func ssKiB(a, b uint64, n int) float64 { return (float64(b) - float64(a)) / 1024 / float64(n) }

// ebRaiseNoFile raises this process's open-file limit towards n: the soft
// limit, and the hard one too when allowed (CAP_SYS_RESOURCE), else the
// soft limit up to the hard one. It returns the soft limit it ends with.
func ebRaiseNoFile(n uint64) uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	if rl.Cur >= n {
		return rl.Cur
	}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: max(rl.Max, n)}) == nil {
		return n
	}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: rl.Max, Max: rl.Max}) == nil {
		return rl.Max
	}
	return rl.Cur
}

// ebFDs counts this process's open files.
func ebFDs() int {
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(des)
}

// ssHeap has the process write a heap profile to file.
func ssHeap(t *testing.T, p *ebProc, file string) {
	t.Helper()
	p.child.send("heap " + file)
	if got := p.child.expect(t, "heap", time.Minute); got != "<nil>" {
		t.Fatalf("%s: heap profile: %s", p.name, got)
	}
}

// ssState counts the streams' progress.
type ssState struct {
	framed, content, failed atomic.Int64
	mu                      sync.Mutex
	first                   string
}

func (s *ssState) fail(msg string) {
	s.mu.Lock()
	if s.first == "" {
		s.first = msg
	}
	s.mu.Unlock()
	s.failed.Add(1)
}

func (s *ssState) firstErr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// ssProgress is where one stream reports: sem is released at its first
// frame (or failure).
type ssProgress struct {
	state *ssState
	sem   chan struct{}
	once  sync.Once
}

func (p *ssProgress) release() {
	if p != nil {
		p.once.Do(func() { <-p.sem })
	}
}

// ssRead is what the client of one stream saw.
type ssRead struct {
	Status  int
	ID      string
	Framed  bool // the first data frame arrived
	Content int  // content chunks
	Done    bool // data: [DONE]
	Err     string
}

// ssOpen sends one streamed chat request and reads it until it ends or ctx
// is cancelled (a hang-up, not an error).
func ssOpen(ctx context.Context, client *http.Client, url, key, body string, p *ssProgress) (r ssRead) {
	defer p.release()
	fail := func(msg string) {
		r.Err = msg
		if p != nil {
			p.state.fail(msg)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		fail(err.Error())
		return r
	}
	defer resp.Body.Close()
	r.Status, r.ID = resp.StatusCode, resp.Header.Get("X-Inference-Id")
	if r.Status != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		fail(fmt.Sprintf("status %d: %s", r.Status, b))
		return r
	}
	br := bufio.NewReaderSize(resp.Body, 4<<10)
	for {
		line, err := br.ReadSlice('\n')
		if payload, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			payload = bytes.TrimSpace(payload)
			if !r.Framed {
				r.Framed = true
				if p != nil {
					p.state.framed.Add(1)
				}
				p.release()
			}
			if string(payload) == "[DONE]" {
				r.Done = true
			} else if gjson.GetBytes(payload, "choices.0.delta.content").Str != "" {
				if r.Content++; r.Content == 1 && p != nil {
					p.state.content.Add(1)
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				fail(err.Error())
			} else if errors.Is(err, io.EOF) && !r.Done {
				fail("the stream ended without data: [DONE]")
			}
			return r
		}
	}
}

// ssFinal is what the gateway's ledger says of a list of inference ids.
type ssFinal struct {
	Counts           map[string]int // by "outcome/reason"
	Pending, Missing int
	First            string // the first id still pending or missing
}

// ssFinalRows waits (at most 60 s) for every id in the file (a JSON list)
// to have a final row, and counts the rows by outcome and reason.
func ssFinalRows(e *testEnv, file string) ssFinal {
	var f ssFinal
	b, err := os.ReadFile(file)
	if err != nil {
		f.First = err.Error()
		return f
	}
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		f.First = err.Error()
		return f
	}
	ctx := context.Background()
	for deadline := time.Now().Add(60 * time.Second); ; {
		_ = e.srv.Ledger.Flush(ctx)
		f = ssFinal{Counts: map[string]int{}}
		for _, id := range ids {
			u, err := models.UsageByID(ctx, e.DB, id)
			switch {
			case err != nil:
				f.Missing++
			case u.Outcome == models.OutcomePending:
				f.Pending++
			default:
				f.Counts[u.Outcome+"/"+u.Reason]++
				continue
			}
			if f.First == "" {
				f.First = id
			}
		}
		if f.Pending+f.Missing == 0 || time.Now().After(deadline) {
			return f
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ssPprof prints what the open streams added to the gateway's in-use heap
// (go tool pprof -base before with), per stream: by allocating function,
// then by call stack.
func ssPprof(w io.Writer, before, with string, n int) {
	run := func(args ...string) (string, error) {
		cmd := exec.Command("go", append([]string{"tool", "pprof", "-sample_index=inuse_space", "-unit=B", "-base", before}, append(args, with)...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("go tool pprof %v: %v: %s", args, err, errb.String())
		}
		return out.String(), nil
	}
	top, err := run("-top", "-nodecount=15")
	if err != nil {
		fmt.Fprintf(w, "  %v\n", err)
		return
	}
	fmt.Fprintf(w, "\n  in-use heap the streams added, by function (go tool pprof -top -sample_index=inuse_space -base before with), KiB per stream:\n")
	fmt.Fprintf(w, "    %9s %6s %9s  %s\n", "flat", "flat%", "cum", "function")
	for line := range strings.SplitSeq(top, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			if strings.HasPrefix(strings.TrimSpace(line), "Showing nodes") {
				fmt.Fprintf(w, "    (%s)\n", strings.TrimSpace(line))
			}
			continue
		}
		flat, ok1 := ssBytes(f[0])
		cum, ok2 := ssBytes(f[3])
		if !ok1 || !ok2 {
			continue
		}
		fmt.Fprintf(w, "    %9.2f %6s %9.2f  %s\n", flat/1024/float64(n), f[1], cum/1024/float64(n), strings.Join(f[5:], " "))
	}
	traces, err := run("-traces")
	if err != nil {
		fmt.Fprintf(w, "  %v\n", err)
		return
	}
	type site struct {
		key   string
		bytes float64
	}
	sites := map[string]float64{}
	var total float64
	var cur []string
	var val float64
	flush := func() {
		if len(cur) > 0 {
			k := strings.Join(cur[:min(5, len(cur))], " < ")
			sites[k] += val
			total += val
		}
		cur, val = nil, 0
	}
	for line := range strings.SplitSeq(traces, "\n") {
		tl := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(tl, "-----------+"):
			flush()
		case tl == "" || strings.HasSuffix(strings.Fields(tl)[0], ":"):
			// blank, or a label line ("bytes:  4kB")
		default:
			f := strings.Fields(tl)
			if v, ok := ssBytes(f[0]); ok && len(cur) == 0 && len(f) > 1 {
				val, cur = v, append(cur, strings.Join(f[1:], " "))
			} else if len(cur) > 0 {
				cur = append(cur, tl)
			}
		}
	}
	flush()
	var ss []site
	for k, v := range sites {
		ss = append(ss, site{k, v})
	}
	slices.SortFunc(ss, func(a, b site) int {
		switch {
		case a.bytes > b.bytes:
			return -1
		case a.bytes < b.bytes:
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
	fmt.Fprintf(w, "\n  the same by call stack (first 5 frames), KiB per stream; %.2f KiB per stream in all:\n", total/1024/float64(n))
	for _, s := range ss[:min(15, len(ss))] {
		fmt.Fprintf(w, "    %8.2f  %s\n", s.bytes/1024/float64(n), s.key)
	}
}

// ssBytes parses a pprof size ("123B", "-4kB", "1.5MB").
func ssBytes(s string) (float64, bool) {
	mult := 1.0
	for _, u := range []struct {
		suffix string
		m      float64
	}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"KB", 1 << 10}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.m
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return v * mult, true
}

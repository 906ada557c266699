//go:build bench

package web_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/markdown"
	"moonji/internal/mockllm"
	"moonji/models"
)

// TestViewersBench is issue 9's load test: many people's browsers watching
// running chat generations (GET /api/v1/generations/{id}/events) at once.
// It is a measurement, so it runs only when asked:
//
//	MOONJI_BENCH_VIEWERS=1 go test ./web -run '^TestViewersBench$' -count=1 -v -timeout 30m
//	# knobs: MOONJI_BENCH_LAYOUTS ("50x10,1x500,500x1": generations x viewers each),
//	# MOONJI_BENCH_TPS (30), MOONJI_BENCH_V1 (10 plain /v1 streams),
//	# MOONJI_BENCH_VIEWERS_SECONDS (40: length of every stream, plus 1 s per 10 generations)
//
// For each layout a gateway on SQLite and a mock engine run in this process
// over real loopback HTTP. One person starts the generations through the chat
// API; each is paced by the mock at the same tokens per second. The clients
// run in a child process (this test binary again, TestViewersBenchClient), so
// that this process's memory is the server's alone: first MOONJI_BENCH_V1
// plain /v1/chat/completions streams with an API key, paced the same (the
// reference), then the viewers, each with the person's session cookie.
//
// Memory: live heap and goroutine stacks after GC, goroutines and RSS of this
// process, three times without viewers (what the running generations alone
// add per second), three times with them, 2 s after half of them left, and
// again after fasthttp's idle workers expired (10-20 s). Delay: the mock sends
// chunk i of a stream at start + i/tps (its own schedule, from the request's
// start as the mock records it); a chunk's lateness is its arrival at the
// client (wall clock, the same in both processes) minus that. Viewers and /v1
// streams are compared over the same window (all viewers connected, before
// any left); chunks due while a snapshot stops the world are left out.
//
// Correctness, which fails the test: every viewer's chunks are numbered 1, 2,
// … without gaps and are exactly the mock's tokens; the viewers that stayed
// got all of them and the done event; the /v1 streams got all of theirs; each
// generation's saved message is the whole text; every viewer that left is
// gone from the server (its goroutines end).
func TestViewersBench(t *testing.T) {
	if os.Getenv("MOONJI_BENCH_VIEWERS") != "1" {
		t.Skip("a load test; MOONJI_BENCH_VIEWERS=1 runs it (BENCHMARKS.md)")
	}
	layouts := os.Getenv("MOONJI_BENCH_LAYOUTS")
	if layouts == "" {
		layouts = "50x10,1x500,500x1"
	}
	tps := envInt("MOONJI_BENCH_TPS", 30)
	refs := envInt("MOONJI_BENCH_V1", 10)
	secs := envInt("MOONJI_BENCH_VIEWERS_SECONDS", 40)
	var ls []vbLayout
	for _, s := range strings.Split(layouts, ",") {
		var l vbLayout
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%dx%d", &l.Gens, &l.PerGen); err != nil || l.Gens < 1 || l.PerGen < 1 {
			t.Fatalf("MOONJI_BENCH_LAYOUTS: %q is not GENSxVIEWERS", s)
		}
		ls = append(ls, l)
	}
	if len(ls) == 1 {
		t.Run(ls[0].String(), func(t *testing.T) { vbRun(t, ls[0], tps, refs, secs) })
		return
	}
	// Several layouts: each in a process of its own (this test binary
	// again), so that no layout's memory baseline holds what the one
	// before it left behind (a stopped server stays reachable for a while).
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		t.Run(l.String(), func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^TestViewersBench$", "-test.count=1", "-test.timeout=0", "-test.v")
			cmd.Env = append(os.Environ(), "MOONJI_BENCH_LAYOUTS="+l.String())
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("layout %s: %v", l, err)
			}
		})
	}
}

type vbLayout struct{ Gens, PerGen int }

func (l vbLayout) String() string { return fmt.Sprintf("%dx%d", l.Gens, l.PerGen) }

// vbSpec is what the client process is told to do.
type vbSpec struct {
	URL     string
	Cookie  string // Cookie header of the person's session
	Key     string
	Gens    []string // inference ids
	PerGen  int
	Refs    []string // request bodies of the /v1 streams
	Out     string   // where the client writes its []vbStream (gob)
	Leavers string   // which viewers leave: "odd" (every other one, by g*PerGen+k)
}

// vbStream is what one client stream received.
type vbStream struct {
	Kind   string // "view" or "v1"
	Gen    int    // generation (view) or reference stream (v1) index
	Viewer int
	Left   bool
	Status int
	Err    string
	Seqs   []int
	Texts  []string
	At     []int64 // arrival, Unix ns, per chunk
	First  int64   // first event's arrival
	Done   bool
	DoneAt int64
}

const (
	vbClientEnv = "MOONJI_BENCH_VIEWERS_CLIENT"
	vbMarker    = "VIEWERS-BENCH "
)

// vbSnapshot is this process's memory at one moment, after GC.
type vbSnapshot struct {
	Start, At  time.Time
	Heap       uint64 // live heap (HeapAlloc right after GC)
	Stacks     uint64 // StackInuse
	RSS        uint64
	Goroutines int
	CPU        time.Duration  // user+system since start
	Groups     map[string]int // by the first three functions of the stack
	Full       map[string]int // by all of them
}

func vbSnap() vbSnapshot {
	start := time.Now()
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s := vbSnapshot{Start: start, At: time.Now(), Heap: m.HeapAlloc, Stacks: m.StackInuse, RSS: vbRSS(),
		Goroutines: runtime.NumGoroutine(), CPU: vbCPU()}
	s.Groups, s.Full = vbGoroutineGroups()
	s.At = time.Now()
	return s
}

func (s vbSnapshot) String() string {
	return fmt.Sprintf("heap %.1f MiB, stacks %.1f MiB, goroutines %d, RSS %.1f MiB",
		vbMiB(s.Heap), vbMiB(s.Stacks), s.Goroutines, vbMiB(s.RSS))
}

func vbMiB(n uint64) float64 { return float64(n) / (1 << 20) }

func vbRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func vbCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// vbGoroutineGroups counts goroutines by the functions of their stacks
// (runtime frames left out): by the first three, so two snapshots show which
// kinds came or went, and by all.
func vbGoroutineGroups() (short, full map[string]int) {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	short, full = map[string]int{}, map[string]int{}
	n := 0
	var frames []string
	flush := func() {
		if n > 0 {
			short[strings.Join(frames[:min(3, len(frames))], " < ")] += n
			full[strings.Join(frames, " < ")] += n
		}
		n, frames = 0, nil
	}
	for line := range strings.SplitSeq(buf.String(), "\n") {
		switch {
		case strings.Contains(line, " @ 0x"):
			flush()
			n, _ = strconv.Atoi(strings.Fields(line)[0])
		case strings.HasPrefix(line, "#\t"):
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			fn := f[2]
			if i := strings.LastIndex(fn, "+0x"); i > 0 {
				fn = fn[:i]
			}
			if strings.HasPrefix(fn, "runtime.") || strings.HasPrefix(fn, "internal/") {
				continue
			}
			frames = append(frames, fn)
		}
	}
	flush()
	return short, full
}

// vbGroupDiff lists the goroutine kinds whose count changed by at least min.
func vbGroupDiff(a, b vbSnapshot, min int) string {
	keys := map[string]bool{}
	for k := range a.Groups {
		keys[k] = true
	}
	for k := range b.Groups {
		keys[k] = true
	}
	type d struct {
		k string
		n int
	}
	var ds []d
	for k := range keys {
		if n := b.Groups[k] - a.Groups[k]; n >= min || -n >= min {
			ds = append(ds, d{k, n})
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].n > ds[j].n })
	var sb strings.Builder
	for _, x := range ds {
		fmt.Fprintf(&sb, "      %+5d  %s\n", x.n, x.k)
	}
	if sb.Len() == 0 {
		return "      (none)\n"
	}
	return sb.String()
}

// vbChild is the client process as the server side sees it: lines from its
// stdout, commands to its stdin.
type vbChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func (c *vbChild) send(cmd string) { fmt.Fprintln(c.in, cmd) }

// expect waits for the client's next message, which must start with word,
// and returns the rest.
func (c *vbChild) expect(t *testing.T, word string, timeout time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("client process ended while waiting for %q", word)
		}
		rest, found := strings.CutPrefix(l, word)
		if !found {
			t.Fatalf("client said %q, want %q", l, word)
		}
		return strings.TrimSpace(rest)
	case <-time.After(timeout):
		t.Fatalf("client did not say %q within %v", word, timeout)
	}
	return ""
}

func vbStartChild(t *testing.T, spec vbSpec) *vbChild {
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
	cmd := exec.Command(exe, "-test.run=^TestViewersBenchClient$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(os.Environ(), vbClientEnv+"="+path)
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
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), vbMarker); ok {
				c.lines <- l
			} else if l := sc.Text(); l != "PASS" && l != "" {
				fmt.Fprintln(os.Stderr, "client:", l)
			}
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

func vbRun(t *testing.T, l vbLayout, tps, refs, secs int) {
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	t.Cleanup(ms.Close)
	dbURL := "sqlite://" + t.TempDir() + "/viewers.db"
	if os.Getenv("MOONJI_BENCH_DB") == "postgres" {
		dsn := os.Getenv("MOONJI_TEST_POSTGRES_DSN")
		if dsn == "" {
			t.Fatal("MOONJI_BENCH_DB=postgres needs MOONJI_TEST_POSTGRES_DSN")
		}
		dbURL = freshPostgresSchema(t, dsn)
		// Without a file database the development admin's generated
		// password would go to ./data (the package directory here).
		t.Setenv("MOONJI_DEV_ADMIN_PASSWORD", "viewers-bench-admin")
	}
	cfg := &config.Config{
		DatabaseURL: dbURL,
		RateLimit:   config.RateLimit{RequestsPerMinute: 10_000_000},
		Backends:    []config.Backend{{Name: "mock", URL: ms.URL + "/v1", MaxConcurrency: 4096, MaxQueue: 4096}},
		Models:      []config.Model{{Name: "m1", Backend: "mock"}},
	}
	e := startWithConfig(t, cfg, mock, ms.URL)
	p := e.chatter("viewer@example.com")
	cookie := e.sessionCookie(p.c)
	if cookie == "" {
		t.Fatal("no session cookie")
	}
	viewers := l.Gens * l.PerGen
	// The measurements start after the last send, and sends slow down as
	// generations pile up (20 s and more for 500 on SQLite): longer streams
	// for more generations.
	tokens := tps * (secs + l.Gens/10)
	interval := time.Duration(float64(time.Second) / float64(tps)) // as the mock paces

	convs := make([]string, l.Gens)
	for i := range convs {
		convs[i] = p.newConversation()
	}
	idle := vbSnap()

	// The generations, each tagged so its start can be found in the mock. A
	// send the server refuses is counted and sent again (see the report).
	sendStart := time.Now()
	ids, contents := make([]string, l.Gens), make([]string, l.Gens)
	refused, firstRefusal := 0, ""
	for i := range ids {
		e.srv.Chat.SetExtraBody(map[string]any{"mock": map[string]any{"tag": fmt.Sprintf("gen-%d", i), "tps": tps, "tokens": tokens}})
		contents[i] = fmt.Sprintf("Tell me story number %d", i)
		b, _ := json.Marshal(map[string]string{"content": contents[i]})
		for try := 0; ; try++ {
			status, body := p.do(http.MethodPost, "/api/v1/conversations/"+convs[i]+"/messages", string(b))
			if status == http.StatusAccepted {
				var s sent
				_ = json.Unmarshal([]byte(body), &s)
				ids[i] = s.InferenceID
				break
			}
			if refused++; firstRefusal == "" {
				firstRefusal = fmt.Sprintf("send %d of %d, %v after the first: %d %s", i+1, l.Gens, time.Since(sendStart).Round(time.Millisecond), status, body)
			}
			if try == 5 {
				t.Fatalf("send refused 6 times: %d %s", status, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	sendsTook := time.Since(sendStart)
	refBodies := make([]string, refs)
	for j := range refBodies {
		refBodies[j] = fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"Reference stream %d"}],"mock":{"tag":"v1-%d","tps":%d,"tokens":%d}}`,
			j, j, tps, tokens)
	}
	out := filepath.Join(t.TempDir(), "result.gob")
	child := vbStartChild(t, vbSpec{URL: e.URL, Cookie: "moonji_session=" + cookie, Key: e.Key, Gens: ids, PerGen: l.PerGen,
		Refs: refBodies, Out: out, Leavers: "odd"})
	child.expect(t, "ready", 30*time.Second)
	readyAt := time.Now()

	// Snapshots stop the world (GC, goroutine profile): chunks due while
	// one runs are left out of the lateness figures, on both sides.
	var snaps []vbSnapshot
	snap := func() vbSnapshot { s := vbSnap(); snaps = append(snaps, s); return s }
	var before, with [3]vbSnapshot
	for i := range before {
		time.Sleep(1500 * time.Millisecond)
		before[i] = snap()
	}

	connectAt := time.Now()
	child.send("connect")
	connectedNs, _ := strconv.ParseInt(child.expect(t, "connected", 60*time.Second), 10, 64)
	connectedAt := time.Unix(0, connectedNs)
	time.Sleep(time.Second)
	for i := range with {
		time.Sleep(2500 * time.Millisecond)
		with[i] = snap()
	}

	child.send("leave")
	leftNs, _ := strconv.ParseInt(child.expect(t, "left", 30*time.Second), 10, 64)
	leftAt := time.Unix(0, leftNs)
	time.Sleep(2 * time.Second)
	after1 := snap()
	time.Sleep(10500 * time.Millisecond) // fasthttp keeps an idle worker 10-20 s
	after2 := snap()
	measuredUntil := time.Now()

	child.expect(t, "done", time.Duration(tokens/tps+120)*time.Second)
	if err := child.cmd.Wait(); err != nil {
		t.Fatalf("client process: %v", err)
	}
	clientCPU := child.cmd.ProcessState.UserTime() + child.cmd.ProcessState.SystemTime()
	// Everything has ended and the client's connections are closed: the
	// goroutines should go back to the idle count once fasthttp's idle
	// workers expire.
	var end vbSnapshot
	for deadline := time.Now().Add(25 * time.Second); ; {
		time.Sleep(500 * time.Millisecond)
		if end = vbSnap(); end.Goroutines <= idle.Goroutines+2 || time.Now().After(deadline) {
			break
		}
	}

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	var streams []vbStream
	err = gob.NewDecoder(f).Decode(&streams)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}

	// When each stream started at the mock, by tag.
	started := map[string]time.Time{}
	for _, r := range mock.Requests() {
		started[r.Tag] = r.Started
	}
	firstEnd := time.Time{}
	for i := range ids {
		st, ok := started[fmt.Sprintf("gen-%d", i)]
		if !ok {
			t.Fatalf("the mock saw no request for generation %d", i)
		}
		if end := st.Add(time.Duration(tokens) * interval); firstEnd.IsZero() || end.Before(firstEnd) {
			firstEnd = end
		}
	}
	if firstEnd.Before(measuredUntil) {
		t.Errorf("generation ended at %v, before the measurements did (%v): raise MOONJI_BENCH_VIEWERS_SECONDS",
			firstEnd.Format(time.TimeOnly), measuredUntil.Format(time.TimeOnly))
	}

	// Correctness.
	expected := make([][]string, l.Gens)
	for i := range expected {
		expected[i] = mockllm.CompletionTokens(contents[i], tokens)
	}
	refExpected := make([][]string, refs)
	for j := range refExpected {
		refExpected[j] = mockllm.CompletionTokens(fmt.Sprintf("Reference stream %d", j), tokens)
	}
	bad := 0
	complain := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	nView, nStayed, nLeft, nV1 := 0, 0, 0, 0
	full := make([][]*vbStream, l.Gens) // the viewers that stayed, by generation
	for i := range streams {
		s := &streams[i]
		want := refExpected
		if s.Kind == "view" {
			want = expected
			nView++
		} else {
			nV1++
		}
		if s.Status != http.StatusOK || s.Err != "" {
			complain("%s %d/%d: status %d, error %q", s.Kind, s.Gen, s.Viewer, s.Status, s.Err)
			continue
		}
		for k, seq := range s.Seqs {
			if seq != k+1 {
				complain("%s %d/%d: chunk %d has seq %d", s.Kind, s.Gen, s.Viewer, k+1, seq)
				break
			}
			if k >= len(want[s.Gen]) || s.Texts[k] != want[s.Gen][k] {
				complain("%s %d/%d: chunk %d is %q, want the mock's %q", s.Kind, s.Gen, s.Viewer, k+1, s.Texts[k], want[s.Gen][min(k, len(want[s.Gen])-1)])
				break
			}
		}
		switch {
		case s.Left:
			nLeft++
			if s.Done {
				complain("%s %d/%d left but got the end", s.Kind, s.Gen, s.Viewer)
			}
		case !s.Done || len(s.Seqs) != tokens:
			complain("%s %d/%d: %d chunks, done %v; want all %d and the end", s.Kind, s.Gen, s.Viewer, len(s.Seqs), s.Done, tokens)
		case s.Kind == "view":
			nStayed++
			full[s.Gen] = append(full[s.Gen], s)
		}
	}
	// Every viewer that stayed received the identical sequence.
	for g, vs := range full {
		for _, v := range vs[min(1, len(vs)):] {
			if !slices.Equal(v.Texts, vs[0].Texts) || !slices.Equal(v.Seqs, vs[0].Seqs) {
				complain("generation %d: viewers %d and %d received different sequences", g, vs[0].Viewer, v.Viewer)
			}
		}
	}
	if nView != viewers || nV1 != refs {
		t.Errorf("client reported %d viewers and %d /v1 streams, want %d and %d", nView, nV1, viewers, refs)
	}
	// What each generation saved (its final save may still be under way).
	savedBy := time.Now().Add(10 * time.Second)
	for i, conv := range convs {
		var m apiMessage
		for {
			c := p.conversation(conv)
			m = c.Messages[len(c.Messages)-1]
			if m.Status != models.MessageStreaming || time.Now().After(savedBy) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if want := strings.Join(expected[i], ""); m.Status != models.MessageDone || m.Content != want {
			complain("generation %d saved as %q with %d bytes, want done with %d", i, m.Status, len(m.Content), len(want))
		}
	}

	// Lateness of each chunk against the mock's schedule.
	due := func(tag string, seq int) time.Time { return started[tag].Add(time.Duration(seq) * interval) }
	overlapsSnap := func(from, to time.Time) bool {
		for _, s := range snaps {
			if to.After(s.Start.Add(-5*time.Millisecond)) && from.Before(s.At.Add(50*time.Millisecond)) {
				return true
			}
		}
		return false
	}
	nearSnap := func(d time.Time) bool { return overlapsSnap(d, d) }
	winFrom, winTo := connectedAt.Add(500*time.Millisecond), leftAt
	quietFrom, quietTo := readyAt.Add(500*time.Millisecond), connectAt
	var viewLate, refLate, refQuiet, doneLate, refDoneLate, viewGap, refGap []time.Duration
	spread := map[[2]int][2]int64{} // (gen, seq) → first and last arrival among its viewers
	for i := range streams {
		s := &streams[i]
		tag := fmt.Sprintf("gen-%d", s.Gen)
		if s.Kind == "v1" {
			tag = fmt.Sprintf("v1-%d", s.Gen)
		}
		var gap time.Duration // the longest wait between two chunks received in the window
		for k, seq := range s.Seqs {
			d := due(tag, seq)
			if prev, at := time.Unix(0, s.At[max(k-1, 0)]), time.Unix(0, s.At[k]); k > 0 && prev.After(winFrom) && at.Before(winTo) && !overlapsSnap(prev, at) {
				gap = max(gap, time.Duration(s.At[k]-s.At[k-1]))
			}
			if nearSnap(d) {
				continue
			}
			late := time.Duration(s.At[k] - d.UnixNano())
			switch {
			case !d.Before(winFrom) && d.Before(winTo):
				if s.Kind == "view" {
					viewLate = append(viewLate, late)
					key := [2]int{s.Gen, seq}
					fl, ok := spread[key]
					if !ok {
						fl = [2]int64{s.At[k], s.At[k]}
					}
					fl[0], fl[1] = min(fl[0], s.At[k]), max(fl[1], s.At[k])
					spread[key] = fl
				} else {
					refLate = append(refLate, late)
				}
			case s.Kind == "v1" && !d.Before(quietFrom) && d.Before(quietTo):
				refQuiet = append(refQuiet, late)
			}
		}
		if s.Kind == "view" {
			viewGap = append(viewGap, gap)
		} else {
			refGap = append(refGap, gap)
		}
		if s.Done {
			late := time.Duration(s.DoneAt - due(tag, tokens).UnixNano())
			if s.Kind == "view" {
				doneLate = append(doneLate, late)
			} else {
				refDoneLate = append(refDoneLate, late)
			}
		}
	}
	var spreads []time.Duration
	for _, fl := range spread {
		spreads = append(spreads, time.Duration(fl[1]-fl[0]))
	}
	// What the done event costs: each viewer's Follower.Next asks
	// Service.RenderFinal for the final message's HTML (cached once rendered).
	renderStart := time.Now()
	const renders = 20
	for range renders {
		_ = markdown.Render(strings.Join(expected[0], ""))
	}
	renderOnce := time.Since(renderStart) / renders

	// Report.
	w := os.Stderr
	perViewer := func(a, b vbSnapshot, n int) string {
		if n == 0 {
			return "-"
		}
		return fmt.Sprintf("heap %.1f KiB + stacks %.1f KiB, %.2f goroutines, RSS %.1f KiB",
			(float64(b.Heap)-float64(a.Heap))/1024/float64(n), (float64(b.Stacks)-float64(a.Stacks))/1024/float64(n),
			float64(b.Goroutines-a.Goroutines)/float64(n), (float64(b.RSS)-float64(a.RSS))/1024/float64(n))
	}
	cpuPct := func(a, b vbSnapshot) float64 { return 100 * float64(b.CPU-a.CPU) / float64(b.At.Sub(a.At)) }
	slope := func(a, b vbSnapshot) float64 { return (float64(b.Heap) - float64(a.Heap)) / b.At.Sub(a.At).Seconds() }
	// The first snapshot after the start still finds garbage of it (a few
	// MiB in some runs): the generations' own growth is from the second on.
	genSlope, viewSlope := slope(before[1], before[2]), slope(with[0], with[2])
	fmt.Fprintf(w, "\n== %s: %d generations × %d viewers = %d viewers, %d tok/s, %d tokens each, %d /v1 streams, %s (GOMAXPROCS %d, GOGC %s)\n",
		l, l.Gens, l.PerGen, viewers, tps, tokens, refs, e.DB.Dialector.Name(), runtime.GOMAXPROCS(0), cmp.Or(os.Getenv("GOGC"), "100"))
	fmt.Fprintf(w, "  %d sends took %v (%d refused and sent again); %d viewers connected (first event) in %v\n", l.Gens,
		sendsTook.Round(time.Millisecond), refused, viewers, connectedAt.Sub(connectAt).Round(time.Millisecond))
	if refused > 0 {
		fmt.Fprintf(w, "  DEFECT: chat sends refused while generations run: %d; first: %s\n", refused, firstRefusal)
	}
	fmt.Fprintf(w, "  idle       %s\n", idle)
	for i, s := range before {
		fmt.Fprintf(w, "  before %d   %s\n", i+1, s)
	}
	for i, s := range with {
		fmt.Fprintf(w, "  with %d     %s\n", i+1, s)
	}
	fmt.Fprintf(w, "  half left  %s (+2 s)\n             %s (+12.5 s)\n  end        %s\n", after1, after2, end)
	fmt.Fprintf(w, "  per viewer (with 1 − before 3): %s\n", perViewer(before[2], with[0], viewers))
	fmt.Fprintf(w, "  per viewer (with 3 − before 3): %s\n", perViewer(before[2], with[2], viewers))
	fmt.Fprintf(w, "  per viewer that left (with 3 − half left): +2 s %s | +12.5 s %s\n",
		perViewer(after1, with[2], nLeft), perViewer(after2, with[2], nLeft))
	fmt.Fprintf(w, "  heap over time: generations alone %+.1f KiB/s; with viewers %+.1f KiB/s over %.1f s (%+.2f B per viewer per chunk beyond the generations')\n",
		genSlope/1024, viewSlope/1024, with[2].At.Sub(with[0].At).Seconds(), (viewSlope-genSlope)/float64(viewers)/float64(tps))
	fmt.Fprintf(w, "  server CPU %.0f%% before viewers, %.0f%% with them; client process CPU %v in all\n",
		cpuPct(before[0], before[2]), cpuPct(with[0], with[2]), clientCPU.Round(10*time.Millisecond))
	dist := func(d []time.Duration) string {
		if len(d) == 0 {
			return "(none)"
		}
		return fmt.Sprintf("p50 %v p95 %v p99 %v max %v (n=%d)", rd(pct(d, 50)), rd(pct(d, 95)), rd(pct(d, 99)), rd(slices.Max(d)), len(d))
	}
	fmt.Fprintf(w, "  chunk lateness vs the mock's schedule, %.1f s window with all viewers (chunks due during a snapshot left out):\n", winTo.Sub(winFrom).Seconds())
	fmt.Fprintf(w, "    viewers  %s\n    /v1      %s\n    added    p50 %v p95 %v p99 %v\n",
		dist(viewLate), dist(refLate), rd(pct(viewLate, 50)-pct(refLate, 50)), rd(pct(viewLate, 95)-pct(refLate, 95)), rd(pct(viewLate, 99)-pct(refLate, 99)))
	fmt.Fprintf(w, "    /v1 before any viewer (%.1f s): %s\n", quietTo.Sub(quietFrom).Seconds(), dist(refQuiet))
	fmt.Fprintf(w, "    longest pause per stream (schedule: %v; pauses over a snapshot left out): viewers %s | /v1 %s\n", rd(interval), dist(viewGap), dist(refGap))
	if l.PerGen > 1 {
		fmt.Fprintf(w, "    first → last viewer of a generation, per chunk: %s\n", dist(spreads))
	}
	fmt.Fprintf(w, "  end of stream (done event / [DONE]) vs the last chunk's schedule: viewers %s | /v1 %s\n", dist(doneLate), dist(refDoneLate))
	fmt.Fprintf(w, "  rendering one final answer (%d bytes) takes %v uncached; %d viewers stayed for the done event\n",
		len(strings.Join(expected[0], "")), rd(renderOnce), nStayed)
	fmt.Fprintf(w, "  checked: %d viewers (%d stayed to the end, %d left), %d /v1 streams, %d saved messages; %d problems\n",
		nView, nStayed, nLeft, nV1, len(convs), bad)
	fmt.Fprintf(w, "  goroutine kinds, before → with viewers:\n%s", vbGroupDiff(before[2], with[0], max(viewers/10, 2)))
	fmt.Fprintf(w, "  goroutine kinds, with → 12.5 s after %d left:\n%s", nLeft, vbGroupDiff(with[2], after2, max(nLeft/10, 2)))
	fmt.Fprintf(w, "  goroutine kinds, idle → end:\n%s", vbGroupDiff(idle, end, 3))

	// A viewer that left must not stay on the server: its handler's two
	// goroutines and the fasthttp worker copying its stream end, at the next
	// failed write. (The worker itself then idles in fasthttp's pool for
	// 10-20 s, so total counts fall later.) A generation that writes nothing
	// for a while (the stalls of the 500x1 layout) keeps its departed viewer
	// until it writes again: only what is left at the end fails the test.
	for _, kind := range []string{"GenerationEvents", "writeBodyStream"} {
		// The /v1 streams' workers are in writeBodyStream too: base.
		base, n, after, atEnd := vbCount(before[2], kind), vbCount(with[2], kind), vbCount(after2, kind), vbCount(end, kind)
		each := (n - base + viewers/2) / viewers
		want := base + each*(viewers-nLeft)
		fmt.Fprintf(w, "  goroutines in %s: %d before viewers, %d with %d viewers, %d after %d left (+12.5 s; %d expected), %d at the end\n",
			kind, base, n, viewers, after, nLeft, want, atEnd)
		if atEnd > 0 {
			t.Errorf("%d goroutines in %s after every stream ended", atEnd, kind)
		}
	}
}

// vbCount counts the goroutines whose stack names fn.
func vbCount(s vbSnapshot, fn string) int {
	n := 0
	for k, c := range s.Full {
		if strings.Contains(k, fn) {
			n += c
		}
	}
	return n
}

func rd(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Millisecond || d <= -10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}

// TestViewersBenchClient is the client side of TestViewersBench, which runs
// it in a process of its own; otherwise it is skipped.
func TestViewersBenchClient(t *testing.T) {
	path := os.Getenv(vbClientEnv)
	if path == "" {
		t.Skip("the client process of TestViewersBench")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec vbSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if err := vbClient(spec); err != nil {
		t.Fatal(err)
	}
}

func vbClient(spec vbSpec) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 8192, MaxIdleConnsPerHost: 8192, DisableCompression: true}}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(vbMarker+format+"\n", args...)
	}
	in := bufio.NewScanner(os.Stdin)
	wait := func(cmd string) error {
		for in.Scan() {
			if in.Text() == cmd {
				return nil
			}
		}
		return fmt.Errorf("stdin closed before %q", cmd)
	}

	var results []*vbStream
	var all sync.WaitGroup
	started := make(chan error, len(spec.Refs)+len(spec.Gens)*spec.PerGen)
	for j, body := range spec.Refs {
		r := &vbStream{Kind: "v1", Gen: j}
		results = append(results, r)
		all.Add(1)
		go func() { defer all.Done(); vbReadV1(client, spec, body, r, started) }()
	}
	for range spec.Refs {
		if err := <-started; err != nil {
			return err
		}
	}
	say("ready")
	if err := wait("connect"); err != nil {
		return err
	}
	leave := make(chan struct{})
	var leavers sync.WaitGroup
	for g, id := range spec.Gens {
		for k := range spec.PerGen {
			r := &vbStream{Kind: "view", Gen: g, Viewer: k}
			results = append(results, r)
			var lv chan struct{}
			if spec.Leavers == "odd" && (g*spec.PerGen+k)%2 == 1 {
				lv = leave
				leavers.Add(1)
			}
			all.Add(1)
			go func() {
				defer all.Done()
				if lv != nil {
					defer leavers.Done()
				}
				vbReadEvents(client, spec, id, r, lv, started)
			}()
		}
	}
	for range len(spec.Gens) * spec.PerGen {
		if err := <-started; err != nil {
			return err
		}
	}
	say("connected %d", time.Now().UnixNano())
	if err := wait("leave"); err != nil {
		return err
	}
	leftAt := time.Now().UnixNano()
	close(leave)
	leavers.Wait()
	say("left %d", leftAt)
	all.Wait()
	vals := make([]vbStream, len(results))
	for i, r := range results {
		vals[i] = *r
	}
	f, err := os.Create(spec.Out)
	if err != nil {
		return err
	}
	if err := gob.NewEncoder(f).Encode(vals); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	say("done")
	return nil
}

// vbOpen sends req and, unless it answers 200, records why in r and on
// started (the answer is then closed).
func vbOpen(client *http.Client, req *http.Request, r *vbStream, started chan<- error, what string) (*http.Response, bool) {
	resp, err := client.Do(req)
	if err != nil {
		r.Err = err.Error()
		started <- err
		return nil, false
	}
	r.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		r.Err = readAllString(resp.Body)
		resp.Body.Close()
		started <- fmt.Errorf("%s: %d %s", what, resp.StatusCode, r.Err)
		return nil, false
	}
	return resp, true
}

// vbReadV1 reads one /v1 stream; started gets nil once the answer's headers
// are in (or the error).
func vbReadV1(client *http.Client, spec vbSpec, body string, r *vbStream, started chan<- error) {
	req, _ := http.NewRequest(http.MethodPost, spec.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+spec.Key)
	resp, ok := vbOpen(client, req, r, started, "/v1 stream")
	if !ok {
		return
	}
	defer resp.Body.Close()
	started <- nil
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		now := time.Now().UnixNano()
		if payload, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			payload = bytes.TrimSpace(payload)
			if r.First == 0 {
				r.First = now
			}
			if string(payload) == "[DONE]" {
				r.Done, r.DoneAt = true, now
			} else if c := gjson.GetBytes(payload, "choices.0.delta.content"); c.Str != "" {
				r.Seqs = append(r.Seqs, len(r.Seqs)+1)
				r.Texts = append(r.Texts, c.Str)
				r.At = append(r.At, now)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.Err = err.Error()
			}
			return
		}
	}
}

// vbReadEvents follows a generation's events as a browser's EventSource
// does; started gets nil at the first event. When leave is not nil the
// viewer goes away (closes its connection) as soon as leave closes.
func vbReadEvents(client *http.Client, spec vbSpec, id string, r *vbStream, leave <-chan struct{}, started chan<- error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, spec.URL+"/api/v1/generations/"+id+"/events", nil)
	req.Header.Set("Cookie", spec.Cookie)
	req.Header.Set("Accept", "text/event-stream")
	resp, ok := vbOpen(client, req, r, started, "events")
	if !ok {
		return
	}
	defer resp.Body.Close()
	var gone sync.WaitGroup
	stop := make(chan struct{})
	left := false // set by the goroutine below, read after it ended
	if leave != nil {
		gone.Add(1)
		go func() {
			defer gone.Done()
			select {
			case <-leave:
				left = true
				cancel()
			case <-stop:
			}
		}()
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var event, evID string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			now := time.Now().UnixNano()
			switch event {
			case "chunk":
				seq, _ := strconv.Atoi(evID)
				r.Seqs = append(r.Seqs, seq)
				r.Texts = append(r.Texts, html.UnescapeString(strings.Join(data, "\n")))
				r.At = append(r.At, now)
			case "done":
				r.Done, r.DoneAt = true, now
			}
			if event != "" && r.First == 0 {
				r.First = now
				started <- nil
			}
			event, evID, data = "", "", nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			evID = line[4:]
		case strings.HasPrefix(line, "event: "):
			event = line[7:]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[6:])
		}
	}
	close(stop)
	gone.Wait()
	r.Left = left
	if r.First == 0 {
		started <- fmt.Errorf("events of %s ended before any event: %v", id, sc.Err())
	}
	if err := sc.Err(); err != nil && !r.Left {
		r.Err = err.Error()
	}
}

func readAllString(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 4096))
	return string(b)
}

// Package connwatch notices when an HTTP client hangs up while its request
// is still being served. fasthttp (under Fiber) gives no such signal: a
// disconnect shows only as a failed write, which never comes while the engine
// is still thinking. A watcher parks on the socket in the runtime's network
// poller and, each time the socket changes (bytes, FIN or RST arrive), peeks
// (MSG_PEEK) and reads the TCP state. Nothing is consumed from the
// connection, and no CPU is spent while nothing happens.
//
// Three things look alike from the socket and are told apart:
//   - bytes after the request (a pipelined request, or junk): the client is
//     still there; the watch goes on, and a later FIN or RST is still seen
//     (the TCP state says so even while those bytes sit unread);
//   - an RST: the client is gone;
//   - a FIN: the client will send nothing more, but it may still read (a
//     half-closed client) or be gone. Only writing tells: a socket that was
//     closed answers data with an RST. Before the answer starts, the watcher
//     writes an interim response (HTTP/1.1 102) that any HTTP/1.1 client must
//     accept; after it starts, the answer's own bytes are the probe.
//
// Telling bytes-then-FIN from bytes alone needs the socket's TCP state,
// which only Linux gives (TCP_INFO); elsewhere the watch uses only portable
// calls and a client that sent bytes after its request and then left is
// noticed when the answer is written, not before. On systems without
// Berkeley sockets (Windows) nothing is watched.
package connwatch

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// InterimProbe is the probe for an HTTP/1.1 client that has half-closed
// before its answer started: an interim response it must skip (RFC 9110
// 15.2), which a client that is gone answers with an RST.
var InterimProbe = []byte("HTTP/1.1 102 Processing\r\n\r\n")

// Watcher watches one connection for its peer going away.
type Watcher struct {
	conn    net.Conn
	rc      syscall.RawConn
	onClose func()
	done    chan struct{}
	stop    sync.Once
	// due is when a delayed watch (WatchAfter) starts.
	due time.Time

	mu sync.Mutex
	// probe may be written to the client while the answer has not started;
	// nil when there is none, or once StopProbing was called.
	probe []byte
	// canProbe tells whether a probe was ever allowed: without one, a FIN
	// before the answer counts as the client leaving (HTTP/1.0, tests).
	canProbe bool
	probed   bool
	// waiting: a delayed watch not yet handed to its goroutine. watching
	// is set once the watch has cleared the read deadline and is about to
	// park on the socket; stopped once Stop has begun. All are decided
	// under mu, so a delayed start and a Stop never both go ahead.
	waiting, watching, stopped bool
}

// Watch calls onClose (once, from another goroutine) if the peer of conn
// goes away before Stop is called. probe, when not nil, is written to a peer
// that half-closes before StopProbing, to learn whether it still reads.
// Connections that expose no file descriptor (TLS, in-memory) are not
// watched: onClose is then never called. The returned Watcher's methods are
// safe on nil.
func Watch(conn net.Conn, probe []byte, onClose func()) *Watcher {
	return WatchAfter(0, conn, probe, onClose)
}

// WatchAfter is Watch, with the watch starting only once delay has passed
// (up to startTick later). A request answered sooner costs a place in a
// list instead of a goroutine, a system call and the wake-ups to start and
// end a watch; a peer that left meanwhile is noticed when the watch starts
// (its FIN or RST is already there), so at most delay + startTick late.
func WatchAfter(delay time.Duration, conn net.Conn, probe []byte, onClose func()) *Watcher {
	if !watchable {
		return nil
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &Watcher{conn: conn, rc: rc, onClose: onClose, done: make(chan struct{}), probe: probe, canProbe: probe != nil}
	if delay <= 0 {
		go w.run()
	} else {
		w.due, w.waiting = time.Now().Add(delay), true
		starter.add(w)
	}
	return w
}

// startTick is how often the delayed watches that fell due are started.
const startTick = 10 * time.Millisecond

// starter starts the delayed watches of the process: one goroutine and
// one ticker for all of them, not a runtime timer each. A timer per
// request is cheap on its own, but one earlier than any other wakes the
// runtime's network poller thread to re-arm it (an eventfd write and a
// thread switch, on the path of a sequential client's every request).
var starter = watchStarter{}

type watchStarter struct {
	mu      sync.Mutex
	waiting []*Watcher
	running bool // the ticking goroutine runs
}

func (s *watchStarter) add(w *Watcher) {
	s.mu.Lock()
	s.waiting = append(s.waiting, w)
	if !s.running {
		s.running = true
		go s.loop()
	}
	s.mu.Unlock()
}

// loop starts the watches that fell due, drops the stopped ones, and ends
// after a second with none waiting.
func (s *watchStarter) loop() {
	t := time.NewTicker(startTick)
	defer t.Stop()
	idle := 0
	var due []*Watcher
	for now := range t.C {
		s.mu.Lock()
		kept := s.waiting[:0]
		for _, w := range s.waiting {
			switch {
			case w.isStopped():
			case !w.due.After(now):
				due = append(due, w)
			default:
				kept = append(kept, w)
			}
		}
		clear(s.waiting[len(kept):]) // let go of the watchers dropped
		s.waiting = kept
		if len(kept) == 0 && len(due) == 0 {
			idle++
		} else {
			idle = 0
		}
		if idle >= int(time.Second/startTick) {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		for i, w := range due {
			w.start()
			due[i] = nil
		}
		due = due[:0]
	}
}

func (w *Watcher) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// start hands a delayed watch to its goroutine, unless it was stopped.
func (w *Watcher) start() {
	w.mu.Lock()
	begin := !w.stopped && w.waiting
	w.waiting = false
	w.mu.Unlock()
	if begin {
		go w.run()
	}
}

// run is the watch: it parks on the socket until the peer is gone or Stop
// wakes it.
func (w *Watcher) run() {
	defer close(w.done)
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	// The server left the read deadline it set for reading the request; a
	// parked watcher would give up at it, and inference often takes longer.
	// Cleared under mu, so that Stop's expired deadline always comes after.
	_ = w.conn.SetReadDeadline(time.Time{})
	w.watching = true
	w.mu.Unlock()
	if w.peerGone(w.rc) {
		w.onClose()
	}
}

// StopProbing is called before the server writes the answer: from then on
// only the answer's bytes are written, and they are the probe. It waits for
// a probe being written to be out.
func (w *Watcher) StopProbing() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.probe = nil
	w.mu.Unlock()
}

// Stop ends the watch and waits for the watcher to let go of the socket; it
// must be called before the server reads from the connection again, and may
// be called more than once.
func (w *Watcher) Stop() {
	if w == nil {
		return
	}
	w.stop.Do(func() {
		w.mu.Lock()
		w.stopped = true
		if w.waiting {
			// The watch never started, and now never will (the starter
			// drops it): the socket was not touched.
			w.mu.Unlock()
			return
		}
		watching := w.watching
		w.mu.Unlock()
		if !watching {
			<-w.done // a delayed start that now sees stopped and returns
			return
		}
		// An expired deadline wakes the parked watcher. The server then
		// needs a deadline again: fasthttp skips re-arming one it thinks
		// is still recent, so leave a generous one rather than none,
		// which would let an idle keep-alive connection live forever.
		_ = w.conn.SetReadDeadline(time.Unix(1, 0))
		<-w.done
		_ = w.conn.SetReadDeadline(time.Now().Add(RestoredDeadline))
	})
}

// RestoredDeadline is the read deadline a connection gets when a watch
// ends; the server sets its own when it next reads a request.
const RestoredDeadline = 2 * time.Minute

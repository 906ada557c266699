// Package connwatch notices when an HTTP client hangs up while its request
// is still being served. fasthttp (under Fiber) gives no such signal: a
// disconnect shows only as a failed write, which never comes while the engine
// is still thinking. A watcher parks on the socket in the runtime's network
// poller and peeks (MSG_PEEK) when it turns readable: zero bytes means the
// peer closed. Nothing is consumed from the connection, and no CPU is spent
// while nothing happens.
package connwatch

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// Watch calls onClose (once, from another goroutine) if the peer of conn
// closes the connection before stop is called. stop ends the watch and waits
// for the watcher to let go of the socket; it must be called before the
// server reads from conn again, and may be called more than once.
// Connections that expose no file descriptor (TLS, in-memory) are not
// watched: onClose is then never called.
func Watch(conn net.Conn, onClose func()) (stop func()) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if peerClosed(rc) {
			onClose()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			// An expired deadline wakes the parked watcher. The server then
			// needs a deadline again: fasthttp skips re-arming one it thinks
			// is still recent, so leave a generous one rather than none,
			// which would let an idle keep-alive connection live forever.
			_ = conn.SetReadDeadline(time.Unix(1, 0))
			<-done
			_ = conn.SetReadDeadline(time.Now().Add(RestoredDeadline))
		})
	}
}

// RestoredDeadline is the read deadline a connection gets when a watch
// ends; the server sets its own when it next reads a request.
const RestoredDeadline = 2 * time.Minute

// peerClosed blocks until the socket is readable or its read deadline
// passes, and reports whether the peer closed it.
func peerClosed(rc syscall.RawConn) bool {
	var closed bool
	var buf [1]byte
	err := rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			return false // nothing yet: park in the poller until readable
		case err != nil:
			closed = true // reset by peer, or another fatal socket error
		case n == 0:
			closed = true // orderly shutdown (FIN)
		}
		// n > 0: the client sent more bytes (a pipelined request). It is
		// still there; stop watching rather than consume them.
		return true
	})
	return err == nil && closed
}

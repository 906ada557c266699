//go:build unix

package connwatch

import (
	"errors"
	"os"
	"syscall"
)

// watchable: the socket can be peeked at without consuming anything.
const watchable = true

// peerGone blocks until the peer is gone (true) or the watch is stopped
// (false).
func (w *Watcher) peerGone(rc syscall.RawConn) bool {
	var gone bool
	err := rc.Read(func(fd uintptr) bool {
		gone = w.check(int(fd))
		return gone
	})
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		// The poller reported an error on the socket: look once more.
		_ = rc.Control(func(fd uintptr) { gone = w.check(int(fd)) })
	}
	return gone
}

// check looks at the socket without consuming anything and reports whether
// the peer is gone. Returning false parks the watcher until the socket's
// next change: the poller is edge-triggered, so bytes already seen do not
// wake it again, but a FIN or an RST does.
func (w *Watcher) check(fd int) bool {
	var buf [1]byte
	n, _, err := syscall.Recvfrom(fd, buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
		return false // nothing pending: the client is there
	case err != nil:
		return true // reset by peer, or another fatal socket error
	case n > 0:
		// Bytes are waiting unread; the TCP state tells whether a FIN or an
		// RST came after them.
		switch tcpStateOf(fd) {
		case stateOpen, stateUnknown:
			// Unknown: the bytes hide whether the client left after them;
			// writing the answer will tell.
			return false
		case statePeerFinished:
			return w.finished(fd)
		default:
			return true
		}
	}
	return w.finished(fd) // n == 0: a FIN with nothing before it
}

// finished handles a peer that will send nothing more: gone, or half-closed
// and still reading. It reports true only when that cannot be found out.
func (w *Watcher) finished(fd int) bool {
	if tcpStateOf(fd) == stateReset {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.canProbe {
		return true
	}
	if w.probed {
		return false // probed already: an RST will wake the watcher
	}
	w.probed = true
	if w.probe != nil {
		// The socket has had nothing written yet, so this small write goes
		// straight into its empty buffer; a peer that closed answers with
		// an RST, which wakes the watcher.
		if _, err := syscall.Write(fd, w.probe); err != nil && !errors.Is(err, syscall.EAGAIN) {
			return true
		}
	}
	// After StopProbing, the answer's own bytes are the probe.
	return false
}

// tcpState is what the watcher needs to know of a socket's TCP state.
type tcpState uint8

const (
	stateUnknown      tcpState = iota // the system does not say
	stateOpen                         // ESTABLISHED
	statePeerFinished                 // CLOSE_WAIT: the peer sent a FIN
	stateReset                        // CLOSE: an RST came, or unreadable
	stateOther                        // any other state: the connection is ending
)

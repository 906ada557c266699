//go:build unix

package proxy

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// answerReader is what an engine connection's buffered reader reads from.
// A request handed to send is written by the next Read, which then waits
// for the answer in the runtime's network poller before it reads: the
// usual write, then read, spends a read(2) that finds nothing (the engine
// has not answered yet) on every request, one system call in about eleven
// of a proxied request's (BENCHMARKS.md §33).
//
// This is safe from lost wake-ups because syscall.RawConn.Read forgets the
// socket's earlier readiness before it first calls back (it resets the
// poll descriptor): the request is written in that first call back, so
// any answer arrives after the reset and wakes the wait.
type answerReader struct {
	conn net.Conn
	rc   syscall.RawConn // nil: the connection has no descriptor (TLS)
	out  [][]byte        // what is left of the request, until a Read writes it
	bufs [2][]byte       // out's backing: a request allocates nothing
	// sent is called once the request is written, before the wait for
	// the answer (Client.PostSent).
	sent func()

	// One Read through rc: its call back (readable, a method value made
	// once) and the state it leaves, kept here rather than in a closure's
	// variables, which would each be allocated per request.
	readable        func(fd uintptr) bool
	p               []byte
	n               int
	werr, rerr      error
	written, halted bool
}

// sysRead is read(2) for the answer's first bytes; tests count the calls.
var sysRead = syscall.Read

func newAnswerReader(c net.Conn) *answerReader {
	r := &answerReader{conn: c}
	r.readable = r.onReadable
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			r.rc = rc
		}
	}
	return r
}

// send hands the request to the next Read, or writes it at once when the
// connection has no descriptor to wait on.
func (r *answerReader) send(header, body []byte, sent func()) error {
	if r.rc == nil {
		bufs := net.Buffers{header, body}
		if _, err := bufs.WriteTo(r.conn); err != nil {
			return err
		}
		if sent != nil {
			sent()
		}
		return nil
	}
	r.sent = sent
	r.bufs = [2][]byte{header, body}
	r.out = r.bufs[:1]
	if len(body) > 0 {
		r.out = r.bufs[:2]
	}
	return nil
}

func (r *answerReader) Read(p []byte) (int, error) {
	if len(r.out) == 0 {
		return r.conn.Read(p)
	}
	r.p, r.n, r.werr, r.rerr, r.written, r.halted = p, 0, nil, nil, false, false
	err := r.rc.Read(r.readable)
	n, werr, rerr := r.n, r.werr, r.rerr
	r.p, r.werr, r.rerr = nil, nil, nil
	switch {
	case werr != nil:
		r.clear()
		r.sent = nil
		return 0, r.opError("write", os.NewSyscallError("writev", werr))
	case r.halted:
		// The rest of the request goes the usual way, which waits for room
		// in the socket and keeps the connection's write deadline.
		bufs := append(net.Buffers(nil), r.out...) // a copy: out's backing is cleared
		r.clear()
		if _, err := bufs.WriteTo(r.conn); err != nil {
			r.sent = nil
			return 0, err
		}
		r.notifySent()
		return r.conn.Read(p)
	case err != nil:
		// The wait ended: a deadline, or the connection closed under it
		// (net has already made it a *net.OpError).
		r.clear()
		r.sent = nil
		return 0, err
	case rerr != nil:
		return 0, r.opError("read", os.NewSyscallError("read", rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// onReadable is RawConn.Read's call back: the first call writes the
// request and asks to wait; the next ones read, until a read finds bytes,
// the end or an error.
func (r *answerReader) onReadable(fd uintptr) bool {
	if !r.written {
		r.written = true
		if r.werr = r.write(int(fd)); r.werr != nil || len(r.out) > 0 {
			r.halted = true // failed, or the socket is full: finished by Read
			return true
		}
		r.notifySent()
		return false // wait for the answer
	}
	for {
		r.n, r.rerr = sysRead(int(fd), r.p)
		if r.rerr != syscall.EINTR {
			break
		}
	}
	return r.rerr != syscall.EAGAIN
}

// notifySent calls (and forgets) the request's sent.
func (r *answerReader) notifySent() {
	if f := r.sent; f != nil {
		r.sent = nil
		f()
	}
}

// clear forgets the request (and lets go of its buffers).
func (r *answerReader) clear() {
	r.out, r.bufs = nil, [2][]byte{}
}

// write writes as much of r.out as the socket takes, leaving the rest (if
// any) in r.out.
func (r *answerReader) write(fd int) error {
	for len(r.out) > 0 {
		n, err := writev(fd, r.out)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return nil
		}
		if err != nil {
			return err
		}
		for n > 0 && len(r.out) > 0 {
			if n < len(r.out[0]) {
				r.out[0] = r.out[0][n:]
				break
			}
			n -= len(r.out[0])
			r.out = r.out[1:]
		}
		if len(r.out) > 0 {
			return nil // a short write: the socket is full
		}
	}
	r.clear() // a kept connection holds no request's buffers
	return nil
}

// writev is writev(2) of at most two buffers, its vector on the stack
// (unix.Writev allocates one per call).
func writev(fd int, bufs [][]byte) (int, error) {
	var iov [2]syscall.Iovec
	n := 0
	for _, b := range bufs {
		if len(b) == 0 || n == len(iov) {
			continue
		}
		iov[n].Base = &b[0]
		iov[n].SetLen(len(b))
		n++
	}
	if n == 0 {
		return 0, nil
	}
	w, _, errno := syscall.Syscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	if errno != 0 {
		return int(w), errno
	}
	return int(w), nil
}

// opError wraps a failed system call as the connection's own Read or
// Write would have.
func (r *answerReader) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: r.conn.LocalAddr(), Addr: r.conn.RemoteAddr(), Err: err}
}

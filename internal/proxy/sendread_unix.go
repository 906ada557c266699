//go:build unix

package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
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
	out  [][]byte        // the request, until the next Read writes it
}

// sysRead is read(2) for the answer's first bytes; tests count the calls.
var sysRead = syscall.Read

func newAnswerReader(c net.Conn) *answerReader {
	r := &answerReader{conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			r.rc = rc
		}
	}
	return r
}

// send hands the request to the next Read, or writes it at once when the
// connection has no descriptor to wait on.
func (r *answerReader) send(header, body []byte) error {
	if r.rc == nil {
		bufs := net.Buffers{header, body}
		_, err := bufs.WriteTo(r.conn)
		return err
	}
	r.out = append(r.out[:0], header)
	if len(body) > 0 {
		r.out = append(r.out, body)
	}
	return nil
}

func (r *answerReader) Read(p []byte) (int, error) {
	if len(r.out) == 0 {
		return r.conn.Read(p)
	}
	var (
		n            int
		werr, rerr   error
		sent, halted bool
	)
	err := r.rc.Read(func(fd uintptr) bool {
		if !sent {
			sent = true
			if werr = r.write(int(fd)); werr != nil || len(r.out) > 0 {
				halted = true // failed, or the socket is full: finished below
				return true
			}
			return false // wait for the answer
		}
		for {
			n, rerr = sysRead(int(fd), p)
			if rerr != syscall.EINTR {
				break
			}
		}
		return rerr != syscall.EAGAIN
	})
	switch {
	case werr != nil:
		r.out = r.out[:0]
		return 0, r.opError("write", os.NewSyscallError("writev", werr))
	case halted:
		// The rest of the request goes the usual way, which waits for room
		// in the socket and keeps the connection's write deadline.
		bufs := net.Buffers(r.out)
		r.out = r.out[:0]
		if _, err := bufs.WriteTo(r.conn); err != nil {
			return 0, err
		}
		return r.conn.Read(p)
	case err != nil:
		// The wait ended: a deadline, or the connection closed under it.
		r.out = r.out[:0]
		return 0, r.opError("read", err)
	case rerr != nil:
		return 0, r.opError("read", os.NewSyscallError("read", rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// write writes as much of r.out as the socket takes, leaving the rest (if
// any) in r.out.
func (r *answerReader) write(fd int) error {
	for len(r.out) > 0 {
		n, err := unix.Writev(fd, r.out)
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
	return nil
}

func (r *answerReader) opError(op string, err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: r.conn.LocalAddr(), Addr: r.conn.RemoteAddr(), Err: err}
}

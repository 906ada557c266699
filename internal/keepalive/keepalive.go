// Package keepalive keeps a quiet Server-Sent Events stream open through the
// proxies in front of the gateway. A load balancer or nginx closes a
// connection on which nothing was read for its idle timeout (nginx's
// proxy_read_timeout: 60 s by default), and a reasoning model may think for
// longer than that before its first token, or between two. While the engine
// is silent, the stream gets the SSE comment line ": keepalive" and a blank
// line at a fixed interval: valid SSE that every client skips, between two
// frames, never inside one, so the frames themselves pass byte for byte.
//
// The server pulls a stream by calling Read, and Read blocks while the
// engine is silent, so the comment cannot come from the server's goroutine:
// each stream has one goroutine that does the reads the server asks for, one
// at a time, while Read waits for its result or for the interval to pass.
// The source is still read only when the server asks for more, so what the
// source does on a read (a stop's acknowledgement once its closing bytes
// were delivered) keeps its meaning.
package keepalive

import (
	"io"
	"time"
)

// Comment is what a silent stream gets at each interval.
var Comment = []byte(": keepalive\n\n")

// Source is a stream handed out frame by frame.
type Source interface {
	io.ReadCloser
	// MidFrame reports whether the last Read handed out only the start of
	// a frame: no comment may be written until the rest is.
	MidFrame() bool
}

// bufSize is the goroutine's read buffer: a common frame or several. A
// larger frame takes more rounds, each handed out as it comes.
const bufSize = 2 << 10

// Stream is a Source with keep-alive comments while it is silent.
type Stream struct {
	src   Source
	every time.Duration
	// abort makes a Read in flight return: the server closes the stream
	// while the engine is silent only when writing a comment failed, that
	// is when the client left.
	abort func()
	// beforeComment runs before a comment is handed out (nil: nothing):
	// a comment is a write like any frame, and the client's write
	// deadline must move with it, or a client reading every comment
	// would be taken for one that stopped reading.
	beforeComment func()

	asks    chan struct{}
	results chan result
	exited  chan struct{}
	timer   *time.Timer

	buf     []byte // the goroutine's; the server's only between a result and the next ask
	pending []byte // what the last result left to hand out
	reading bool   // the goroutine is reading the source
	mid     bool   // the source is inside a frame
	err     error  // the source's last error, handed out once pending is
	closed  bool
}

type result struct {
	n   int
	err error
	mid bool
}

// New returns src with a comment every interval of silence, and starts its
// goroutine; the server must Close it. abort is called (from the server's
// goroutine) when the stream is closed during a read of src, and must make
// that read return. beforeComment, when not nil, is called (from the
// server's goroutine, while src may be read) before each comment.
func New(src Source, every time.Duration, abort, beforeComment func()) *Stream {
	s := &Stream{
		src:           src,
		every:         every,
		abort:         abort,
		beforeComment: beforeComment,
		asks:          make(chan struct{}),
		results:       make(chan result, 1), // the last one is never waited for after Close
		exited:        make(chan struct{}),
		buf:           make([]byte, bufSize),
	}
	go s.run()
	return s
}

// run reads the source each time the server asks, and closes it when the
// server is done.
func (s *Stream) run() {
	defer close(s.exited)
	for range s.asks {
		n, err := s.src.Read(s.buf)
		s.results <- result{n: n, err: err, mid: s.src.MidFrame()}
	}
	_ = s.src.Close()
}

// Read hands out the source's bytes as they come and, between frames, a
// comment each time the source has been silent for the interval.
func (s *Stream) Read(p []byte) (int, error) {
	if len(s.pending) == 0 && s.err != nil {
		return 0, s.err
	}
	if len(s.pending) == 0 && !s.reading {
		s.reading = true
		s.asks <- struct{}{}
	}
	if s.reading {
		if err := s.wait(); err != nil {
			return 0, err
		}
		if s.reading {
			if s.beforeComment != nil {
				s.beforeComment()
			}
			return copy(p, Comment), nil // Comment is shorter than any server's buffer
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	if len(s.pending) == 0 && n == 0 {
		return 0, s.err
	}
	return n, nil
}

// wait waits for the read in flight. When the interval passes first and
// the source is between frames, it returns with s.reading still set: the
// caller hands out a comment.
func (s *Stream) wait() error {
	var tick <-chan time.Time
	if !s.mid {
		if s.timer == nil {
			s.timer = time.NewTimer(s.every)
		} else {
			s.timer.Reset(s.every)
		}
		tick = s.timer.C
	}
	select {
	case r := <-s.results:
		if s.timer != nil {
			s.timer.Stop()
		}
		s.reading = false
		s.pending, s.err, s.mid = s.buf[:r.n], r.err, r.mid
		return nil
	case <-tick:
		return nil
	}
}

// Close ends the stream: the source is closed by its goroutine, after the
// read in flight if there is one (abort makes it return), and Close waits
// for that, so that whatever closing the source does is done when Close
// returns.
func (s *Stream) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if s.reading {
		s.abort()
	}
	close(s.asks)
	<-s.exited
	if s.timer != nil {
		s.timer.Stop()
	}
	return nil
}

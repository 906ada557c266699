package keepalive

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// source hands out what the test sends it, one piece per Read; mid marks a
// piece that is the start of a frame, not all of it.
type source struct {
	pieces chan piece
	reads  atomic.Int32 // Reads begun
	closed atomic.Int32
	last   bool
	abort  chan struct{}
}

type piece struct {
	b   []byte
	mid bool
	err error
}

func newSource() *source {
	return &source{pieces: make(chan piece), abort: make(chan struct{})}
}

func (s *source) Read(p []byte) (int, error) {
	s.reads.Add(1)
	select {
	case pc := <-s.pieces:
		s.last = pc.mid
		return copy(p, pc.b), pc.err
	case <-s.abort:
		return 0, errors.New("aborted")
	}
}

func (s *source) MidFrame() bool { return s.last }
func (s *source) Close() error   { s.closed.Add(1); return nil }

// readOnce is one server Read, in a buffer of the size fasthttp uses.
func readOnce(t *testing.T, r io.Reader) ([]byte, error) {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := r.Read(buf)
	return buf[:n], err
}

func TestFramesPassAsTheyAre(t *testing.T) {
	src := newSource()
	s := New(src, time.Hour, func() { t.Error("abort on a stream closed between reads") }, nil)
	frames := [][]byte{[]byte("data: {\"a\":1}\n\n"), []byte("data: [DONE]\n\n")}
	go func() {
		for _, f := range frames {
			src.pieces <- piece{b: f}
		}
		src.pieces <- piece{err: io.EOF}
	}()
	var got []byte
	for {
		b, err := readOnce(t, s)
		got = append(got, b...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := bytes.Join(frames, nil); !bytes.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if src.closed.Load() != 1 {
		t.Fatalf("source closed %d times, want 1", src.closed.Load())
	}
}

// The source is read only when the server asks: never ahead of it, so that
// what a read does (a stop acknowledged once its closing bytes were
// delivered) happens after everything before was written.
func TestSourceIsReadOnlyWhenAsked(t *testing.T) {
	src := newSource()
	s := New(src, time.Hour, func() { close(src.abort) }, nil)
	defer s.Close()
	go func() { src.pieces <- piece{b: []byte("data: 1\n\n")} }()
	if _, err := readOnce(t, s); err != nil {
		t.Fatal(err)
	}
	// Give the goroutine every chance to read ahead; it must not.
	for range 100 {
		time.Sleep(time.Millisecond)
	}
	if n := src.reads.Load(); n != 1 {
		t.Fatalf("source read %d times after one server Read", n)
	}
}

func TestSilenceGetsCommentsBetweenFramesOnly(t *testing.T) {
	src := newSource()
	s := New(src, 20*time.Millisecond, func() { close(src.abort) }, nil)
	defer s.Close()

	// Silent before the first frame: comments.
	for range 3 {
		b, err := readOnce(t, s)
		if err != nil || !bytes.Equal(b, Comment) {
			t.Fatalf("silent stream: got %q, %v; want a comment", b, err)
		}
	}
	// The start of a frame, then silence: nothing until the frame's rest.
	go func() { src.pieces <- piece{b: []byte("data: {\"long\":"), mid: true} }()
	b, err := readOnce(t, s)
	for bytes.Equal(b, Comment) && err == nil { // comments queued before the piece came
		b, err = readOnce(t, s)
	}
	if err != nil || string(b) != `data: {"long":` {
		t.Fatalf("got %q, %v; want the frame's start", b, err)
	}
	rest := make(chan []byte)
	go func() {
		b, _ := readOnce(t, s)
		rest <- b
	}()
	select {
	case b := <-rest:
		t.Fatalf("read %q inside a frame before its rest came", b)
	case <-time.After(200 * time.Millisecond): // ten intervals
	}
	src.pieces <- piece{b: []byte("1}\n\n")}
	if b := <-rest; string(b) != "1}\n\n" {
		t.Fatalf("got %q, want the frame's rest", b)
	}
	// Between frames again: comments.
	if b, err := readOnce(t, s); err != nil || !bytes.Equal(b, Comment) {
		t.Fatalf("silent between frames: got %q, %v; want a comment", b, err)
	}
}

// A client that leaves while the engine is silent is noticed when a comment
// cannot be written: Close aborts the read in flight, and returns only once
// the source is closed.
func TestCloseDuringSilenceAbortsTheRead(t *testing.T) {
	src := newSource()
	aborted := 0
	s := New(src, 10*time.Millisecond, func() { aborted++; close(src.abort) }, nil)
	if b, err := readOnce(t, s); err != nil || !bytes.Equal(b, Comment) {
		t.Fatalf("got %q, %v; want a comment", b, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if aborted != 1 || src.closed.Load() != 1 {
		t.Fatalf("after Close: aborted %d, source closed %d; want 1 and 1", aborted, src.closed.Load())
	}
	if err := s.Close(); err != nil || src.closed.Load() != 1 {
		t.Fatal("a second Close closed the source again")
	}
}

func BenchmarkFrames(b *testing.B) {
	frame := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	src := &fast{frame: frame}
	s := New(src, 15*time.Second, func() {}, nil)
	defer s.Close()
	buf := make([]byte, 4096)
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := s.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}

type fast struct{ frame []byte }

func (f *fast) Read(p []byte) (int, error) { return copy(p, f.frame), nil }
func (f *fast) MidFrame() bool             { return false }
func (f *fast) Close() error               { return nil }

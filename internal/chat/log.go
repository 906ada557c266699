package chat

import (
	"strings"
	"sync"
)

// Final is how a generation ended: the message as saved.
type Final struct {
	Status  string
	Content string
	Reason  string
	// The tokens and cost of the answer's usage row, shown under it.
	PromptTokens, CompletionTokens int
	Cost                           int64
}

// Log is one generation's text as it streams: append-only chunks (seq 1,
// 2, …), then a final state. Any number of viewers read it from any seq.
//
// Viewers do not get a channel of chunks each: they are woken (a channel
// closed on every change) and read what is new from the log themselves.
// So the generator never blocks on a viewer, a slow viewer costs no memory
// (it just reads more at once), and a viewer that reconnects resumes from
// its Last-Event-ID because the log keeps every chunk of the generation,
// up to maxLogBytes.
type Log struct {
	mu      sync.Mutex
	chunks  []string
	size    int
	done    bool
	final   Final
	changed chan struct{}
}

// NewLog returns an empty log.
func NewLog() *Log { return &Log{changed: make(chan struct{})} }

// Append adds one chunk and returns the log's size in bytes.
func (l *Log) Append(text string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return l.size
	}
	l.chunks = append(l.chunks, text)
	l.size += len(text)
	l.wake()
	return l.size
}

// Finish records the final state; later appends are ignored.
func (l *Log) Finish(f Final) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	l.done, l.final = true, f
	l.wake()
}

func (l *Log) wake() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Len is the number of chunks so far.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.chunks)
}

// Text returns chunks 1..n concatenated (all of them when n < 0 or n is
// past the end).
func (l *Log) Text(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n < 0 || n > len(l.chunks) {
		n = len(l.chunks)
	}
	return strings.Join(l.chunks[:n], "")
}

// Snapshot returns the text so far, its number of chunks and whether the
// log is done, all at one instant.
func (l *Log) Snapshot() (text string, n int, done bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.chunks, ""), len(l.chunks), l.done
}

// Since returns at most max chunks after seq from, whether the log is done
// (then final is set), and a channel closed at the next change.
func (l *Log) Since(from, max int) (chunks []string, done bool, final Final, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if from < 0 {
		from = 0
	}
	if from < len(l.chunks) {
		end := min(len(l.chunks), from+max)
		// The chunks are never modified: sharing the backing array is safe.
		chunks = l.chunks[from:end:end]
	}
	return chunks, l.done, l.final, l.changed
}

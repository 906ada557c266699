package stop

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Kind is the type of a bus message.
type Kind string

// The message kinds. A stop asks the owner of an inference to end it; an ack
// is the owner's answer that no more content will reach the client.
const (
	// KindStop asks whichever replica owns the inference to stop it.
	KindStop Kind = "stop"
	// KindAck says the owner has ended the stream after a stop.
	KindAck Kind = "ack"
	// KindFinished says the owner had already finished the inference when
	// the stop reached it; the requester can answer at once, like an ack.
	KindFinished Kind = "finished"
)

// Message is what replicas broadcast to each other.
type Message struct {
	Kind Kind
	// ID is the inference id.
	ID string
	// From is the replica that published the message, so that a replica can
	// ignore its own echo (it has already acted locally).
	From string
	// Seen, on a stop, is how many content chunks the person had seen when
	// they pressed Stop; the owner persists exactly that much. -1: not given.
	Seen int
}

// wireVersion starts every payload so that a later format can be told apart
// and old replicas can ignore what they do not understand.
const wireVersion = "v1"

// encode renders m as "v1|kind|from|seen|id". The id comes last so that it
// may contain the separator.
func (m Message) encode() string {
	return wireVersion + "|" + string(m.Kind) + "|" + m.From + "|" + strconv.Itoa(m.Seen) + "|" + m.ID
}

// decodeMessage parses a payload written by encode.
func decodeMessage(payload string) (Message, error) {
	parts := strings.SplitN(payload, "|", 5)
	if len(parts) != 5 || parts[0] != wireVersion {
		return Message{}, fmt.Errorf("stop: unknown message format %q", payload)
	}
	seen, err := strconv.Atoi(parts[3])
	if err != nil {
		return Message{}, fmt.Errorf("stop: bad seen count in %q", payload)
	}
	m := Message{Kind: Kind(parts[1]), From: parts[2], Seen: seen, ID: parts[4]}
	switch m.Kind {
	case KindStop, KindAck, KindFinished:
	default:
		return Message{}, fmt.Errorf("stop: unknown message kind %q", m.Kind)
	}
	if m.ID == "" {
		return Message{}, fmt.Errorf("stop: message without inference id: %q", payload)
	}
	return m, nil
}

// Handler receives what a Bus delivers. Both functions are called from the
// bus's delivery goroutine and must return quickly.
type Handler struct {
	// Message is called for every message, including this replica's own.
	Message func(Message)
	// Subscribed is called each time the subscription is confirmed: once
	// at start and again after every reconnection. Messages published while
	// unsubscribed are lost, so this is the moment to look for missed stops.
	Subscribed func()
}

// Bus broadcasts stop and ack messages between replicas.
type Bus interface {
	// Start subscribes and delivers to h until Close. It returns once the
	// subscription is confirmed or ctx ends.
	Start(ctx context.Context, h Handler) error
	// Publish broadcasts m to every subscribed replica.
	Publish(ctx context.Context, m Message) error
	// Close ends the subscription.
	Close() error
}

// KeyStore is implemented by buses that also record stops durably for a
// while, so that a replica can find a stop it missed (published before it
// subscribed, or while it was disconnected) without polling per token.
type KeyStore interface {
	// StoppedIDs returns the subset of ids that have a recorded stop.
	StoppedIDs(ctx context.Context, ids []string) ([]string, error)
}

// Readier is implemented by buses that can tell whether they can deliver
// right now (RedisBus: whether its subscription is confirmed).
type Readier interface {
	// Ready returns nil when the bus is subscribed, else the reason.
	Ready() error
}

// ErrClosed is returned when a closed Bus or Service is used.
var ErrClosed = errors.New("stop: closed")

// LocalBus is an in-process Bus for a single replica without Redis. Publish
// delivers synchronously on the caller's goroutine. Several Services may share
// one LocalBus (tests do, to act as replicas); Close detaches all of them.
type LocalBus struct {
	mu       sync.RWMutex
	handlers []Handler
	closed   bool
}

// NewLocalBus returns an in-process Bus.
func NewLocalBus() *LocalBus { return &LocalBus{} }

// Start registers h; the subscription is confirmed at once.
func (b *LocalBus) Start(_ context.Context, h Handler) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.handlers = append(b.handlers, h)
	b.mu.Unlock()
	if h.Subscribed != nil {
		h.Subscribed()
	}
	return nil
}

// Publish calls every registered handler with m.
func (b *LocalBus) Publish(_ context.Context, m Message) error {
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return ErrClosed
	}
	// Copy so that handlers run without the lock: a handler may publish in
	// turn (an owner acking a stop).
	hs := append([]Handler(nil), b.handlers...)
	b.mu.RUnlock()
	for _, h := range hs {
		if h.Message != nil {
			h.Message(m)
		}
	}
	return nil
}

// Close detaches all handlers.
func (b *LocalBus) Close() error {
	b.mu.Lock()
	b.closed = true
	b.handlers = nil
	b.mu.Unlock()
	return nil
}

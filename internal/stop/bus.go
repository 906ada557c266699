package stop

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kind is the type of a bus message.
type Kind string

// The message kinds. A stop asks whichever replica runs an inference to end
// it; every other kind is one replica's answer to another's stop.
const (
	// KindStop asks whichever replica owns the inference to stop it, on
	// behalf of Message.By.
	KindStop Kind = "stop"
	// KindAck says the owner has ended the stream after the stop: no more
	// content reaches the client.
	KindAck Kind = "ack"
	// KindFinished says the owner had already finished the inference when
	// the stop reached it (Message.Outcome: how, if known).
	KindFinished Kind = "finished"
	// KindNone says the replica runs no such inference for this caller: it
	// runs none by that id, or not one the caller may stop. The two are one
	// answer so that nobody can tell someone else's inference from none.
	KindNone Kind = "none"
)

// Caller is who asks for a stop. The replica that runs the inference
// decides with it whether the stop is the caller's to make (MayStop).
type Caller struct {
	// UserID is the person asking (0: nobody in particular).
	UserID uint
	// Any lets the caller stop any inference: an administrator, or the
	// gateway on its own behalf (a deleted conversation's reply).
	Any bool
}

// System is the gateway's own caller: it may stop any inference.
var System = Caller{Any: true}

// MayStop reports whether c may stop an inference begun for person owner (0:
// for nobody). It is the usage row's rule: a person stops their own
// requests (any key's, their chat's), an administrator anyone's.
func (c Caller) MayStop(owner uint) bool {
	return c.Any || (owner != 0 && c.UserID == owner)
}

// String renders c for the wire and the stop key: "*" or "u<id>".
func (c Caller) String() string {
	if c.Any {
		return "*"
	}
	return "u" + strconv.FormatUint(uint64(c.UserID), 10)
}

// parseCaller parses what Caller.String wrote.
func parseCaller(s string) (Caller, error) {
	if s == "*" {
		return System, nil
	}
	if rest, ok := strings.CutPrefix(s, "u"); ok {
		if n, err := strconv.ParseUint(rest, 10, strconv.IntSize); err == nil {
			return Caller{UserID: uint(n)}, nil
		}
	}
	return Caller{}, fmt.Errorf("stop: bad caller %q", s)
}

// Message is what replicas broadcast to each other.
type Message struct {
	Kind Kind
	// ID is the inference id.
	ID string
	// From is the replica that published the message, so that a replica can
	// ignore its own echo (it has already acted locally).
	From string
	// To and Ref, on an answer, name the stop it answers: the replica that
	// asked and its number for that request. Other replicas ignore it.
	To  string
	Ref uint64
	// Seen, on a stop, is how many content chunks the person had seen when
	// they pressed Stop; the owner persists exactly that much. -1: not given.
	Seen int
	// By, on a stop, is who asks.
	By Caller
	// Outcome, on a finished answer, is how the inference ended ("" when
	// the owner does not know).
	Outcome string
}

// wireVersion starts every payload so that a later format can be told apart
// and old replicas can ignore what they do not understand. v1 carried no
// caller: a v1 replica's stops are ignored here, as it ignores these.
const wireVersion = "v2"

// wireFields is the number of '|'-separated fields of a payload.
const wireFields = 9

// encode renders m as "v2|kind|from|to|ref|seen|by|outcome|id". The id comes
// last so that it may contain the separator.
func (m Message) encode() string {
	return wireVersion + "|" + string(m.Kind) + "|" + m.From + "|" + m.To + "|" + strconv.FormatUint(m.Ref, 10) + "|" +
		strconv.Itoa(m.Seen) + "|" + m.By.String() + "|" + strings.ReplaceAll(m.Outcome, "|", "_") + "|" + m.ID
}

// decodeMessage parses a payload written by encode.
func decodeMessage(payload string) (Message, error) {
	parts := strings.SplitN(payload, "|", wireFields)
	if len(parts) != wireFields || parts[0] != wireVersion {
		return Message{}, fmt.Errorf("stop: unknown message format %q", payload)
	}
	ref, err := strconv.ParseUint(parts[4], 10, 64)
	if err != nil {
		return Message{}, fmt.Errorf("stop: bad request number in %q", payload)
	}
	seen, err := strconv.Atoi(parts[5])
	if err != nil {
		return Message{}, fmt.Errorf("stop: bad seen count in %q", payload)
	}
	by, err := parseCaller(parts[6])
	if err != nil {
		return Message{}, fmt.Errorf("stop: bad caller in %q", payload)
	}
	m := Message{Kind: Kind(parts[1]), From: parts[2], To: parts[3], Ref: ref, Seen: seen, By: by, Outcome: parts[7], ID: parts[8]}
	switch m.Kind {
	case KindStop, KindAck, KindFinished, KindNone:
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

// Bus broadcasts stops and their answers between replicas.
type Bus interface {
	// Start subscribes and delivers to h until Close. It returns once the
	// subscription is confirmed or ctx ends.
	Start(ctx context.Context, h Handler) error
	// Publish broadcasts m to every subscribed replica and returns how many
	// subscriptions received it, the publisher's own included (-1: unknown).
	Publish(ctx context.Context, m Message) (int, error)
	// Close ends the subscription.
	Close() error
}

// KeyStore is implemented by buses that also record stops durably for a
// while, so that a replica can find a stop it missed (published before it
// subscribed, or while it was disconnected) without polling per token.
type KeyStore interface {
	// Stops returns, for each of ids, the stops recorded for it (KindStop
	// messages with their ID, From, Ref and By; none: nobody asked).
	Stops(ctx context.Context, ids []string) ([][]Message, error)
}

// keyMember renders stop m as a member of its stop key: "by|from|ref", so
// that a replica finding it there can tell whether by may stop the
// inference and answer the request that is perhaps still waiting.
func keyMember(m Message) string {
	return m.By.String() + "|" + m.From + "|" + strconv.FormatUint(m.Ref, 10)
}

// parseKeyMember parses what keyMember wrote, as a stop of id.
func parseKeyMember(id, v string) (Message, error) {
	parts := strings.Split(v, "|")
	if len(parts) != 3 {
		return Message{}, fmt.Errorf("stop: bad stop key member %q", v)
	}
	by, err := parseCaller(parts[0])
	if err != nil {
		return Message{}, err
	}
	ref, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return Message{}, fmt.Errorf("stop: bad stop key member %q", v)
	}
	return Message{Kind: KindStop, ID: id, From: parts[1], Ref: ref, Seen: -1, By: by}, nil
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
// one LocalBus (tests do, to act as replicas); Close detaches all of them. It
// is a KeyStore too, in memory, for a stop that comes before its run begins.
type LocalBus struct {
	mu       sync.RWMutex
	handlers []Handler
	closed   bool

	// TTL is how long a stop stays recorded (DefaultTTL when zero); set it
	// before use.
	TTL time.Duration

	keysMu sync.Mutex
	keys   map[string]*localKey
	// swept is the number of keys after the last sweep of expired ones:
	// the next sweep waits until there are twice as many, so that a sweep
	// costs O(1) per stop over time.
	swept int
}

// localKey is LocalBus's stop key of one inference.
type localKey struct {
	stops   []Message
	expires time.Time
}

// maxLocalKeyStops bounds the stops one localKey keeps (repeated clicks).
const maxLocalKeyStops = 16

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

// Publish calls every registered handler with m, after recording a stop.
func (b *LocalBus) Publish(_ context.Context, m Message) (int, error) {
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return 0, ErrClosed
	}
	// Copy so that handlers run without the lock: a handler may publish in
	// turn (an owner acking a stop).
	hs := append([]Handler(nil), b.handlers...)
	b.mu.RUnlock()
	if m.Kind == KindStop {
		b.record(m)
	}
	for _, h := range hs {
		if h.Message != nil {
			h.Message(m)
		}
	}
	return len(hs), nil
}

// record keeps stop m for the TTL, as RedisBus's stop key does.
func (b *LocalBus) record(m Message) {
	ttl := b.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	now := time.Now()
	b.keysMu.Lock()
	defer b.keysMu.Unlock()
	if b.keys == nil {
		b.keys = make(map[string]*localKey)
	}
	if len(b.keys) >= 2*b.swept+64 {
		for id, k := range b.keys {
			if now.After(k.expires) {
				delete(b.keys, id)
			}
		}
		b.swept = len(b.keys)
	}
	k := b.keys[m.ID]
	if k == nil {
		k = &localKey{}
		b.keys[m.ID] = k
	}
	if len(k.stops) < maxLocalKeyStops {
		k.stops = append(k.stops, m)
	}
	k.expires = now.Add(ttl)
}

// Stops returns the stops recorded for ids.
func (b *LocalBus) Stops(_ context.Context, ids []string) ([][]Message, error) {
	now := time.Now()
	out := make([][]Message, len(ids))
	b.keysMu.Lock()
	defer b.keysMu.Unlock()
	for i, id := range ids {
		if k := b.keys[id]; k != nil && !now.After(k.expires) {
			out[i] = append([]Message(nil), k.stops...)
		}
	}
	return out, nil
}

// Close detaches all handlers.
func (b *LocalBus) Close() error {
	b.mu.Lock()
	b.closed = true
	b.handlers = nil
	b.mu.Unlock()
	return nil
}

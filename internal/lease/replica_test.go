package lease

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

// replica is one gateway replica in a test: its own client and store.
type replica struct {
	name   string
	store  *Store
	client *redis.Client
	gate   *testredis.Gate
	// counter counts the commands the client sends; Matched counts the
	// renewals, Others the rest.
	counter  *testredis.Counter
	released chan string // OnReleased calls, dropped when full
}

type replicaConfig struct {
	ttl time.Duration
	// client, if set, adjusts the replica's Redis client options.
	client func(*redis.Options)
	// noStart leaves Start to the test.
	noStart bool
	// releaseDelay, if set, replaces the package's releaseDelay.
	releaseDelay time.Duration
	// onReleased, if set, is called by OnReleased besides the released
	// channel.
	onReleased func(string)
}

// newReplica starts a store named name on be, closed at cleanup.
func newReplica(tb testing.TB, be *testredis.Backend, name string, cfg replicaConfig) *replica {
	tb.Helper()
	r := &replica{name: name, gate: &testredis.Gate{}, counter: &testredis.Counter{Match: isRenewal},
		released: make(chan string, 1024)}
	opts := be.Options()
	opts.Dialer = r.gate.Dial
	if cfg.client != nil {
		cfg.client(opts)
	}
	r.client = redis.NewClient(opts)
	r.client.AddHook(r.counter)
	r.store = New(r.client, Options{
		Prefix:       be.Prefix,
		Replica:      name,
		TTL:          cfg.ttl,
		releaseDelay: cfg.releaseDelay,
		Log:          testredis.Logger(tb).With("replica", name),
		OnReleased: func(b string) {
			if cfg.onReleased != nil {
				cfg.onReleased(b)
			}
			select {
			case r.released <- b:
			default:
			}
		},
	})
	tb.Cleanup(func() {
		_ = r.store.Close()
		_ = r.client.Close()
	})
	if !cfg.noStart {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.store.Start(ctx); err != nil {
			tb.Fatalf("start replica %s: %v", name, err)
		}
	}
	return r
}

// isRenewal tells the commands that ran the renewal script (EVALSHA, or
// EVAL after NOSCRIPT).
func isRenewal(cmd redis.Cmder) bool {
	if args := cmd.Args(); len(args) > 1 {
		name, _ := args[0].(string)
		body, _ := args[1].(string)
		if strings.EqualFold(name, "eval") {
			sum := sha1.Sum([]byte(body))
			body = hex.EncodeToString(sum[:])
		}
		return (strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "eval")) && body == renewScript.Hash()
	}
	return false
}

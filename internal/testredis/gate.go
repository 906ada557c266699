package testredis

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Gate is a dialer (redis.Options.Dialer = gate.Dial) that can cut a
// client off from Redis or freeze its connections, to simulate an outage
// or a half-open connection against any Redis, including one the test
// cannot stop. The zero Gate lets everything through.
type Gate struct {
	mu    sync.Mutex
	down  bool
	conns []*freezableConn
}

// ErrPartitioned is what dialling through a cut Gate returns.
var ErrPartitioned = errors.New("testredis: gate cut, partitioned from Redis")

// Dial dials addr, or fails with ErrPartitioned while the gate is cut.
func (g *Gate) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	down := g.down
	g.mu.Unlock()
	if down {
		return nil, ErrPartitioned
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down {
		_ = c.Close()
		return nil, ErrPartitioned
	}
	fc := &freezableConn{Conn: c, thawed: make(chan struct{})}
	g.conns = append(g.conns, fc)
	return fc, nil
}

// Cut closes every connection and refuses new ones until Heal.
func (g *Gate) Cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = true
	for _, c := range g.conns {
		_ = c.Close()
	}
	g.conns = nil
}

// Heal lets connections through again.
func (g *Gate) Heal() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = false
}

// Freeze turns every open connection into a black hole, as a hung Redis or
// a half-open TCP connection behaves: writes vanish, reads wait for their
// deadline. New connections work.
func (g *Gate) Freeze() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.frozen.Store(true)
	}
	g.conns = nil
}

// freezableConn is a net.Conn that can stop passing data without closing.
type freezableConn struct {
	net.Conn
	frozen       atomic.Bool
	readDeadline atomic.Int64 // unix nanos; 0 means none
	thawed       chan struct{}
	closeOnce    sync.Once
}

func (c *freezableConn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Store(t.UnixNano())
	return c.Conn.SetReadDeadline(t)
}

func (c *freezableConn) SetDeadline(t time.Time) error {
	c.readDeadline.Store(t.UnixNano())
	return c.Conn.SetDeadline(t)
}

func (c *freezableConn) Read(p []byte) (int, error) {
	if !c.frozen.Load() {
		n, err := c.Conn.Read(p)
		if !c.frozen.Load() {
			return n, err
		}
		// A read that began before the freeze must not deliver either.
	}
	wait := time.Hour
	if d := c.readDeadline.Load(); d != 0 {
		wait = max(time.Until(time.Unix(0, d)), 0)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return 0, os.ErrDeadlineExceeded
	case <-c.thawed:
		return 0, net.ErrClosed
	}
}

func (c *freezableConn) Write(p []byte) (int, error) {
	if c.frozen.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *freezableConn) Close() error {
	c.closeOnce.Do(func() { close(c.thawed) })
	return c.Conn.Close()
}

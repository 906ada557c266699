package faultproxy

import (
	"context"
	"fmt"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
)

// standalone stands in for a test when a proxy runs in a program of its own
// (the soak): a failure panics, as t.Fatalf would end the test. Embedding
// testing.TB satisfies its unexported method; only the methods Proxy calls
// are implemented.
type standalone struct {
	testing.TB
	name string
}

func (s standalone) Helper()                  {}
func (s standalone) Name() string             { return s.name }
func (s standalone) Context() context.Context { return context.Background() }
func (s standalone) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// New starts a proxy outside a test: name labels it (unique in the process),
// it listens on a free loopback port and forwards to upstream until Close.
func New(name, upstream string) (*Proxy, error) {
	p := toxiproxy.NewProxy(apiServer(), name+"-"+upstream, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("faultproxy: start %s in front of %s: %w", name, upstream, err)
	}
	return &Proxy{t: standalone{name: name}, proxy: p}, nil
}

// Close stops a proxy made with New: its connections are cut and its address
// is released.
func (p *Proxy) Close() { p.proxy.Stop() }

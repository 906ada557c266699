// Package faultproxy puts a real fault injector, Toxiproxy, between a test
// and a server it depends on (PostgreSQL, Redis, an engine, an engine link):
// the server can be taken away and brought back at the same address, slowed,
// made to reset connections or to swallow them silently. Toxiproxy runs in
// the test's own process, so nothing else needs installing.
//
// Only tests import it: the binary never carries Toxiproxy.
package faultproxy

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is one TCP proxy in front of an upstream address.
type Proxy struct {
	t     testing.TB
	mu    sync.Mutex
	proxy *toxiproxy.Proxy
	n     int // toxics added, for unique names
}

var (
	serverOnce sync.Once
	server     *toxiproxy.ApiServer
)

// apiServer is the process's one Toxiproxy server (it only names the proxies'
// logger and metrics; its HTTP API is never started).
func apiServer() *toxiproxy.ApiServer {
	serverOnce.Do(func() {
		metrics := toxiproxy.NewMetricsContainer(prometheus.NewRegistry())
		server = toxiproxy.NewServer(metrics, zerolog.Nop())
	})
	return server
}

// Start listens on a free loopback port and forwards each connection to
// upstream ("host:port"). The proxy is stopped when the test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + upstream
	p := toxiproxy.NewProxy(apiServer(), name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("faultproxy: start in front of %s: %v", upstream, err)
	}
	fp := &Proxy{t: t, proxy: p}
	t.Cleanup(p.Stop)
	return fp
}

// Addr is the address clients dial instead of the upstream's.
func (p *Proxy) Addr() string { return p.proxy.Listen }

// Down closes every connection through the proxy and refuses new ones, as a
// server that has stopped does.
func (p *Proxy) Down() { p.proxy.Stop() }

// Up accepts connections again, on the same address.
func (p *Proxy) Up() {
	if err := p.proxy.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		p.t.Fatalf("faultproxy: restart on %s: %v", p.Addr(), err)
	}
}

// Restart is a server restart: every connection is cut, and the address
// answers again at once.
func (p *Proxy) Restart() {
	p.Down()
	p.Up()
}

// Latency adds d (plus or minus jitter) to everything sent each way.
func (p *Proxy) Latency(ms, jitterMS int) {
	p.add("latency", "downstream", 1, fmt.Sprintf(`{"latency":%d,"jitter":%d}`, ms, jitterMS))
	p.add("latency", "upstream", 1, fmt.Sprintf(`{"latency":%d,"jitter":%d}`, ms, jitterMS))
}

// ResetPeer resets (TCP RST) a share of the connections (toxicity 0–1) once
// data arrives on them, after timeoutMS.
func (p *Proxy) ResetPeer(toxicity float64, timeoutMS int) {
	p.add("reset_peer", "upstream", toxicity, fmt.Sprintf(`{"timeout":%d}`, timeoutMS))
}

// Blackhole keeps connections open and swallows what is sent each way, with
// no answer and no error: a network path that went silent. timeoutMS > 0
// closes each connection after that long instead of holding it for good.
func (p *Proxy) Blackhole(timeoutMS int) {
	p.add("timeout", "upstream", 1, fmt.Sprintf(`{"timeout":%d}`, timeoutMS))
	p.add("timeout", "downstream", 1, fmt.Sprintf(`{"timeout":%d}`, timeoutMS))
}

// Clear removes every toxic: the path is healthy again (connections that a
// toxic already closed stay closed).
func (p *Proxy) Clear() {
	p.proxy.Toxics.ResetToxics(p.t.Context())
}

func (p *Proxy) add(kind, direction string, toxicity float64, attributes string) {
	p.mu.Lock()
	p.n++
	name := fmt.Sprintf("%s-%s-%d", kind, direction, p.n)
	p.mu.Unlock()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":%g,"attributes":%s}`,
		name, kind, direction, toxicity, attributes)
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		p.t.Fatalf("faultproxy: add %s: %v", kind, err)
	}
}

// CutReplies closes a share of the connections (toxicity 0–1) once bytes
// have come back from the server on them, mid-answer: the command the server
// was answering has run, and its client never learns how it ended.
func (p *Proxy) CutReplies(toxicity float64, bytes int) {
	p.add("limit_data", "downstream", toxicity, fmt.Sprintf(`{"bytes":%d}`, bytes))
}

// Bandwidth slows what the server sends back to kbps kilobytes a second:
// a fast engine's answer then takes long enough to be cut midway.
func (p *Proxy) Bandwidth(kbps int) {
	p.add("bandwidth", "downstream", 1, fmt.Sprintf(`{"rate":%d}`, kbps))
}

package metrics

import "github.com/prometheus/client_golang/prometheus"

// EngineLink is one engine backend's link as the metrics show it: gauges of
// the moment and counters since start (enginelink.Stats, copied by the
// caller so that this package needs none of enginelink).
type EngineLink struct {
	Backend      string
	Connected    bool
	SessionsOpen int64
	Queued       int64
	Reconnects   int64
	// Dropped counts messages dropped by reason: unknown_session, expired,
	// queue_full, invalid (the engine's envelopes that failed validation),
	// slow_reader.
	Dropped map[string]int64
}

// DroppedReasons are the reasons of moonji_engine_messages_dropped_total,
// each reported (at zero too) for every engine backend.
var DroppedReasons = []string{"unknown_session", "expired", "queue_full", "invalid", "slow_reader"}

var (
	engineConnected = prometheus.NewDesc("moonji_engine_connected",
		"1 while the engine backend's WebSocket is up.", []string{"backend"}, nil)
	engineSessions = prometheus.NewDesc("moonji_engine_sessions",
		"Sessions open on the engine backend's link (queued or running): its multiplexing factor, one connection per replica.", []string{"backend"}, nil)
	engineQueued = prometheus.NewDesc("moonji_engine_queued_messages",
		"Requests waiting for the engine backend's connection.", []string{"backend"}, nil)
	engineReconnects = prometheus.NewDesc("moonji_engine_reconnects_total",
		"Connections to the engine backend made after the first.", []string{"backend"}, nil)
	engineDropped = prometheus.NewDesc("moonji_engine_messages_dropped_total",
		"Messages of the engine backend's link dropped, by reason.", []string{"backend", "reason"}, nil)
)

// engineCollector reads the links at scrape time: nothing is updated on the
// request path.
type engineCollector struct{ links func() []EngineLink }

func (c engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{engineConnected, engineSessions, engineQueued, engineReconnects, engineDropped} {
		ch <- d
	}
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.links() {
		connected := 0.0
		if l.Connected {
			connected = 1
		}
		ch <- prometheus.MustNewConstMetric(engineConnected, prometheus.GaugeValue, connected, l.Backend)
		ch <- prometheus.MustNewConstMetric(engineSessions, prometheus.GaugeValue, float64(l.SessionsOpen), l.Backend)
		ch <- prometheus.MustNewConstMetric(engineQueued, prometheus.GaugeValue, float64(l.Queued), l.Backend)
		ch <- prometheus.MustNewConstMetric(engineReconnects, prometheus.CounterValue, float64(l.Reconnects), l.Backend)
		for _, reason := range DroppedReasons {
			ch <- prometheus.MustNewConstMetric(engineDropped, prometheus.CounterValue, float64(l.Dropped[reason]), l.Backend, reason)
		}
	}
}

// WatchEngineLinks exports the engine backends' links, read by links at
// every scrape.
func (m *Metrics) WatchEngineLinks(links func() []EngineLink) {
	m.Registry.MustRegister(engineCollector{links: links})
}

package resp

import (
	"fmt"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats are the front door's counters, as metrics and for /admin/ui.
type Stats struct {
	conns        atomic.Int64
	accepted     atomic.Int64 // every connection served, for INFO
	refusedConns atomic.Int64
	// evictedConns counts connections closed at the bound to make room
	// (the oldest without AUTH).
	evictedConns atomic.Int64
	commands     *prometheus.CounterVec
	errors       *prometheus.CounterVec
	// total and byKind are the same counts as plain numbers, for the
	// dashboard.
	total  atomic.Uint64
	byKind map[string]*atomic.Uint64
	// byName holds each served name's counter (and unknown's): looked up
	// once here, not hashed by label on every command.
	byName map[string]prometheus.Counter
	// unknown counts the commands this door does not serve by the name a
	// client sent: the first maxUnknownNames names (lower case, plain
	// characters) each, the rest as "other" (a client cannot grow the
	// label set without end).
	unknown   *prometheus.CounterVec
	unknownMu sync.Mutex
	unknownOf map[string]prometheus.Counter
}

// maxUnknownNames bounds the names replicator_resp_unknown_commands_total
// counts apart.
const maxUnknownNames = 64

// errorKinds are the kinds replicator_resp_errors_total counts.
var errorKinds = []string{"not_written", "unknown_outcome", "wrongtype", "crossslot", "bad_request", "auth", "protocol", "http", "budget", "internal"}

func (s *Stats) init() {
	s.commands = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_resp_commands_total",
		Help: "RESP commands executed, by name (unknown: names this server does not serve)."}, []string{"command"})
	s.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_resp_errors_total",
		Help: "RESP error replies and closed connections, by kind (not_written, unknown_outcome, wrongtype, bad_request, auth, protocol, http, budget, internal)."}, []string{"kind"})
	s.byName = map[string]prometheus.Counter{"unknown": s.commands.WithLabelValues("unknown")}
	s.unknown = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_resp_unknown_commands_total",
		Help: "RESP commands this server does not serve, by the name sent (the first 64 names apart, then other)."}, []string{"command"})
	s.unknownOf = map[string]prometheus.Counter{}
	for name := range table {
		s.byName[name] = s.commands.WithLabelValues(name)
	}
	s.byKind = map[string]*atomic.Uint64{}
	for _, k := range errorKinds {
		s.byKind[k] = new(atomic.Uint64)
		s.errors.WithLabelValues(k) // every kind exported from the start, at 0
	}
}

func (s *Stats) command(name string) {
	s.total.Add(1)
	s.byName[name].Inc()
}

// unknownCommand counts a command this door does not serve, by its name.
func (s *Stats) unknownCommand(name []byte) {
	s.command("unknown")
	n := strings.ToLower(string(name))
	if len(n) > 32 || strings.IndexFunc(n, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.' || r == '|')
	}) >= 0 {
		n = "other"
	}
	s.unknownMu.Lock()
	c, ok := s.unknownOf[n]
	if !ok {
		if len(s.unknownOf) >= maxUnknownNames {
			n = "other"
			c, ok = s.unknownOf[n]
		}
		if !ok {
			c = s.unknown.WithLabelValues(n)
			s.unknownOf[n] = c
		}
	}
	s.unknownMu.Unlock()
	c.Inc()
}

func (s *Stats) error(kind string) {
	s.byKind[kind].Add(1)
	s.errors.WithLabelValues(kind).Inc()
}

// Commands returns the commands executed; Errors the error replies by kind
// (kinds never seen left out).
func (s *Stats) Commands() uint64 { return s.total.Load() }

func (s *Stats) Errors() map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range s.byKind {
		if n := v.Load(); n > 0 {
			out[k] = n
		}
	}
	return out
}

// Describe and Collect make Stats a prometheus.Collector.
func (s *Stats) Describe(ch chan<- *prometheus.Desc) {
	s.commands.Describe(ch)
	s.errors.Describe(ch)
	s.unknown.Describe(ch)
	ch <- descConns
	ch <- descRefused
	ch <- descEvicted
}

var (
	descConns   = prometheus.NewDesc("replicator_resp_connections", "RESP connections open.", nil, nil)
	descRefused = prometheus.NewDesc("replicator_resp_connections_refused_total", "RESP connections refused past the bound on connections.", nil, nil)
	descEvicted = prometheus.NewDesc("replicator_resp_connections_evicted_total",
		"RESP connections closed at the bound on connections to make room: the oldest that had not authenticated.", nil, nil)
)

func (s *Stats) Collect(ch chan<- prometheus.Metric) {
	s.commands.Collect(ch)
	s.errors.Collect(ch)
	s.unknown.Collect(ch)
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(s.conns.Load()))
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(s.refusedConns.Load()))
	ch <- prometheus.MustNewConstMetric(descEvicted, prometheus.CounterValue, float64(s.evictedConns.Load()))
}

// Connections returns the connections open now.
func (s *Stats) Connections() int64 { return s.conns.Load() }

// usedMemory is the process's memory as the Go runtime maps it (INFO's
// used_memory: the figure redis_exporter and redis-cli --stat read).
func usedMemory() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

// humanBytes is used_memory_human: 1.50M, as Redis writes it.
func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.2fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

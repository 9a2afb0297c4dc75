package node

import (
	"net/http"
	"runtime"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// nodeMetrics are the node's Prometheus series, on a registry of its own so
// that several nodes can live in one process (tests, the demo). Each part
// registers its own (replica, links, acceptor, antientropy, the RESP door);
// what is the node's is here. Labels are peer and origin cluster IDs and
// fixed enums only: never keys, never idempotency keys.
type nodeMetrics struct {
	reg *prometheus.Registry
	// forwards are the requests forwarded to the leader, by outcome.
	forwards *prometheus.CounterVec
	// apiRefused counts requests the client API and admin endpoints
	// refused before they reached a handler, by the answer's code.
	apiRefused *prometheus.CounterVec
}

func (m *nodeMetrics) init(n *Node) {
	m.reg = prometheus.NewRegistry()
	// Every replicator_ series carries the node's cluster ID as a label of
	// its own (docs/OPERATIONS.md "Metrics"): the ID the node resolved and
	// enforces, so that rules group by cluster however Prometheus scrapes
	// (two clusters in one job included), with no relabelling to get right.
	own := prometheus.WrapRegistererWith(prometheus.Labels{"cluster": n.cluster}, m.reg)
	f := func(c prometheus.Collector) { own.MustRegister(c) }
	m.forwards = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_forwarded_requests_total",
		Help: "Requests this node forwarded to its cluster's leader, by outcome (answered, not_sent, unknown_outcome)."}, []string{"outcome"})
	m.apiRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_api_refusals_total",
		Help: "Requests to the client API and admin endpoints refused before a handler: unauthenticated (401: no or a wrong token), cross_origin (403: a browser page of another origin), host_not_allowed (421)."},
		[]string{"code"})
	for _, code := range []string{"unauthenticated", "cross_origin", "host_not_allowed"} {
		m.apiRefused.WithLabelValues(code) // at 0 from the start: an alert on an increase has a series
	}
	f(m.apiRefused)
	f(m.forwards)
	if n.keys.Set == nil {
		n.rep.Register(f)
	} else {
		// Each group's replica under its group's label (a family's series
		// share their label names: group 0's carries one too).
		for _, g := range n.keys.All() {
			w := prometheus.WrapRegistererWith(prometheus.Labels{"group": strconv.Itoa(g.Number)}, own)
			g.Rep.Register(func(c prometheus.Collector) { w.MustRegister(c) })
		}
	}
	n.links.Register(f)
	n.sat.Register(f)
	n.inbound.Register(f)
	f(n.acceptor)
	n.ae = n.newAntiEntropy(f)
	f(collectorFunc(n.ae.Collect))
	f(collectorFunc(func(ch chan<- prometheus.Metric) { n.collect(ch) }))
	f(collectorFunc(func(ch chan<- prometheus.Metric) {
		if d := n.resp.Load(); d != nil { // none while the door is off
			d.Stats().Collect(ch)
		}
	}))
	m.reg.MustRegister(prometheus.NewGoCollector())
	m.reg.MustRegister(prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
}

// collectorFunc turns a function into an unchecked collector, for series
// read from the node's own counters at scrape time.
type collectorFunc func(chan<- prometheus.Metric)

func (collectorFunc) Describe(chan<- *prometheus.Desc) {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) {
	f(ch)
}

var (
	descConflictLog = prometheus.NewDesc("replicator_conflict_log",
		"The conflict log of this node's cluster: records and bytes kept (what counts against --conflict-max-bytes).", []string{"measure"}, nil)
	descConflictDropped = prometheus.NewDesc("replicator_conflict_log_dropped_total",
		"Conflict records retention collected, by age (--conflict-retention) or size (--conflict-max-bytes).", nil, nil)
	descBuild      = prometheus.NewDesc("replicator_build_info", "1, labelled with this build's version and Go version.", []string{"version", "goversion"}, nil)
	descDead       = prometheus.NewDesc("replicator_dead_letters", "Entries set aside as dead letters (GET /admin/deadletters).", nil, nil)
	descCertExpiry = prometheus.NewDesc("replicator_tls_certificate_expiry_timestamp_seconds",
		"When the certificate the node presents now expires (Unix seconds); absent without TLS.", nil, nil)
)

// Version is this build's version, set by the command (main.Version).
var Version = "devel"

// collect sends the node's own series, read at scrape time: the cluster's
// conflict log and dead letters, the build, the certificate's expiry.
func (n *Node) collect(ch chan<- prometheus.Metric) {
	if cs, err := n.store.ConflictStats(); err == nil {
		ch <- prometheus.MustNewConstMetric(descConflictLog, prometheus.GaugeValue, float64(cs.Records), "records")
		ch <- prometheus.MustNewConstMetric(descConflictLog, prometheus.GaugeValue, float64(cs.Bytes), "bytes")
		ch <- prometheus.MustNewConstMetric(descConflictDropped, prometheus.CounterValue, float64(cs.Dropped))
	}
	if exp := n.tls.Expiry(); !exp.IsZero() {
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(exp.Unix()))
	}
	ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, n.opts.BuildVersion, runtime.Version())
	if dls, err := n.store.DeadLetters(); err == nil {
		ch <- prometheus.MustNewConstMetric(descDead, prometheus.GaugeValue, float64(len(dls)))
	}
}

func (m *nodeMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

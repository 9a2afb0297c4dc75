package acceptor

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The inbound side's Prometheus series (docs/OPERATIONS.md "Metrics"):
// what the acceptor decided of each peer's entries (Acceptor.Collect), and
// how far behind their authors they were applied (Metrics).

var (
	descApply = prometheus.NewDesc("replicator_apply_outcomes_total",
		"Entries received from peers, by origin and outcome (applied, stale, duplicate, refused batches, possible_resurrection: a re-seed's version older than the collection horizon of a key held nothing of, not taken).", []string{"origin", "outcome"}, nil)
	descConflicts = prometheus.NewDesc("replicator_conflicts_total",
		"Records the entries of each peer added to the conflict log (versions last-writer-wins discarded that the winner had not seen), counted by the node that took the batch.", []string{"peer"}, nil)
	descRangeDiscards = prometheus.NewDesc("replicator_conflict_range_deletes_total",
		"Range deletes of each peer that deleted live keys here: their discards are counted per range, not logged per key in the conflict log.", []string{"peer"}, nil)
	descPermit = prometheus.NewDesc("replicator_replay_permits", "Replay permits by state.", []string{"state"}, nil)
	// DescRefusals is the local side's too (package links): one series,
	// by source.
	DescRefusals    = prometheus.NewDesc("replicator_refusals_total", "Local writes and incoming batches refused for saturation, by source.", []string{"source"}, nil)
	descPeerRefused = prometheus.NewDesc("replicator_replicate_refusals_total",
		"Batches and proofs the replication endpoint refused, by reason: unauthenticated (401: a wrong secret), forbidden (403: a spoofed origin, a certificate of another cluster), bad_batch (malformed, unknown version), too_large, clock_offset, gap, identity_conflict, no_permit (429).",
		[]string{"reason"}, nil)
)

// Describe sends nothing: the acceptor's series are unchecked (origins
// come and go).
func (a *Acceptor) Describe(chan<- *prometheus.Desc) {}

// Collect sends the acceptor's counts, read at scrape time.
func (a *Acceptor) Collect(ch chan<- prometheus.Metric) {
	p := a.Permits()
	ch <- prometheus.MustNewConstMetric(DescRefusals, prometheus.CounterValue, float64(p.Refused), SourceReplayPermit)
	for origin, c := range a.Counts() {
		for outcome, v := range map[string]uint64{"applied": c.Applied, "stale": c.Stale, "duplicate": c.Duplicates, "refused": c.Refused, "possible_resurrection": c.Resurrections} {
			ch <- prometheus.MustNewConstMetric(descApply, prometheus.CounterValue, float64(v), origin, outcome)
		}
		ch <- prometheus.MustNewConstMetric(descConflicts, prometheus.CounterValue, float64(c.Conflicts), origin)
		ch <- prometheus.MustNewConstMetric(descRangeDiscards, prometheus.CounterValue, float64(c.RangeDiscards), origin)
	}
	ch <- prometheus.MustNewConstMetric(descPermit, prometheus.GaugeValue, float64(p.InUse), "in_use")
	ch <- prometheus.MustNewConstMetric(descPermit, prometheus.GaugeValue, float64(p.Queued), "queued")
	ch <- prometheus.MustNewConstMetric(descPermit, prometheus.GaugeValue, float64(p.Capacity), "capacity")
	for reason, v := range a.Refusals() {
		ch <- prometheus.MustNewConstMetric(descPeerRefused, prometheus.CounterValue, float64(v), reason)
	}
}

// Metrics are the inbound lag and apply histograms, and the ring of recent
// lags the lag report reads (Options.ObserveLag and ObserveApply feed them).
type Metrics struct {
	Lags         LagRing
	applySeconds prometheus.Histogram
	lagSeconds   *prometheus.HistogramVec
	stageSeconds *prometheus.HistogramVec
}

// NewMetrics makes the inbound histograms.
func NewMetrics() *Metrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	return &Metrics{
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "replicator_apply_seconds",
			Help: "Time to apply an incoming batch (decode to synced commit).", Buckets: buckets}),
		lagSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "replicator_replication_lag_seconds",
			Help: "Apply time here minus the entry's authoring commit HLC.", Buckets: buckets}, []string{"origin"}),
		stageSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "replicator_replication_stage_seconds",
			Help:    "Replication lag by stage: ship (the sender's commit to send, its clock), wire (send to received, across clocks), apply (received to synced apply, here).",
			Buckets: buckets}, []string{"peer", "stage"}),
	}
}

// Register registers the histograms with f.
func (m *Metrics) Register(f func(prometheus.Collector)) {
	f(m.applySeconds)
	f(m.lagSeconds)
	f(m.stageSeconds)
}

// ObserveApply records an applied batch's time (Options.ObserveApply).
func (m *Metrics) ObserveApply(d time.Duration) { m.applySeconds.Observe(d.Seconds()) }

// ObserveLag records the lags of a batch's entries applied at now (ns)
// (Options.ObserveLag).
func (m *Metrics) ObserveLag(origin string, now int64, lags []Lag) {
	// Label lookups once per batch, not per entry: this runs on the apply
	// path of every replicated batch.
	total := m.lagSeconds.WithLabelValues(origin)
	ship := m.stageSeconds.WithLabelValues(origin, "ship")
	wire := m.stageSeconds.WithLabelValues(origin, "wire")
	apply := m.stageSeconds.WithLabelValues(origin, "apply")
	for _, l := range lags {
		total.Observe(l.Total.Seconds())
		if l.Staged {
			ship.Observe(l.Ship.Seconds())
			wire.Observe(l.Wire.Seconds())
			apply.Observe(l.Apply.Seconds())
		}
	}
	m.Lags.Add(now, lags)
}

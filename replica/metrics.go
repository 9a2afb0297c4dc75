package replica

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The replica's Prometheus series (docs/OPERATIONS.md "Metrics"): the
// write path's commits and the raft group as this node sees it.

var (
	descWrites      = prometheus.NewDesc("replicator_local_writes_total", "Local writes committed.", nil, nil)
	descGroups      = prometheus.NewDesc("replicator_commit_groups_total", "WAL appends (one fsync each) the local writes took.", nil, nil)
	descWAL         = prometheus.NewDesc("replicator_wal_entries", "Entries retained in the outbound WAL.", nil, nil)
	descLeader      = prometheus.NewDesc("replicator_raft_leader", "1 while this node leads its cluster (and its term began).", nil, nil)
	descTerm        = prometheus.NewDesc("replicator_raft_term", "The raft term this node is in.", nil, nil)
	descCommit      = prometheus.NewDesc("replicator_raft_commit_index", "The highest log index this node knows committed.", nil, nil)
	descApplied     = prometheus.NewDesc("replicator_raft_applied_index", "The last log command this node's state machine applied.", nil, nil)
	descApplyLag    = prometheus.NewDesc("replicator_raft_apply_lag", "Log entries committed and not yet applied here.", nil, nil)
	descVersionKeys = prometheus.NewDesc("replicator_version_cache_keys",
		"Keys whose newest version (without its value) the write path holds in memory (--version-cache-keys).", nil, nil)
	descVersionLookups = prometheus.NewDesc("replicator_version_cache_lookups_total",
		"Merges of a key the tree may hold: answered by the version cache (hit) or by a read of the tree (miss).", []string{"result"}, nil)
	descVoters = prometheus.NewDesc("replicator_raft_voters", "Voters of the cluster's configuration, as this node knows it.", nil, nil)
	descLive   = prometheus.NewDesc("replicator_raft_voters_live",
		"Voters answering the leader's heartbeats (the leader exports it; a follower does not know).", nil, nil)
)

// metrics are the replica's own counters and histograms.
type metrics struct {
	writes atomic.Uint64 // local writes committed
	groups atomic.Uint64 // WAL appends (fsyncs) they took

	fsyncSeconds prometheus.Histogram
	// The cluster's log: commands committed here (leader), terms begun.
	commitSeconds prometheus.Histogram
	leaderTerms   prometheus.Counter
}

func newMetrics() *metrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	return &metrics{
		fsyncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "replicator_wal_fsync_seconds",
			Help: "WAL append of one commit group: one write and one fsync.", Buckets: buckets}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "replicator_raft_commit_seconds",
			Help: "A command of the cluster's log from proposal to applied here: a quorum's synced append, then the state machine.", Buckets: buckets}),
		leaderTerms: prometheus.NewCounter(prometheus.CounterOpts{Name: "replicator_raft_leader_terms_total",
			Help: "Terms this node began as its cluster's leader."}),
	}
}

func (m *metrics) committed(writes int) {
	m.writes.Add(uint64(writes))
	m.groups.Add(1)
}

func observe(h prometheus.Histogram, since time.Time) { h.Observe(time.Since(since).Seconds()) }

// Writes counts the local writes committed, Groups the log appends they
// took.
func (r *Replica) Writes() uint64 { return r.m.writes.Load() }
func (r *Replica) Groups() uint64 { return r.m.groups.Load() }

// Register registers the replica's series with f.
func (r *Replica) Register(f func(prometheus.Collector)) {
	f(r.m.fsyncSeconds)
	f(r.m.commitSeconds)
	f(r.m.leaderTerms)
	f(collector(r.collect))
}

// collect sends the series read at scrape time.
func (r *Replica) collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	ch <- prometheus.MustNewConstMetric(descWrites, prometheus.CounterValue, float64(r.m.writes.Load()))
	ch <- prometheus.MustNewConstMetric(descGroups, prometheus.CounterValue, float64(r.m.groups.Load()))
	if l, f := r.out.Last(), r.out.First(); l+1 >= f {
		gauge(descWAL, float64(l+1-f))
	}
	leading := 0.0
	if r.Ready() {
		leading = 1
	}
	gauge(descLeader, leading)
	gauge(descTerm, float64(r.group.Term()))
	commit, applied := r.group.CommitIndex(), r.Applied()
	gauge(descCommit, float64(commit))
	gauge(descApplied, float64(applied))
	gauge(descApplyLag, float64(commit-min(commit, applied)))
	voters := 0
	for _, sv := range r.group.Status().Servers {
		if sv.Voter {
			voters++
		}
	}
	gauge(descVoters, float64(voters))
	vc := r.d.Store.VersionCacheStats()
	gauge(descVersionKeys, float64(vc.Keys))
	ch <- prometheus.MustNewConstMetric(descVersionLookups, prometheus.CounterValue, float64(vc.Hits), "hit")
	ch <- prometheus.MustNewConstMetric(descVersionLookups, prometheus.CounterValue, float64(vc.Misses), "miss")
	if live, _, ok := r.group.VotersLive(); ok {
		gauge(descLive, float64(live))
	}
}

// collector turns a function into an unchecked collector.
type collector func(chan<- prometheus.Metric)

func (collector) Describe(chan<- *prometheus.Desc)      {}
func (f collector) Collect(ch chan<- prometheus.Metric) { f(ch) }

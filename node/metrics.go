package node

import (
	"net/http"
	"runtime"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/transport"
)

// nodeMetrics are the node's Prometheus series, on a registry of its own so
// that several nodes can live in one process (tests, the demo). Labels are
// peer and origin cluster IDs and fixed enums only: never keys, never
// idempotency keys.
type nodeMetrics struct {
	reg *prometheus.Registry

	writes atomic.Uint64 // local writes committed
	groups atomic.Uint64 // WAL appends (fsyncs) they took

	backlogEntries *prometheus.GaugeVec
	backlogBytes   *prometheus.GaugeVec
	backlogAge     *prometheus.GaugeVec
	detached       *prometheus.CounterVec
	shipSeconds    *prometheus.HistogramVec
	applySeconds   prometheus.Histogram
	lagSeconds     *prometheus.HistogramVec
	stageSeconds   *prometheus.HistogramVec
	fsyncSeconds   prometheus.Histogram
	// The cluster's log: commands committed here (leader), terms begun,
	// forwarded requests by outcome.
	commitSeconds prometheus.Histogram
	leaderChanges prometheus.Counter
	forwards      *prometheus.CounterVec
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
	m.backlogEntries = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "replicator_backlog_entries",
		Help: "WAL entries a peer has not acknowledged."}, []string{"peer"})
	m.backlogBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "replicator_backlog_bytes",
		Help: "WAL bytes a peer has not acknowledged."}, []string{"peer"})
	m.backlogAge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "replicator_backlog_oldest_age_seconds",
		Help: "Age of the oldest entry a peer has not acknowledged."}, []string{"peer"})
	m.detached = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_peer_detached_total",
		Help: "Peers detached on backlog overflow (they need a re-seed)."}, []string{"peer"})
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m.shipSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "replicator_ship_seconds",
		Help: "Round trip of an acknowledged batch to a peer.", Buckets: buckets}, []string{"peer"})
	m.applySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "replicator_apply_seconds",
		Help: "Time to apply an incoming batch (decode to synced commit).", Buckets: buckets})
	m.lagSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "replicator_replication_lag_seconds",
		Help: "Apply time here minus the entry's authoring commit HLC.", Buckets: buckets}, []string{"origin"})
	m.stageSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "replicator_replication_stage_seconds",
		Help:    "Replication lag by stage: ship (the sender's commit to send, its clock), wire (send to received, across clocks), apply (received to synced apply, here).",
		Buckets: buckets}, []string{"peer", "stage"})
	m.fsyncSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "replicator_wal_fsync_seconds",
		Help: "WAL append of one commit group: one write and one fsync.", Buckets: buckets})
	m.commitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "replicator_raft_commit_seconds",
		Help: "A command of the cluster's log from proposal to applied here: a quorum's synced append, then the state machine.", Buckets: buckets})
	m.leaderChanges = prometheus.NewCounter(prometheus.CounterOpts{Name: "replicator_raft_leader_terms_total",
		Help: "Terms this node began as its cluster's leader."})
	m.forwards = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_forwarded_requests_total",
		Help: "Requests this node forwarded to its cluster's leader, by outcome (answered, not_sent, unknown_outcome)."}, []string{"outcome"})
	m.apiRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_api_refusals_total",
		Help: "Requests to the client API and admin endpoints refused before a handler: unauthenticated (401: no or a wrong token), cross_origin (403: a browser page of another origin), host_not_allowed (421)."},
		[]string{"code"})
	for _, code := range []string{"unauthenticated", "cross_origin", "host_not_allowed"} {
		m.apiRefused.WithLabelValues(code) // at 0 from the start: an alert on an increase has a series
	}
	for _, c := range []prometheus.Collector{m.apiRefused, m.backlogEntries, m.backlogBytes, m.backlogAge, m.detached,
		m.shipSeconds, m.applySeconds, m.lagSeconds, m.stageSeconds, m.fsyncSeconds, m.commitSeconds, m.leaderChanges, m.forwards} {
		f(c)
	}
	n.ae = n.newAntiEntropy(f)
	f(collectorFunc(func(ch chan<- prometheus.Metric) { n.collect(ch) }))
	f(collectorFunc(func(ch chan<- prometheus.Metric) { n.resp.Load().collect(ch) }))
	m.reg.MustRegister(prometheus.NewGoCollector())
	m.reg.MustRegister(prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
}

func (m *nodeMetrics) backlog(peer string, bl transport.Backlog) {
	m.backlogEntries.WithLabelValues(peer).Set(float64(bl.Entries))
	m.backlogBytes.WithLabelValues(peer).Set(float64(bl.Bytes))
	m.backlogAge.WithLabelValues(peer).Set(bl.OldestAge.Seconds())
}

// collectorFunc turns a function into an unchecked collector, for series
// read from the node's own counters at scrape time.
type collectorFunc func(chan<- prometheus.Metric)

func (collectorFunc) Describe(chan<- *prometheus.Desc) {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) {
	f(ch)
}

var (
	descSaturation = prometheus.NewDesc("replicator_saturation_state",
		"Node saturation: 0 healthy, 1 throttled (an early warning: a link is over a low-water mark, half the high one by default; every write is still taken), 2 saturated (local writes refused).", nil, nil)
	descLimitEntries = prometheus.NewDesc("replicator_backlog_entries_limit",
		"A link's backlog water mark in entries: high saturates the node, low (throttled) warns and ends a saturation.", []string{"mark"}, nil)
	descLimitBytes = prometheus.NewDesc("replicator_backlog_bytes_limit",
		"A link's backlog water mark in bytes (high, low).", []string{"mark"}, nil)
	descLimitAge = prometheus.NewDesc("replicator_backlog_oldest_age_limit_seconds",
		"A link's water mark on its oldest unacknowledged entry's age (high, low).", []string{"mark"}, nil)
	descApply = prometheus.NewDesc("replicator_apply_outcomes_total",
		"Entries received from peers, by origin and outcome (applied, stale, duplicate, refused batches, possible_resurrection: a re-seed's version older than the collection horizon of a key held nothing of, not taken).", []string{"origin", "outcome"}, nil)
	descConflicts = prometheus.NewDesc("replicator_conflicts_total",
		"Records the entries of each peer added to the conflict log (versions last-writer-wins discarded that the winner had not seen), counted by the node that took the batch.", []string{"peer"}, nil)
	descConflictLog = prometheus.NewDesc("replicator_conflict_log",
		"The conflict log of this node's cluster: records and bytes kept (what counts against --conflict-max-bytes).", []string{"measure"}, nil)
	descConflictDropped = prometheus.NewDesc("replicator_conflict_log_dropped_total",
		"Conflict records retention collected, by age (--conflict-retention) or size (--conflict-max-bytes).", nil, nil)
	descRangeDiscards = prometheus.NewDesc("replicator_conflict_range_deletes_total",
		"Range deletes of each peer that deleted live keys here: their discards are counted per range, not logged per key in the conflict log.", []string{"peer"}, nil)
	descWrites  = prometheus.NewDesc("replicator_local_writes_total", "Local writes committed.", nil, nil)
	descGroups  = prometheus.NewDesc("replicator_commit_groups_total", "WAL appends (one fsync each) the local writes took.", nil, nil)
	descWAL     = prometheus.NewDesc("replicator_wal_entries", "Entries retained in the outbound WAL.", nil, nil)
	descPermit  = prometheus.NewDesc("replicator_replay_permits", "Replay permits by state.", []string{"state"}, nil)
	descLink    = prometheus.NewDesc("replicator_link_state", "1 for the current state of each peer link.", []string{"peer", "state"}, nil)
	descRefuse  = prometheus.NewDesc("replicator_refusals_total", "Local writes and incoming batches refused for saturation, by source.", []string{"source"}, nil)
	descBuild   = prometheus.NewDesc("replicator_build_info", "1, labelled with this build's version and Go version.", []string{"version", "goversion"}, nil)
	descFail    = prometheus.NewDesc("replicator_peer_send_failures_total", "Failed sends and heartbeats to a peer.", []string{"peer"}, nil)
	descContact = prometheus.NewDesc("replicator_peer_last_contact_timestamp_seconds",
		"When a peer last answered (Unix seconds; 0 before it ever did).", []string{"peer"}, nil)
	descDead      = prometheus.NewDesc("replicator_dead_letters", "Entries set aside as dead letters (GET /admin/deadletters).", nil, nil)
	descPeerBuild = prometheus.NewDesc("replicator_peer_build_info",
		"1, labelled with the version a peer last answered with (a rolling upgrade shows the mix).", []string{"peer", "version"}, nil)
	descSentBytes = prometheus.NewDesc("replicator_peer_sent_bytes_total",
		"Request bodies sent to a peer: form raw (as encoded) and wire (after compression; equal without it).", []string{"peer", "form"}, nil)
	descThrottled = prometheus.NewDesc("replicator_peer_throttled_seconds_total",
		"How long posts to a peer waited for the link's bandwidth limit.", []string{"peer"}, nil)
	descBandwidth = prometheus.NewDesc("replicator_peer_bandwidth_limit_bytes",
		"The link's bandwidth limit in bytes per second of request bodies as sent (0: none).", []string{"peer"}, nil)
	descSkew = prometheus.NewDesc("replicator_peer_clock_skew_seconds", "A peer's clock minus this node's, from its last answer.", []string{"peer"}, nil)

	descPeerRefused = prometheus.NewDesc("replicator_replicate_refusals_total",
		"Batches and proofs the replication endpoint refused, by reason: unauthenticated (401: a wrong secret), forbidden (403: a spoofed origin, a certificate of another cluster), bad_batch (malformed, unknown version), too_large, clock_offset, gap, identity_conflict, no_permit (429).",
		[]string{"reason"}, nil)
	descToLimit = prometheus.NewDesc("replicator_backlog_seconds_to_limit",
		"Seconds until a peer's backlog reaches a high-water mark at the last minute's write and drain rates; absent while it does not grow toward one (and for a link not watched: detached, or shipped by another node), 0 once over.",
		[]string{"peer", "mark"}, nil)
	descCertExpiry = prometheus.NewDesc("replicator_tls_certificate_expiry_timestamp_seconds",
		"When the certificate the node presents now expires (Unix seconds); absent without TLS.", nil, nil)

	descLeader   = prometheus.NewDesc("replicator_raft_leader", "1 while this node leads its cluster (and its term began).", nil, nil)
	descTerm     = prometheus.NewDesc("replicator_raft_term", "The raft term this node is in.", nil, nil)
	descCommit   = prometheus.NewDesc("replicator_raft_commit_index", "The highest log index this node knows committed.", nil, nil)
	descApplied  = prometheus.NewDesc("replicator_raft_applied_index", "The last log command this node's state machine applied.", nil, nil)
	descApplyLag = prometheus.NewDesc("replicator_raft_apply_lag", "Log entries committed and not yet applied here.", nil, nil)
	descVoters   = prometheus.NewDesc("replicator_raft_voters", "Voters of the cluster's configuration, as this node knows it.", nil, nil)
	descLive     = prometheus.NewDesc("replicator_raft_voters_live",
		"Voters answering the leader's heartbeats (the leader exports it; a follower does not know).", nil, nil)
)

// linkStates are every state a link can report: each link's series exists
// for all of them from the start (1 for the current one, 0 for the others),
// so an alert on one never waits for its first occurrence.
var linkStates = []string{transport.StateUnknown, transport.StateHealthy, transport.StateLagging, transport.StateStalled,
	transport.StateNeedsReseed, transport.StateReseeding, transport.StatePaused, transport.StateDead, transport.StateLeft,
	transport.StateConflict, transport.StateFollower}

// Version is this build's version, set by the command (main.Version).
var Version = "devel"

func (n *Node) collect(ch chan<- prometheus.Metric) {
	n.ae.Collect(ch)
	state := map[string]float64{api.StateHealthy: 0, api.StateThrottled: 1, api.StateSaturated: 2}[n.Saturation().State]
	ch <- prometheus.MustNewConstMetric(descSaturation, prometheus.GaugeValue, state)
	// The marks, so that a rule or a panel divides a backlog by its limit;
	// a mark that is off (0) has no series.
	wm := n.sat.Marks()
	for _, l := range []struct {
		desc      *prometheus.Desc
		high, low float64
	}{
		{descLimitEntries, float64(wm.HighEntries), float64(wm.LowEntries)},
		{descLimitBytes, float64(wm.HighBytes), float64(wm.LowBytes)},
		{descLimitAge, wm.HighAge.Seconds(), wm.LowAge.Seconds()},
	} {
		if l.high > 0 {
			ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, l.high, "high")
		}
		if l.low > 0 {
			ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, l.low, "low")
		}
	}
	outbound := n.sat.Refusals()
	ch <- prometheus.MustNewConstMetric(descRefuse, prometheus.CounterValue, float64(outbound), acceptor.SourceOutboundBacklog)
	ch <- prometheus.MustNewConstMetric(descRefuse, prometheus.CounterValue, float64(n.acceptor.Permits().Refused), acceptor.SourceReplayPermit)
	for origin, c := range n.acceptor.Counts() {
		for outcome, v := range map[string]uint64{"applied": c.Applied, "stale": c.Stale, "duplicate": c.Duplicates, "refused": c.Refused, "possible_resurrection": c.Resurrections} {
			ch <- prometheus.MustNewConstMetric(descApply, prometheus.CounterValue, float64(v), origin, outcome)
		}
		ch <- prometheus.MustNewConstMetric(descConflicts, prometheus.CounterValue, float64(c.Conflicts), origin)
		ch <- prometheus.MustNewConstMetric(descRangeDiscards, prometheus.CounterValue, float64(c.RangeDiscards), origin)
	}
	if cs, err := n.store.ConflictStats(); err == nil {
		ch <- prometheus.MustNewConstMetric(descConflictLog, prometheus.GaugeValue, float64(cs.Records), "records")
		ch <- prometheus.MustNewConstMetric(descConflictLog, prometheus.GaugeValue, float64(cs.Bytes), "bytes")
		ch <- prometheus.MustNewConstMetric(descConflictDropped, prometheus.CounterValue, float64(cs.Dropped))
	}
	ch <- prometheus.MustNewConstMetric(descWrites, prometheus.CounterValue, float64(n.metrics.writes.Load()))
	ch <- prometheus.MustNewConstMetric(descGroups, prometheus.CounterValue, float64(n.metrics.groups.Load()))
	if l, f := n.out.Last(), n.out.First(); l+1 >= f {
		ch <- prometheus.MustNewConstMetric(descWAL, prometheus.GaugeValue, float64(l+1-f))
	}
	p := n.acceptor.Permits()
	ch <- prometheus.MustNewConstMetric(descPermit, prometheus.GaugeValue, float64(p.InUse), "in_use")
	ch <- prometheus.MustNewConstMetric(descPermit, prometheus.GaugeValue, float64(p.Queued), "queued")
	ch <- prometheus.MustNewConstMetric(descPermit, prometheus.GaugeValue, float64(p.Capacity), "capacity")
	for _, st := range n.PeerStatus() {
		for _, state := range linkStates {
			v := 0.0
			if state == st.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descLink, prometheus.GaugeValue, v, st.Peer, state)
		}
		ch <- prometheus.MustNewConstMetric(descFail, prometheus.CounterValue, float64(st.SendFailures), st.Peer)
		contact := 0.0
		if !st.LastContact.IsZero() {
			contact = float64(st.LastContact.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(descContact, prometheus.GaugeValue, contact, st.Peer)
		ch <- prometheus.MustNewConstMetric(descSkew, prometheus.GaugeValue, st.ClockSkewMS/1000, st.Peer)
		ch <- prometheus.MustNewConstMetric(descSentBytes, prometheus.CounterValue, float64(st.BytesRaw), st.Peer, "raw")
		ch <- prometheus.MustNewConstMetric(descSentBytes, prometheus.CounterValue, float64(st.BytesOnWire), st.Peer, "wire")
		ch <- prometheus.MustNewConstMetric(descThrottled, prometheus.CounterValue, st.ThrottledSeconds, st.Peer)
		ch <- prometheus.MustNewConstMetric(descBandwidth, prometheus.GaugeValue, float64(st.BandwidthLimit), st.Peer)
		if st.PeerVersion != "" {
			ch <- prometheus.MustNewConstMetric(descPeerBuild, prometheus.GaugeValue, 1, st.Peer, st.PeerVersion)
		}
	}
	// From the links watched at scrape time: a link detached, or gone with
	// a term, has no series (never a stale one).
	for peer, f := range n.sat.Forecasts() {
		if f.SecondsToLimit != nil {
			ch <- prometheus.MustNewConstMetric(descToLimit, prometheus.GaugeValue, *f.SecondsToLimit, peer, f.Mark)
		}
	}
	for reason, v := range n.acceptor.Refusals() {
		ch <- prometheus.MustNewConstMetric(descPeerRefused, prometheus.CounterValue, float64(v), reason)
	}
	if exp := n.tls.Expiry(); !exp.IsZero() {
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(exp.Unix()))
	}
	ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, n.opts.BuildVersion, runtime.Version())
	leading := 0.0
	if n.rep.Ready() {
		leading = 1
	}
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leading)
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(n.group.Term()))
	commit, applied := n.group.CommitIndex(), n.rep.Applied()
	ch <- prometheus.MustNewConstMetric(descCommit, prometheus.GaugeValue, float64(commit))
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(applied))
	lag := 0.0
	if commit > applied {
		lag = float64(commit - applied)
	}
	ch <- prometheus.MustNewConstMetric(descApplyLag, prometheus.GaugeValue, lag)
	voters := 0
	for _, sv := range n.group.Status().Servers {
		if sv.Voter {
			voters++
		}
	}
	ch <- prometheus.MustNewConstMetric(descVoters, prometheus.GaugeValue, float64(voters))
	if live, _, ok := n.group.VotersLive(); ok {
		ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(live))
	}
	if dls, err := n.store.DeadLetters(); err == nil {
		ch <- prometheus.MustNewConstMetric(descDead, prometheus.GaugeValue, float64(len(dls)))
	}
}

func (m *nodeMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

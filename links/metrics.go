package links

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/transport"
)

// The links' Prometheus series (docs/OPERATIONS.md "Metrics"): each link's
// state and traffic (Set), and the node's saturation with the backlogs it
// is measured on (Saturation). Labels are peer cluster IDs and fixed enums.

var (
	descLink    = prometheus.NewDesc("replicator_link_state", "1 for the current state of each peer link.", []string{"peer", "state"}, nil)
	descFail    = prometheus.NewDesc("replicator_peer_send_failures_total", "Failed sends and heartbeats to a peer.", []string{"peer"}, nil)
	descContact = prometheus.NewDesc("replicator_peer_last_contact_timestamp_seconds",
		"When a peer last answered (Unix seconds; 0 before it ever did).", []string{"peer"}, nil)
	descPeerBuild = prometheus.NewDesc("replicator_peer_build_info",
		"1, labelled with the version a peer last answered with (a rolling upgrade shows the mix).", []string{"peer", "version"}, nil)
	descSentBytes = prometheus.NewDesc("replicator_peer_sent_bytes_total",
		"Request bodies sent to a peer: form raw (as encoded) and wire (after compression; equal without it).", []string{"peer", "form"}, nil)
	descThrottled = prometheus.NewDesc("replicator_peer_throttled_seconds_total",
		"How long posts to a peer waited for the link's bandwidth limit.", []string{"peer"}, nil)
	descDrift = prometheus.NewDesc("replicator_config_drift",
		"1 when this node's flags or YAML declare a setting of the link (filter, bandwidth, compression) otherwise than the cluster's log holds: the log's is in force.",
		[]string{"peer", "setting"}, nil)
	descBandwidth = prometheus.NewDesc("replicator_peer_bandwidth_limit_bytes",
		"The link's bandwidth limit in bytes per second of request bodies as sent (0: none).", []string{"peer"}, nil)
	descSkew = prometheus.NewDesc("replicator_peer_clock_skew_seconds", "A peer's clock minus this node's, from its last answer.", []string{"peer"}, nil)

	descSaturation = prometheus.NewDesc("replicator_saturation_state",
		"Node saturation: 0 healthy, 1 throttled (an early warning: a link is over a low-water mark, half the high one by default; every write is still taken), 2 saturated (local writes refused).", nil, nil)
	descLimitEntries = prometheus.NewDesc("replicator_backlog_entries_limit",
		"A link's backlog water mark in entries: high saturates the node, low (throttled) warns and ends a saturation.", []string{"mark"}, nil)
	descLimitBytes = prometheus.NewDesc("replicator_backlog_bytes_limit",
		"A link's backlog water mark in bytes (high, low).", []string{"mark"}, nil)
	descLimitAge = prometheus.NewDesc("replicator_backlog_oldest_age_limit_seconds",
		"A link's water mark on its oldest unacknowledged entry's age (high, low).", []string{"mark"}, nil)
	descToLimit = prometheus.NewDesc("replicator_backlog_seconds_to_limit",
		"Seconds until a peer's backlog reaches a high-water mark at the last minute's write and drain rates; absent while it does not grow toward one (and for a link not watched: detached, or shipped by another node), 0 once over.",
		[]string{"peer", "mark"}, nil)
)

// linkStates are every state a link can report: each link's series exists
// for all of them from the start (1 for the current one, 0 for the others),
// so an alert on one never waits for its first occurrence.
var linkStates = []string{transport.StateUnknown, transport.StateHealthy, transport.StateLagging, transport.StateStalled,
	transport.StateNeedsReseed, transport.StateReseeding, transport.StatePaused, transport.StateDead, transport.StateLeft,
	transport.StateConflict, transport.StateFollower}

// Register registers the links' series with f.
func (s *Set) Register(f func(prometheus.Collector)) {
	f(s.shipSeconds)
	f(s)
}

// Describe sends nothing: the links' series are unchecked (their peers
// come and go).
func (s *Set) Describe(chan<- *prometheus.Desc) {}

// Collect sends each link's series, read at scrape time.
func (s *Set) Collect(ch chan<- prometheus.Metric) {
	for _, st := range s.Status() {
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
		for _, setting := range []string{"filter", "bandwidth", "compression"} {
			v := 0.0
			for _, d := range st.Drift {
				if d.Setting == setting {
					v = 1
				}
			}
			ch <- prometheus.MustNewConstMetric(descDrift, prometheus.GaugeValue, v, st.Peer, setting)
		}
		if st.PeerVersion != "" {
			ch <- prometheus.MustNewConstMetric(descPeerBuild, prometheus.GaugeValue, 1, st.Peer, st.PeerVersion)
		}
	}
}

// Describe sends nothing: the saturation's series are unchecked.
func (s *Saturation) Describe(chan<- *prometheus.Desc) {}

// Collect sends the saturation state, the water marks (so that a rule or a
// panel divides a backlog by its limit; a mark that is off has no series),
// the local writes refused, and each watched link's forecast.
func (s *Saturation) Collect(ch chan<- prometheus.Metric) {
	state := map[string]float64{api.StateHealthy: 0, api.StateThrottled: 1, api.StateSaturated: 2}[s.Evaluate(true).State]
	ch <- prometheus.MustNewConstMetric(descSaturation, prometheus.GaugeValue, state)
	wm := s.d.Marks
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
	ch <- prometheus.MustNewConstMetric(acceptor.DescRefusals, prometheus.CounterValue, float64(s.Refusals()), acceptor.SourceOutboundBacklog)
	// From the links watched at scrape time: a link detached, or gone with
	// a term, has no series (never a stale one).
	for peer, f := range s.Forecasts() {
		if f.SecondsToLimit != nil {
			ch <- prometheus.MustNewConstMetric(descToLimit, prometheus.GaugeValue, *f.SecondsToLimit, peer, f.Mark)
		}
	}
}

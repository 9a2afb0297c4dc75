package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"time"

	"github.com/replicator/replicator/entry"
)

// PeersReport is GET /admin/peers.
type PeersReport struct {
	Cluster  string            `json:"cluster"`
	Links    []LinkStatus      `json:"links"`
	Incoming map[string]Counts `json:"incoming"`
	Refusals map[string]uint64 `json:"refusals"`
	Streams  []StreamReport    `json:"streams"`
	// Members are the nodes known through gossip, with their liveness and
	// whether they are shipped to.
	Members []Member `json:"members,omitempty"`
	// Rejoin is this node's rejoin after losing data, and the peers that
	// asked it for a re-seed or whose rejoin it waits to end.
	Rejoin RejoinReport `json:"rejoin"`
}

// StreamReport is what this node applied of one peer stream (persisted).
type StreamReport struct {
	Origin string `json:"origin"`
	Stream string `json:"stream"`
	HWM    uint64 `json:"hwm"`
	// Merged entries went through an LWW merge; with DeadLettered, Seeded
	// and Filtered it sums to HWM unless an entry was applied twice.
	Merged       uint64 `json:"merged"`
	DeadLettered uint64 `json:"dead_lettered"`
	// Seeded entries were covered by a re-seed's snapshot instead.
	Seeded uint64 `json:"seeded"`
	// Filtered entries held no key the sender's filter for this link lets
	// cross: a marker stood for them.
	Filtered uint64 `json:"filtered"`
	// Frontier is the commit HLC of the last applied entry.
	Frontier string `json:"frontier"`
}

// DigestReport is GET /admin/digest.
type DigestReport struct {
	Cluster    string `json:"cluster"`
	Digest     string `json:"digest"`
	Keys       int    `json:"keys"`
	Tombstones int    `json:"tombstones"`
	Counters   int    `json:"counters"`
	// Prefixes are the key prefixes the digest covers (?prefix=, which
	// repeats): none, every key.
	Prefixes []string `json:"prefixes,omitempty"`
}

// WALReport is GET /admin/wal: the outbound WAL, each peer's backlog in it,
// the node's saturation, and the replay permits of incoming batches.
type WALReport struct {
	Stream        string            `json:"stream"`
	First         uint64            `json:"first_index"`
	Last          uint64            `json:"last_index"`
	Applied       uint64            `json:"applied_index"`
	Bytes         int64             `json:"bytes"`
	Segments      int               `json:"segments"`
	Repairs       int64             `json:"torn_tail_repairs"`
	DroppedBytes  int64             `json:"torn_tail_dropped_bytes"`
	WriteFailures int64             `json:"write_failures"`
	Writes        uint64            `json:"writes"`
	Groups        uint64            `json:"commit_groups"`
	Peers         []PeerBacklog     `json:"peers"`
	Saturation    SaturationReport  `json:"saturation"`
	Permits       PermitStats       `json:"permits"`
	Refusals      map[string]uint64 `json:"refusals_by_source"`
}

// PeerBacklog is one peer's share of the WAL.
type PeerBacklog struct {
	Peer             string  `json:"peer"`
	Acked            uint64  `json:"acked_index"`
	Entries          uint64  `json:"backlog_entries"`
	Bytes            int64   `json:"backlog_bytes"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Overflow         string  `json:"overflow"`
	State            string  `json:"state"`
	Retained         bool    `json:"wal_retained"`
	Forecast
}

// Forecast is a link's trend over the last minute: the writes that entered
// its backlog and the writes the peer acknowledged, per second, and, when
// the backlog grows toward a high-water mark at those rates, the seconds
// until it reaches it and which mark (entries, bytes, or age: nothing
// drained while something waits). SecondsToLimit is null when the backlog
// is not growing toward a mark, and 0 once over one.
type Forecast struct {
	WriteRate float64 `json:"write_rate"`
	DrainRate float64 `json:"drain_rate"`
	// Capacity is the entries a second the link's bandwidth limit lets
	// through (0: no limit): writes above it grow the backlog.
	Capacity       float64  `json:"drain_capacity,omitempty"`
	SecondsToLimit *float64 `json:"seconds_to_limit"`
	Mark           string   `json:"limit_mark,omitempty"`
}

// OriginReport is GET /admin/origin.
type OriginReport struct {
	Cluster  string `json:"cluster"`
	Resolver string `json:"resolver"`
	Stream   string `json:"stream"`
	Version  string `json:"version"`
	// RESP is the Redis-protocol front door (nil: off).
	RESP *RESPReport `json:"resp,omitempty"`
}

// RESPReport is what the RESP door did since the node started.
type RESPReport struct {
	Addr        string            `json:"addr"`
	Connections int64             `json:"connections"`
	Commands    uint64            `json:"commands"`
	Errors      map[string]uint64 `json:"errors,omitempty"`
}

// ClusterReport is GET /admin/cluster: the nodes of this node's cluster,
// who leads, and how far each has applied the log.
type ClusterReport struct {
	Cluster string `json:"cluster"`
	// Node answered; Mode is "single" (a node alone: a group of one) or
	// "raft" (one of several nodes).
	Node    string        `json:"node"`
	Mode    string        `json:"mode"`
	State   string        `json:"state"`
	Leader  string        `json:"leader"`
	Term    uint64        `json:"term"`
	Commit  uint64        `json:"commit_index"`
	Applied uint64        `json:"applied_index"`
	Last    uint64        `json:"last_log_index"`
	Stream  string        `json:"stream"`
	Nodes   []ClusterNode `json:"nodes"`
	// Incarnation is the answering node's data directory's (its raft
	// identity is its node ID and this).
	Incarnation string `json:"incarnation,omitempty"`
	// RefusedBy: another node refused this one lately (it was removed,
	// replaced by a newer incarnation, or lost in a recovery), and why.
	RefusedBy *Refusal `json:"refused_by,omitempty"`
	// Format is the command encoding the log is written in as this node
	// applied it: a rolling upgrade is done once it reaches the newest
	// build's (the leader raises it once every member reads it).
	Format int `json:"command_format,omitempty"`
	// First is the first index this node's raft log holds (the log is
	// compacted up to a snapshot: a follower further behind is sent the
	// snapshot).
	First uint64 `json:"first_log_index"`
	// Removed are the nodes (or single incarnations, "node.incarnation")
	// the cluster's log records as removed, and why: none of them may be a
	// member again.
	Removed []RemovedNode `json:"removed,omitempty"`
	// Groups are the cluster's raft groups when it runs several (issue
	// 51; none: one), as the answering node sees them.
	Groups []GroupReport `json:"groups,omitempty"`
}

// RemovedNode is one removal record of the cluster's log.
type RemovedNode struct {
	ID  string `json:"id"`
	Why string `json:"why"`
}

// ClusterNode is one node of the cluster's configuration (or one gossip
// sees that is not in it yet).
type ClusterNode struct {
	ID string `json:"id"`
	// Incarnation is its data directory's: a node ID shows twice while a
	// new incarnation (a wiped or restored directory) replaces the old.
	Incarnation string `json:"incarnation,omitempty"`
	Raft        string `json:"raft"`
	API         string `json:"api,omitempty"`
	Voter       bool   `json:"voter"`
	Leader      bool   `json:"leader"`
	// Gossip is what memberlist says of it (alive, suspect, dead, left;
	// "self" for the node that answered).
	Gossip string `json:"gossip,omitempty"`
	// State, Applied and Term are the node's own answer (State
	// "unreachable" when it gave none; "removed" or "not a member" for a
	// node gossip sees that the configuration does not hold, with Error
	// saying why); Lag is how many log entries it has yet to apply of what
	// the cluster committed.
	State   string `json:"state"`
	Term    uint64 `json:"term,omitempty"`
	Applied uint64 `json:"applied_index"`
	Lag     uint64 `json:"lag"`
	Error   string `json:"error,omitempty"`
}

// DeadLetterReport is one entry of GET /admin/deadletters.
type DeadLetterReport struct {
	ID     string    `json:"id"`
	Origin string    `json:"origin"`
	Stream string    `json:"stream"`
	Index  uint64    `json:"index"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	Op     string    `json:"op"`
	Key    string    `json:"key,omitempty"`
}

// HistorySample is one point of the chart: every link's backlog, and the
// node's saturation, at one time.
type HistorySample struct {
	Time       time.Time             `json:"t"`
	Saturation string                `json:"saturation"`
	Peers      map[string]PeerSample `json:"peers"`
}

// PeerSample is one link at one time.
type PeerSample struct {
	State   string  `json:"state"`
	Entries uint64  `json:"entries_behind"`
	Bytes   int64   `json:"bytes_behind"`
	Oldest  float64 `json:"oldest_unacked_age_seconds"`
}

// HistoryReport is GET /admin/history: the samples after ?after (Unix
// milliseconds; all of them without it), oldest first.
type HistoryReport struct {
	IntervalSeconds float64         `json:"interval_seconds"`
	SpanSeconds     float64         `json:"span_seconds"`
	Samples         []HistorySample `json:"samples"`
}

// IdemReport is GET /v1/idempotency/{key}: what a keyed request was answered.
type IdemReport struct {
	Key     string          `json:"key"`
	Status  int             `json:"status"`
	Body    json.RawMessage `json:"body"`
	Version string          `json:"version"`
	Origin  string          `json:"origin"`
	Expires time.Time       `json:"expires"`
}

// LagReport is GET /admin/lag: replication lag percentiles of the entries
// applied here since a time (at most the last 262,144 entries).
type LagReport struct {
	Since   time.Time `json:"since"`
	Samples int       `json:"samples"`
	P50MS   float64   `json:"p50_ms"`
	P90MS   float64   `json:"p90_ms"`
	P99MS   float64   `json:"p99_ms"`
	MaxMS   float64   `json:"max_ms"`
	// Stages splits the lag of the entries whose sender said when it sent
	// them (acceptor.Lag): ship (commit to send, on the sender's clock),
	// wire (send to received, across the two clocks: skew shows here),
	// apply (received to synced apply, here).
	Stages map[string]StageReport `json:"stages,omitempty"`
}

// StageReport is one stage's percentiles.
type StageReport struct {
	Samples int     `json:"samples"`
	P50MS   float64 `json:"p50_ms"`
	P90MS   float64 `json:"p90_ms"`
	P99MS   float64 `json:"p99_ms"`
	MaxMS   float64 `json:"max_ms"`
}

// RejoinReport is the node's own rejoin and what peers asked of it.
type RejoinReport struct {
	// Phases is this node's rejoin with each peer: "requesting" (waiting
	// for its re-seed) or "seeding" (owes it one).
	Phases map[string]string `json:"phases,omitempty"`
	// Requests are peers that asked this node for a re-seed ("owed") or
	// whose rejoin it waits to end ("awaiting").
	Requests map[string][]string `json:"requests,omitempty"`
}

// Saturation states, in order.
const (
	StateHealthy   = "healthy"
	StateThrottled = "throttled"
	StateSaturated = "saturated"
)

// Overflow modes of a peer link.
const (
	OverflowReject = "reject" // refuse local writes while the peer's backlog is over its high-water mark
	OverflowDetach = "detach" // stop retaining the WAL for the peer; it needs a re-seed
)

// WaterMarks bound a peer link's backlog. A link over any high-water mark
// saturates the node; it leaves saturation only once every link is under
// every low-water mark (hysteresis), passing through throttled.
type WaterMarks struct {
	HighEntries uint64        `json:"high_entries"`
	LowEntries  uint64        `json:"low_entries"`
	HighBytes   int64         `json:"high_bytes"`
	LowBytes    int64         `json:"low_bytes"`
	HighAge     time.Duration `json:"high_age"`
	LowAge      time.Duration `json:"low_age"`
}

// SaturationReport is the node's saturation state and why.
type SaturationReport struct {
	State      string     `json:"state"`
	Cause      string     `json:"cause,omitempty"`
	Peer       string     `json:"peer,omitempty"`
	Since      time.Time  `json:"since"`
	Thresholds WaterMarks `json:"thresholds"`
	Refusals   uint64     `json:"refusals"`
}

// FilterReport is GET and PUT /admin/peers/NAME/filter: the link's filter
// as the cluster's log holds it.
type FilterReport struct {
	Peer string `json:"peer"`
	// Filter is the filter in force for the entries appended from now on.
	Filter entry.Filter `json:"filter"`
	// Recorded: the log holds it (false: this node's flags, until the
	// leader records them).
	Recorded bool `json:"recorded"`
	// Epochs are the filters the stream's kept entries ship by, oldest
	// first, each from an index of the stream on.
	Epochs []FilterEpochReport `json:"epochs,omitempty"`
	// Backfill are the ranges a widening newly included that the peer
	// has not taken yet, and the widening's generation.
	Backfill           []entry.Span `json:"backfill_pending,omitempty"`
	BackfillGeneration uint64       `json:"backfill_generation,omitempty"`
	// Keep are the ranges whose tombstones the cluster keeps for this link
	// whatever the collection cutoff (what the filter keeps home, less
	// what was released, and what is still to backfill); Released the
	// ranges the operator declared a permanent narrowing of; Kept what the
	// last collection kept (docs/DATAMODEL.md "Filters").
	Keep     []entry.Span    `json:"keep_tombstones_in,omitempty"`
	Released []entry.Span    `json:"released,omitempty"`
	Kept     *KeptTombstones `json:"kept_tombstones,omitempty"`
	// PeerKeeps are the ranges the peer keeps for each of its other links,
	// as its heartbeats said, and KeptForPeerLinks what the last
	// collection kept of the peer's own deletes there.
	PeerKeeps        []entry.TargetSpans `json:"peer_keeps,omitempty"`
	KeptForPeerLinks *KeptTombstones     `json:"kept_for_peer_links,omitempty"`
	// PeerFilter is the filter the peer's heartbeats say it holds toward
	// this cluster (nil: not heard since this cluster's data began), and
	// PartialStreams the peer's streams this cluster holds only in part
	// because that filter kept some of them home: a re-seed from here
	// claims none of them (docs/DATAMODEL.md "Filters").
	PeerFilter     *entry.Filter `json:"peer_filter,omitempty"`
	PartialStreams []string      `json:"partial_streams,omitempty"`
}

// FilterEpochReport is one filter of a link and the first index of the
// stream it holds for.
type FilterEpochReport struct {
	From   uint64       `json:"from_index"`
	Filter entry.Filter `json:"filter"`
}

// CompressionReport is a link's compression of batch bodies (GET and PUT
// /admin/peers/NAME/compression).
type CompressionReport struct {
	Peer        string `json:"peer"`
	Compression string `json:"compression"` // zstd or none
	// Recorded: the cluster's log holds it (false: this node's flags).
	Recorded bool `json:"recorded"`
}

// ConfigDrift is a setting of a link that this node's flags or YAML
// declare otherwise than the cluster's log holds: the log's is in force.
type ConfigDrift struct {
	Setting  string `json:"setting"` // filter, bandwidth or compression
	Declared string `json:"declared"`
	InForce  string `json:"in_force"`
}

// BandwidthReport is GET and PUT /admin/peers/NAME/bandwidth.
type BandwidthReport struct {
	Peer string `json:"peer"`
	// BytesPerSecond is the link's limit over request bodies as sent
	// (after compression); 0: none.
	BytesPerSecond int64 `json:"bytes_per_second"`
	// Recorded: the cluster's log holds it (false: this node's flags).
	Recorded bool `json:"recorded"`
	// ThrottledSeconds is how long this node's posts waited for it (0 at
	// a node that does not lead).
	ThrottledSeconds float64 `json:"throttled_seconds"`
}

// StreamReports are the high-water marks of the streams a node applied,
// as /admin/peers shows them ([] for none).
func StreamReports(hwms []entry.HWM) []StreamReport {
	out := []StreamReport{}
	for _, h := range hwms {
		out = append(out, StreamReport{Origin: h.Origin, Stream: entry.StreamID(h.Stream).String(),
			HWM: h.Index, Merged: h.Merged, DeadLettered: h.DeadLettered, Seeded: h.Seeded, Filtered: h.Filtered, Frontier: h.Commit.String()})
	}
	return out
}

// PeerReport is a peer added at run time (POST /admin/peers, DELETE
// /admin/peers/NAME): never its secret.
type PeerReport struct {
	Name string   `json:"name"`
	URLs []string `json:"urls,omitempty"`
	// Secret says the link has one (sealed in the cluster's log).
	Secret bool `json:"secret,omitempty"`
	// AddedAt is the log index of the command that added it.
	AddedAt uint64 `json:"added_at,omitempty"`
	Removed bool   `json:"removed,omitempty"`
}

// DriftOf lists the settings of a link that the flags declare (filter,
// bandwidth in bytes/s, compression) otherwise than ls, what the cluster's
// log holds of it, says. A setting the log never recorded is the flags'
// own, and never drifts (docs/OPERATIONS.md "Declared and in force").
func DriftOf(filter entry.Filter, bandwidth int64, compression string, ls entry.LinkSettings) []ConfigDrift {
	var out []ConfigDrift
	if f := filter.Normal(); len(ls.Filters) > 0 && !ls.Current().Equal(f) {
		out = append(out, ConfigDrift{Setting: "filter", Declared: f.String(), InForce: ls.Current().String()})
	}
	if ls.BandwidthSet && ls.Bandwidth != bandwidth {
		out = append(out, ConfigDrift{Setting: "bandwidth", Declared: rate(bandwidth), InForce: rate(ls.Bandwidth)})
	}
	if declared := cmp.Or(compression, "none"); ls.CompressionSet && ls.Compression != declared {
		out = append(out, ConfigDrift{Setting: "compression", Declared: declared, InForce: ls.Compression})
	}
	return out
}

func rate(b int64) string {
	if b == 0 {
		return "no limit"
	}
	return fmt.Sprintf("%d bytes/s", b)
}

// GroupReport is one raft group of a cluster of several (docs/CLUSTER.md
// "Several raft groups per cluster"), as the answering node sees it.
type GroupReport struct {
	Group int `json:"group"`
	// Leader is the node leading the group ("": none known); State this
	// node's part in it (leader, follower, candidate).
	Leader string `json:"leader"`
	State  string `json:"state"`
	// Slots is how many of the key slots the group owns; Applied the last
	// index of its log this node applied.
	Slots   int    `json:"slots"`
	Applied uint64 `json:"applied_index"`
}

package api

import (
	"time"

	"github.com/replicator/replicator/entry"
)

// LinkStatus is one outgoing link as GET /admin/peers reports it (the
// "links" array) and as the pause, resume, reseed and detach endpoints
// answer. The node fills it from its shipper's figures; the JSON names are
// the contract.
type LinkStatus struct {
	Peer              string       `json:"peer"`
	URL               string       `json:"url"`
	State             string       `json:"state"`
	Acked             uint64       `json:"acked_index"`
	Last              uint64       `json:"last_index"`
	EntriesBehind     uint64       `json:"entries_behind"`
	BytesBehind       int64        `json:"bytes_behind"`
	OldestUnackedAge  float64      `json:"oldest_unacked_age_seconds"`
	LastContact       time.Time    `json:"last_contact,omitzero"`
	ConsecutiveErrors int          `json:"consecutive_errors"`
	LastError         string       `json:"last_error,omitempty"`
	InFlight          int          `json:"in_flight_batches"`
	Shipped           uint64       `json:"shipped_entries"`
	Resent            uint64       `json:"resent_entries"`
	Batches           uint64       `json:"batches"`
	Rewinds           uint64       `json:"rewinds"`
	PermitRefusals    uint64       `json:"permit_refusals"`
	Paused            bool         `json:"paused"`
	Detached          bool         `json:"detached"`
	NeedsReseed       bool         `json:"needs_reseed"`
	Reseed            ReseedStatus `json:"reseed"`
	ClockSkewMS       float64      `json:"clock_skew_ms"`
	Thresholds        Thresholds   `json:"thresholds"`
	// AntiEntropy is what the last comparison with the peer found (nil:
	// none yet since this node leads).
	AntiEntropy *AntiEntropyStatus `json:"antientropy,omitempty"`
	// Conflict is set when the peer holds entries of this stream that this
	// cluster does not (a restored or copied data directory).
	Conflict string `json:"identity_conflict,omitempty"`
	// ReseedOwed: the peer asked for a re-seed (it lost data), not sent yet.
	ReseedOwed bool `json:"reseed_owed,omitempty"`
	// Limits are what the peer said it accepts.
	Limits *PeerLimits `json:"peer_limits,omitempty"`
	// SendFailures counts every failed send or heartbeat, ever.
	SendFailures uint64 `json:"send_failures"`
	// Liveness is what gossip says of the peer (empty without gossip).
	Liveness string `json:"liveness,omitempty"`
	// Nodes are the peer cluster's nodes its answers listed: where the
	// link fails over to.
	Nodes []string `json:"peer_nodes,omitempty"`
	// PeerVersion is the build the peer last answered with.
	PeerVersion string `json:"peer_version,omitempty"`
	// Compression is the link's (none, or zstd toward nodes that decode
	// it); BytesRaw and BytesOnWire count request bodies before and after
	// it.
	Compression string `json:"compression"`
	BytesRaw    uint64 `json:"bytes_raw"`
	BytesOnWire uint64 `json:"bytes_on_wire"`
	// Filter is the link's filter ("every key", or "+prefix -prefix").
	Filter string `json:"filter"`
	// Backfill is the progress of the link's backfill (a widened filter).
	Backfill BackfillStatus `json:"backfill"`
	// BandwidthLimit is the link's limit in bytes per second of request
	// bodies as sent (0: none); ThrottledSeconds how long posts waited for
	// it, ever.
	BandwidthLimit   int64   `json:"bandwidth_limit"`
	ThrottledSeconds float64 `json:"throttled_seconds"`
	// KeptTombstones is what the last collection kept for this link past
	// the cutoff: deletes of ranges its filter keeps home (or has still to
	// backfill), which only a widening's backfill can carry to the peer
	// (docs/DATAMODEL.md "Filters"). Nil: nothing kept.
	KeptTombstones *KeptTombstones `json:"kept_tombstones,omitempty"`
	// KeptForPeerLinks is what the last collection kept of the peer's own
	// deletes in the ranges the peer keeps for its other links, as its
	// heartbeats said: a peer that loses its data gets them back by its
	// rejoin (docs/DATAMODEL.md "Deletes a narrowed link held back").
	KeptForPeerLinks *KeptTombstones `json:"kept_for_peer_links,omitempty"`
	// Drift lists the link's settings that this node's flags or YAML
	// declare otherwise than the cluster's log holds (the log's are in
	// force; docs/OPERATIONS.md "Declared and in force").
	Drift []ConfigDrift `json:"drift,omitempty"`
	// Runtime: the peer was added at run time (replicator peer add): it
	// can be removed the same way.
	Runtime bool `json:"runtime,omitempty"`
}

// KeptTombstones counts the tombstones and range tombstones a collection
// kept for a link, and the bytes they hold.
type KeptTombstones struct {
	Tombstones int   `json:"tombstones"`
	Ranges     int   `json:"range_tombstones"`
	Bytes      int64 `json:"bytes"`
}

// BackfillStatus is the progress of a link's backfill: the ranges a
// widened filter newly included, sent beside the live stream.
type BackfillStatus struct {
	Running bool `json:"running"`
	// Ranges are those of the running (or last) backfill; Pending those
	// the cluster's log says the peer has not taken yet.
	Ranges     []Span    `json:"ranges,omitempty"`
	Pending    []Span    `json:"pending,omitempty"`
	Sent       int       `json:"sent_keys"`
	Runs       int       `json:"runs"`
	Generation uint64    `json:"generation,omitempty"`
	Finished   time.Time `json:"finished,omitzero"`
	Error      string    `json:"error,omitempty"`
}

// Span is a range of keys [Start, End) ("" End: to the end).
type Span = entry.Span

// ReseedStatus is the progress of a link's re-seed.
type ReseedStatus struct {
	Running    bool      `json:"running"`
	Sent       int       `json:"sent_keys"`
	Total      int       `json:"total_keys"`
	Started    time.Time `json:"started,omitzero"`
	Finished   time.Time `json:"finished,omitzero"`
	Runs       int       `json:"runs"`
	Error      string    `json:"error,omitempty"`
	LastReason string    `json:"last_reason,omitempty"`
	Requested  bool      `json:"requested,omitempty"`
	// Live: live entries flow while the snapshot goes (the peer took the
	// re-seed's begin); Stream is the snapshot's own stream.
	Live   bool   `json:"live,omitempty"`
	Stream string `json:"stream,omitempty"`
}

// Thresholds are the backlog ages at which a link reports lagging and
// stalled.
type Thresholds struct {
	Lagging time.Duration `json:"lagging"`
	Stalled time.Duration `json:"stalled"`
}

// PeerLimits are an acceptor's bounds, as its acks announce them
// (wire.Limits) and a link's report shows them.
type PeerLimits struct {
	MaxBody  int64 `json:"max_body"`
	MaxKey   int   `json:"max_key"`
	MaxValue int   `json:"max_value"`
	// Pipeline is how many batches of one stream the receiver takes from
	// a sender at once, applying them in the order they arrived (0 or 1:
	// one at a time, as receivers before it did).
	Pipeline int `json:"pipeline,omitempty"`
	// Markers says the receiver takes filtered markers (entries standing
	// for a run its sender's filter left out): a sender whose filter
	// leaves entries out ships to it only then. It also says the receiver
	// takes a re-seed's Begin (both come with command format 3).
	Markers bool `json:"markers,omitempty"`
	// Contexts says the receiver's log keeps causal contexts (command
	// format 4): entries may carry them (cx). To another receiver a sender
	// sends entries without them, since it refuses fields it does not know.
	Contexts bool `json:"contexts,omitempty"`
	// OriginFilters says the receiver's log records each sender's filter
	// toward it (command format 7): heartbeats may carry it (of).
	OriginFilters bool `json:"origin_filters,omitempty"`
	// IdleFrontiers says the receiver takes a heartbeat's idle frontier
	// (idle): a sender that has nothing unacknowledged says so.
	IdleFrontiers bool `json:"idle_frontiers,omitempty"`
	// DeadLists says the receiver lists the entries it set aside in its
	// acks (Ack.DeadLettered): a sender's WAIT counts only such a peer.
	DeadLists bool `json:"dead_lists,omitempty"`
	// Expiry says the receiver's log keeps versions that expire (command
	// format 11): entries may carry an expiry (ex). To another receiver a
	// sender holds such entries back (dropping the expiry would keep the
	// key for ever there).
	Expiry bool `json:"expiry,omitempty"`
	// Floors says the receiver's log keeps counter floors (command format
	// 12): entries may carry floors (fl) or clear a key (cl). To another
	// receiver a sender holds them back (dropping the floors would keep a
	// deleted counter's increments there for ever).
	Floors bool `json:"floors,omitempty"`
	// OpenStreams says the receiver's log records the sender's open
	// streams (command format 14): heartbeats may carry them (open), and
	// its tombstone collection then waits for the least advanced.
	OpenStreams bool `json:"open_streams,omitempty"`
}

// AntiEntropyStatus is what the last comparison with a peer found (the
// leader's; /admin/peers shows it on each link).
type AntiEntropyStatus struct {
	LastPass  time.Time `json:"last_pass,omitzero"`
	Equal     bool      `json:"equal"`
	Divergent int       `json:"divergent_keys"`
	InFlight  int       `json:"in_flight"`
	Bytes     int64     `json:"bytes"`
	Seconds   float64   `json:"seconds"`
	// Repaired counts the versions repairs from this peer applied since
	// this node started leading.
	Repaired int `json:"repaired"`
	// Error is why the last comparison failed (empty: it did not).
	Error string `json:"error,omitempty"`
}

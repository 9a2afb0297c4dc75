package wire

import "github.com/replicator/replicator/api"

// Ack is the acceptor's JSON answer to a batch it took (HTTP 200), and the
// "hwm" it reports with a gap refusal (HTTP 409) so the sender rewinds.
type Ack struct {
	// Accepted is the number of entries in the batch.
	Accepted int `json:"accepted"`
	// Applied entries changed state or lost LWW to a newer stamp already
	// here (stale); either way they are now accounted for.
	Applied int `json:"applied"`
	// Duplicates were here already: at or below the high-water mark, or
	// the same stamp as what the key holds.
	Duplicates int `json:"duplicates"`
	// HWM is the receiver's high-water mark for the sender's stream after
	// this batch: the sender's cursor.
	HWM uint64 `json:"hwm"`
	// SuggestedBatch is the largest batch the receiver wants next (0: no
	// preference).
	SuggestedBatch int `json:"suggested_batch"`
	// PauseMS asks the sender to wait this long before the next batch.
	PauseMS int `json:"pause_ms"`
	// Now is the receiver's physical clock (ns) when it answered; senders
	// estimate the clock skew between the clusters from it.
	Now int64 `json:"now,omitempty"`
	// HWMCommit is the commit HLC of the entry at HWM ("wall.logical"), so
	// the sender can tell its own entry from one a restored copy of its
	// data directory wrote under the same index, and knows how far its
	// deletes have reached the receiver.
	HWMCommit string `json:"hwm_commit,omitempty"`
	// OriginFrontier is the highest commit HLC of the sender's cluster the
	// receiver applied, over its streams other than the batch's
	// ("wall.logical"): a sender that remembers nothing stamped that late
	// lost data (wiped, or restored from an older backup) and rejoins.
	OriginFrontier string `json:"origin_frontier,omitempty"`
	// Seeding, in a heartbeat's answer, is the snapshot stream (hex) of a
	// re-seed from the sender that began here (Header.Begin) and has not
	// ended: the sender's mark is already past what it carries, so a
	// sender that is not sending it any more sends a re-seed again.
	Seeding string `json:"seeding,omitempty"`
	// ReseedRecorded answers a heartbeat's re-seed request: recorded.
	ReseedRecorded bool `json:"reseed_recorded,omitempty"`
	// Limits are what the receiver accepts, so the sender can refuse a
	// write that could never replicate, and size its batches.
	Limits *Limits `json:"limits,omitempty"`
	// Version is the receiver's build, so a rolling upgrade shows which
	// peers run which version.
	Version string `json:"version,omitempty"`
	// ApplyMicros is how long the receiver took to apply the batch (its
	// synced commit included): the sender opens a second batch only when
	// the rest of the round trip, the wire, is the longer part.
	ApplyMicros int64 `json:"apply_us,omitempty"`
	// Nodes are the replicate URLs of every node of the receiver's cluster
	// (a cluster of several nodes): the sender fails over to them when the
	// one it posts to stops answering, without configuration.
	Nodes []string `json:"nodes,omitempty"`
	// DeadLettered are the indexes of the batch's entries (of one of the
	// sender's live streams) that the receiver holds set aside as dead
	// letters rather than applied, whether this batch or an earlier
	// delivery set them aside: its mark passed them, but it does not hold
	// them, and a sender's WAIT must not count it for them. DeadMore says
	// the list stopped at its bound (MaxDeadListed): the sender then
	// counts none of the batch's indexes as held.
	DeadLettered []uint64 `json:"dead_lettered_at,omitempty"`
	DeadMore     bool     `json:"dead_more,omitempty"`
}

// MaxDeadListed bounds Ack.DeadLettered.
const MaxDeadListed = 1024

// Limits are an acceptor's bounds, as its acks announce them
// (api.PeerLimits: a link's report shows them as they came).
type Limits = api.PeerLimits

// checkCluster refuses a cluster ID that does not match entry.ClusterIDPattern.

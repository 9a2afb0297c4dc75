package api

import "time"

// Counts are the acceptor's outcome counters, per origin cluster.
type Counts struct {
	Batches    uint64 `json:"batches"`
	Applied    uint64 `json:"applied"`    // newly applied and won LWW
	Stale      uint64 `json:"stale"`      // newly applied, lost LWW
	Duplicates uint64 `json:"duplicates"` // already applied (hwm or equal stamp)
	DroppedOwn uint64 `json:"dropped_own"`
	Refused    uint64 `json:"refused"`
	// DeadLettered entries broke this node's limits and were set aside.
	DeadLettered uint64 `json:"dead_lettered"`
	// DroppedUnknown are snapshot entries of clusters this node does not
	// know, not taken.
	DroppedUnknown uint64 `json:"dropped_unknown"`
	// Filtered are indexes the sender's filtered markers covered: entries
	// whose keys its filter for this link keeps home.
	Filtered uint64 `json:"filtered"`
	// Conflicts are the records the sender's entries added to the conflict
	// log: versions last-writer-wins discarded whose winner had not seen
	// them (docs/DATAMODEL.md "Conflicts").
	Conflicts uint64 `json:"conflicts"`
	// RangeDiscards are the sender's range deletes that deleted live keys
	// here: counted per range, not logged per key.
	RangeDiscards uint64 `json:"range_discards"`
	// Resurrections are a re-seed's versions older than this tree's
	// collection horizon, of keys it held nothing of, not taken: they may
	// have been deleted here (docs/ANTIENTROPY.md).
	Resurrections uint64 `json:"possible_resurrections"`
	// Withheld are snapshot entries relaying a third cluster's writes that
	// the third cluster's own filter toward this one keeps home, not taken
	// (docs/DATAMODEL.md "Filters").
	Withheld uint64 `json:"withheld_by_origin_filter"`
	// WithheldUnheard are snapshot entries relaying a third cluster's
	// writes while its filter toward this one was not heard here (this node
	// lost its data, or never heard from it), not taken: the third cluster
	// sends them itself (docs/DATAMODEL.md "Filters").
	WithheldUnheard uint64 `json:"withheld_filter_unheard"`
}

// PermitStats describe the replay permits.
type PermitStats struct {
	Capacity int    `json:"capacity"`
	InUse    int    `json:"in_use"`
	Queued   int    `json:"queued"`
	QueueCap int    `json:"queue_capacity"`
	Refused  uint64 `json:"refused"`
	State    string `json:"state"` // healthy, throttled, saturated
}

// Liveness of a member, as memberlist sees it.
const (
	LiveAlive   = "alive"
	LiveSuspect = "suspect"
	LiveDead    = "dead" // failed: stopped answering probes
	LiveLeft    = "left" // left gracefully
)

// MemberMeta is what each node gossips about itself (memberlist node meta,
// at most 512 bytes).
type MemberMeta struct {
	V         int    `json:"v"`
	Cluster   string `json:"c"`
	Stream    string `json:"s"`
	API       string `json:"api"`
	Replicate string `json:"rep"`
	// Node, Inc, Raft and Fresh describe a node of a cluster of several:
	// its node ID, its data directory's incarnation (raft knows the node by
	// both; the leader confirms them on the raft port before it adds it),
	// its raft address, and whether it holds no raft state and no data (it
	// may take part in forming a new cluster).
	Node  string `json:"n,omitempty"`
	Inc   string `json:"inc,omitempty"`
	Raft  string `json:"raft,omitempty"`
	Fresh bool   `json:"fresh,omitempty"`
	// Leaving is set just before a graceful leave, so that the others can
	// tell a node that left from one that died (memberlist's leave event
	// does not say which).
	Leaving bool `json:"leaving,omitempty"`
}

// Member is one node known through gossip.
type Member struct {
	Node    string     `json:"node"`
	Addr    string     `json:"gossip_addr"`
	Meta    MemberMeta `json:"meta"`
	State   string     `json:"state"`
	Since   time.Time  `json:"since"`
	Shipped bool       `json:"shipped_to"`
	Note    string     `json:"note,omitempty"`
}

// Refusal is the last time another node refused this one.
type Refusal struct {
	By     string    `json:"by"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

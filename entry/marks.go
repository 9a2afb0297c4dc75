package entry

import "github.com/replicator/replicator/hlc"

// HWM is what this node applied of one origin stream: every index at or
// below Index is applied, and Commit is the commit HLC of that entry (the
// stream's applied commit frontier). Merged counts the entries that went
// through a merge; it commits with them, so it survives crashes exactly and
// exceeds the number of distinct indexes only if an entry was applied twice.
type HWM struct {
	Origin string
	Stream [16]byte
	Index  uint64
	Commit hlc.Timestamp
	Merged uint64
	// DeadLettered counts the entries set aside instead.
	DeadLettered uint64
	// Seeded counts the entries a re-seed covered instead: its snapshot
	// carried their effect and its trailer raised Index past them.
	Seeded uint64
	// Filtered counts the entries a filtered marker covered: the link's
	// filter let none of their keys cross.
	// Merged + DeadLettered + Seeded + Filtered = Index for a stream that
	// began at 1, unless an entry was applied twice.
	Filtered uint64
}

// Cursor is a shipper's position for one peer: the peer acknowledged every
// entry of Stream up to Index.
type Cursor struct {
	Stream [16]byte
	Index  uint64
}

// Flags of a peer's re-seed record (a store's R record), which the
// acceptor sets from a peer's heartbeat and the links read.
const (
	// ReseedRequested: the peer asked for a re-seed (it lost its data);
	// this node owes it a snapshot that may carry the peer's own writes.
	ReseedRequested byte = 1 << 0
	// AwaitRejoin: the peer is rejoining after losing data and will re-seed
	// this node once it has caught up; until that trailer arrives, writes
	// older than this node's tombstones may still come from it.
	AwaitRejoin byte = 1 << 1
)

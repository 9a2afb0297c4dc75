package machine

import (
	"errors"
	"fmt"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// Commands are what the cluster's log carries: every mutation of a
// cluster's state is one, applied by every node in log order. A command is
// a version byte and a msgpack array whose first element is its kind;
// version 2 puts the proposal's ID between the two (proposal.go).

// ErrMalformed is the class of errors for command bytes that do not decode:
// the log is checksummed, so on a node these are corruption or a command of
// a newer version, and applying past it is never safe.
var ErrMalformed = errors.New("machine: malformed command")

// Command encodings. Version 1 is what every build reads; version 2 adds the
// proposal's ID. A leader writes version 2 only once the log says every
// node reads it (a Format command, proposal.go).
const (
	commandV1 = 1
	commandV2 = 2
	// ReadsFormat is the newest format this build reads: encoding 2, from
	// format 3 (FormatLinks) link commands, in the same encoding, and from
	// format 4 (FormatConflicts) versions with contexts and the conflict
	// log, from format 5 (FormatRepair) anti-entropy's repairs, and from
	// format 6 (FormatRejoinHorizon) a rejoin's re-seed judged against the
	// collection horizon, and from format 7 (FormatRepairJudged) repairs
	// judged as inbound batches are, and from format 8
	// (FormatConflictClaims) conflict records retired by their loser's own
	// line only, and from format 9 (FormatDeletesOfNothing) a delete of a
	// key that holds no value writes nothing, and from format 10
	// (FormatBatchConditions) batches conditional on keys' versions, and
	// from format 11 (FormatExpiry) versions that expire, and from format
	// 12 (FormatCounterFloors) counters deleted and set by observed floors,
	// and from format 13 (FormatStagedSnapshots) a snapshot's entries
	// staged until its trailer, and from format 14 (FormatOpenStreams) a
	// peer's open streams.
	ReadsFormat = FormatOpenStreams
)

// Kind names a command.
type Kind uint8

const (
	// KindLocal is a group of local writes, stamped by the leader.
	KindLocal Kind = iota + 1
	// KindCursor records that a peer acknowledged the stream through an
	// index.
	KindCursor
	// KindTruncate drops the outbound entries before an index (every peer
	// acknowledged them).
	KindTruncate
	// KindMint starts the cluster's stream (and seals the one before it):
	// at bootstrap, and after a lost majority.
	KindMint
	// KindInbound is a peer's batch the acceptor admitted.
	KindInbound
	// KindRecord changes a peer's re-seed request flags (R) or this
	// node's rejoin phase with it (J), if it still holds what the proposer
	// read (compare and set).
	KindRecord
	// KindCollect drops tombstones stamped below a cutoff and idempotency
	// records expired before a time (the leader decides both from what
	// every peer holds; every node drops the same).
	KindCollect
	// KindDeadLetter replays or discards a dead letter (an operator's
	// decision).
	KindDeadLetter
	// KindRemoveNode records that a node was removed from the cluster (a
	// node ID: every incarnation of it) or that one incarnation of a node
	// is out for good (replaced by a newer one, or lost in a recovery): it
	// is never added back.
	KindRemoveNode
	// KindFormat records the command encoding every node reads from now on.
	KindFormat
	// KindLink sets a link's filter or bandwidth limit (format 3).
	KindLink
	// KindRepair applies versions anti-entropy pulled from a peer
	// (format 5).
	KindRepair
	// KindPeer adds or removes a peer at run time (format 13).
	KindPeer
	// KindGroups records the cluster's raft groups and slot map (format
	// 14, group 0's log).
	KindGroups
	kinds
)

func (k Kind) String() string {
	switch k {
	case KindLocal:
		return "local"
	case KindCursor:
		return "cursor"
	case KindTruncate:
		return "truncate"
	case KindMint:
		return "mint"
	case KindInbound:
		return "inbound"
	case KindRecord:
		return "record"
	case KindCollect:
		return "collect"
	case KindDeadLetter:
		return "dead_letter"
	case KindRemoveNode:
		return "remove_node"
	case KindFormat:
		return "format"
	case KindLink:
		return "link"
	case KindRepair:
		return "repair"
	case KindPeer:
		return "peer"
	case KindGroups:
		return "groups"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Command is one entry of the cluster's log. Exactly one of its fields
// besides ID is set, and names its kind (etcd's InternalRaftRequest).
type Command struct {
	// ID names the proposal (encoding 2): the node that proposed it finds
	// the command it built by it when raft hands the entry back. Zero in a
	// command of encoding 1.
	ID ProposalID

	// Local is a group of local writes in the order the leader stamped
	// them.
	Local []Proposal
	// Cursor records that a peer acknowledged the stream through an index.
	Cursor *CursorCmd
	// Truncate drops outbound entries every peer acknowledged.
	Truncate *TruncateCmd
	// Mint starts the cluster's stream (and seals the one before it).
	Mint *MintCmd
	// Inbound is a peer's batch the acceptor admitted.
	Inbound *Inbound
	// Record changes a peer record if it holds what the proposer read.
	Record *RecordCmd
	// Collect drops tombstones and expired idempotency records.
	Collect *CollectCmd
	// DeadLetter replays or discards a dead letter.
	DeadLetter *DeadLetterCmd
	// RemoveNode records a node (or one incarnation) out for good.
	RemoveNode *RemoveNodeCmd
	// Format records the command encoding every node reads from now on.
	Format *FormatCmd
	// Link sets a link's filter or bandwidth limit.
	Link *LinkCmd
	// Repair applies versions pulled from a peer.
	Repair *RepairCmd
	// Peer adds or removes a peer at run time.
	Peer *PeerCmd
	// Groups records the cluster's raft groups and slot map.
	Groups *GroupsCmd
}

// Kind is the kind the set field names (0 when none or several are set).
func (c *Command) Kind() Kind {
	k, n := Kind(0), 0
	for _, f := range []struct {
		set  bool
		kind Kind
	}{
		{len(c.Local) > 0, KindLocal}, {c.Cursor != nil, KindCursor}, {c.Truncate != nil, KindTruncate},
		{c.Mint != nil, KindMint}, {c.Inbound != nil, KindInbound}, {c.Record != nil, KindRecord},
		{c.Collect != nil, KindCollect}, {c.DeadLetter != nil, KindDeadLetter}, {c.RemoveNode != nil, KindRemoveNode},
		{c.Format != nil, KindFormat}, {c.Link != nil, KindLink}, {c.Repair != nil, KindRepair}, {c.Peer != nil, KindPeer}, {c.Groups != nil, KindGroups},
	} {
		if f.set {
			k, n = f.kind, n+1
		}
	}
	if n != 1 {
		return 0
	}
	return k
}

// CursorCmd: Peer acknowledged the stream At.Stream through At.Index.
type CursorCmd struct {
	Peer string
	At   entry.Cursor
}

// TruncateCmd: the outbound entries of Stream before First go (nothing,
// when Stream is no longer the current stream).
type TruncateCmd struct {
	Stream entry.StreamID
	First  uint64
}

// MintCmd: the new stream, and the counter epoch it counts under.
type MintCmd struct {
	Stream entry.StreamID
	Epoch  uint32
}

// RecordCmd: Peer's record Record (RecordReseed or RecordRejoin) is set to
// Set if it holds Expect (0: no record).
type RecordCmd struct {
	Peer                string
	Record, Expect, Set byte
}

// CollectCmd: tombstones stamped below Cutoff (zero: none) and idempotency
// records expired before IdemBefore (0: none) go, at most Max of each.
type CollectCmd struct {
	Cutoff     hlc.Timestamp
	IdemBefore int64
	Max        int
	// ConflictsBefore and ConflictsMaxBytes are the conflict log's
	// retention (format 4): records logged before the first go, and the
	// oldest while the log holds more than the second (0: no bound).
	ConflictsBefore   hlc.Timestamp
	ConflictsMaxBytes int64
	// Keep are, per link, the ranges whose tombstones and range
	// tombstones stay whatever the cutoff (entry.LinkSettings.KeepSpans;
	// from format 7, FormatKeptTombstones): a delete a link's filter held
	// back waits there for a widening's backfill to carry it.
	Keep []KeepRanges
}

// KeepRanges are the ranges a collection keeps for the link to Peer: every
// delete there, or (Origin set) only those Origin wrote, kept for Origin's
// own link to Peer (entry.LinkSettings.Onward): a delete Origin holds back
// from Peer and loses with its data comes back to it by its rejoin.
type KeepRanges struct {
	Peer   string
	Origin string
	Spans  []entry.Span
}

// keptName is the name a collection's figures give the ranges: the peer,
// or origin->peer.
func (k KeepRanges) keptName() string {
	if k.Origin == "" {
		return k.Peer
	}
	return k.Origin + "->" + k.Peer
}

// before orders a collect command's kept ranges: by peer, then origin.
func (k KeepRanges) before(o KeepRanges) bool {
	return k.Peer < o.Peer || (k.Peer == o.Peer && k.Origin < o.Origin)
}

// maxKeepSpans bounds the ranges a collect command keeps for one link
// (a filter's excluded ranges and its pending backfill).
const maxKeepSpans = 1024

func (c *CollectCmd) hasConflicts() bool {
	if len(c.Keep) > 0 {
		return true // the 7-field shape carries both
	}
	return !c.ConflictsBefore.IsZero() || c.ConflictsMaxBytes > 0
}

// DeadLetterCmd: the dead letter of Origin's Stream at Index is replayed
// (Action DeadReplay) or discarded (DeadDiscard).
type DeadLetterCmd struct {
	Origin string
	Stream entry.StreamID
	Index  uint64
	Action byte
}

// RemoveNodeCmd: ID is a node ID (every incarnation of it), or a raft server
// ID ("node.inc"; "node." for a node known before incarnations) for one
// incarnation; Why is a cluster.Removal (0 or 1: an operator's removal).
type RemoveNodeCmd struct {
	ID  string
	Why byte
}

// FormatCmd: every command from the next on may be of encoding Version.
type FormatCmd struct {
	Version uint8
}

// Dead-letter actions (DeadLetterCmd.Action).
const (
	DeadReplay  byte = 1
	DeadDiscard byte = 2
)

// maxCollect bounds what one collect command drops of each kind.
const maxCollect = 1 << 20

// The peer records a KindRecord command changes.
const (
	RecordReseed byte = 'R'
	RecordRejoin byte = 'J'
)

// Proposal is one local write of a group.
type Proposal struct {
	// Entry is the write: op, key, value, end, ops, and its stamps (Commit,
	// and Stamp when the caller pinned one). Origin, stream, index, a
	// counter's totals and the idempotency record are the machine's to
	// fill.
	Entry entry.Entry
	// Cond is a precondition (nil: none).
	Cond *Condition
	// Delta is an increment (op counter).
	Delta int64
	// Keyed is the request's idempotency key (nil: none).
	Keyed *Keyed
}

// Keyed is a request that carries an idempotency key.
type Keyed struct {
	Key         string
	Fingerprint []byte
	Answer      AnswerKind
	OpID        string // a batch's operation ID, for its answer
	// Expires is when the record may be collected (wall ns): the leader's
	// commit stamp plus the window, fixed in the command so every node
	// records the same.
	Expires int64
}

package wire

import (
	"errors"
	"fmt"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// The words of an inbound batch, shared by the acceptor, which admits and
// screens it, and the state machine, which applies it: the batch with the
// acceptor's verdicts on its entries, what applying it did, and the
// refusals a receiver answers with.

var (
	// ErrForbidden refuses a batch the tree shows the sender may not send
	// (a snapshot into one of its real streams, a stream over the bound).
	ErrForbidden = errors.New("machine: forbidden")
)

// GapError refuses a batch that does not continue the stream: the sender
// must rewind to HWM and resend from HWM+1.
type GapError struct {
	Origin string
	Stream entry.StreamID
	HWM    uint64
	Got    uint64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("replicate: gap in stream %s of %s: got index %d, high-water mark %d", e.Stream, e.Origin, e.Got, e.HWM)
}

// ConflictError refuses a batch whose entry at this node's high-water mark
// was committed at another HLC than the one applied here: two writes under
// one WAL identity (the sender's data directory was restored from a backup
// or copied). Nothing is applied; the sender must begin a new stream.
type ConflictError struct {
	Origin    string
	Stream    entry.StreamID
	HWM       uint64
	HWMCommit hlc.Timestamp
	Got       hlc.Timestamp
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("replicate: identity conflict in stream %s of %s: index %d was applied here committed at %s, the batch says %s",
		e.Stream, e.Origin, e.HWM, e.HWMCommit, e.Got)
}

// Inbound is an admitted batch and what the acceptor decided of it.
type Inbound struct {
	Sender string
	Batch  *Batch
	// Raw is the batch's body as it arrived, which the command carries
	// instead of encoding Batch again (nil: Batch is encoded).
	Raw []byte
	// Own are the indexes of a snapshot's entries relaying this cluster's
	// writes; Unknown those relaying writes of clusters this node does not
	// take writes from (dropped).
	Own, Unknown map[uint64]bool
	// Dead are entries set aside as dead letters, with why.
	Dead map[uint64]string
	// At is the time dead letters record (wall ns).
	At int64
	// HLC is the clock's reading after it observed the batch: the
	// persisted high-water mark rises to it.
	HLC hlc.Timestamp
	// MaxStreams bounds a sender's streams here; KnownMarks says, for each
	// of the batch's marks, whether its origin is a cluster this node takes
	// writes from (others are not raised).
	MaxStreams int
	KnownMarks []bool
	// ConflictValueMax is the largest discarded value a conflict record
	// keeps whole (0: the machine's default; set only from command format
	// 4, in what was the command's reserved field).
	ConflictValueMax int
	// Foreign, in a part of a batch (a receiver of several raft groups,
	// issue 51), are the runs of the batch's indexes whose entries other
	// groups of this cluster apply: in byte order, disjoint, and apart
	// from every entry of Batch. The group covers them (its mark of the
	// stream moves past them) without applying anything (nil: a whole
	// batch; only from command format FormatParts).
	Foreign []ForeignRun
}

// ForeignRun is a run of a batch's indexes From..To that another group
// applies; Commit is the commit of the entry at To.
type ForeignRun struct {
	From, To uint64
	Commit   hlc.Timestamp
}

// InboundResult is what applying a batch did.
type InboundResult struct {
	// Err is a refusal (a *GapError, a *ConflictError, ErrForbidden):
	// nothing of the batch was applied.
	Err error
	// Start and HWM are the sender's mark of the batch's stream before and
	// after; HWMCommit the commit at HWM.
	Start, HWM uint64
	HWMCommit  hlc.Timestamp
	// Resent: the batch was the resent last batch of a re-seed whose
	// trailer had already committed; nothing was applied.
	Resent bool
	// Counts of the batch's entries.
	Applied, Stale, Duplicates, DeadLettered, DroppedOwn, DroppedUnknown int
	// DroppedUnheard counts a snapshot's relays of a third cluster whose
	// filter toward this one was not heard (not taken: machine.unheardRelay).
	DroppedUnheard int
	// DroppedWithheld counts a snapshot's relays of a third cluster whose
	// filter toward this one, as the log records it when the entry
	// applies, keeps them home (machine.withheldRelay): the acceptor's
	// screen saw an earlier filter.
	DroppedWithheld int
	// Staged counts a snapshot's entries kept aside until its trailer
	// (machine.FormatStagedSnapshots); the trailer's batch counts them
	// again as Applied, Stale or Duplicates once it applies them.
	Staged int
	// Filtered counts the indexes filtered markers covered.
	Filtered uint64
	// Elsewhere counts the indexes a part's foreign runs covered (other
	// groups of this cluster apply their entries).
	Elsewhere uint64
	// Resurrections counts a re-seed's versions older than this tree's
	// collection horizon, of keys it held nothing of, not taken (they may
	// have been deleted here).
	Resurrections int
	// Conflicts counts the records the batch added to the conflict log,
	// Superseded those it removed (docs/DATAMODEL.md "Conflicts").
	Conflicts, Superseded int
	// RangeDiscards counts the batch's range deletes that deleted live
	// keys here (a range delete's discards are counted, not logged).
	RangeDiscards int
	// Requested, Rejoin: the trailer ended a requested re-seed, a rejoin.
	Requested, Rejoin bool
	// OriginFrontier is the highest commit of the sender's cluster applied
	// here over its streams other than this one (zero: none).
	OriginFrontier hlc.Timestamp
}

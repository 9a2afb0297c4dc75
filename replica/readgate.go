package replica

import (
	"fmt"
	"sync/atomic"

	"github.com/replicator/replicator/api"
)

// After a start, a node of several answers local reads only once it applied
// everything it may have acknowledged before it stopped (issue 24, docs/
// CLUSTER.md "Who answers"). Its applies reach Pebble without a sync (the
// raft log is the synced redo log), so a SIGKILL can take the tree back by
// a few hundred commands, and raft applies them again only once a leader
// tells it they are committed: until then its tree is older than writes it
// acknowledged, and a client that stays on it would read the past.
//
// Everything it acknowledged it had applied, so it was in its log: reads
// open once it applied the log's last index at start, or, when a leader
// cut that log's tail (entries never committed), once it applied a commit
// index of the current term's leader (which covers every command committed
// before the term: a stale commit index from a leader just elected does
// not). A node that is not a voter (a new incarnation: a wiped or restored
// directory, joining) acknowledged nothing as itself, but clients may have
// as it through its address: it answers once it caught up with a leader of
// the current term. A node alone applied its whole log before Open
// returned.

// readGate is the state of the gate.
type readGate struct {
	// open latches once reads were allowed.
	open atomic.Bool
	// startLast is the last command the raft log held at start (or what
	// its snapshot applied).
	startLast uint64
}

// readable reports whether local reads may be answered, or why not.
func (r *Replica) Readable() error {
	if p := r.removed.Load(); p != nil {
		return *p
	}
	if r.restoring.Load() {
		return fmt.Errorf("%w: installing the leader's snapshot of the tree (this node lagged behind the log)", api.ErrCatchingUp)
	}
	if r.reads.open.Load() || !r.multi() || r.group == nil {
		return nil
	}
	// progress counts commands only (raft's own entries never reach the
	// state machine), so the targets are commands too.
	applied := r.progress.get()
	if applied >= r.reads.startLast && r.group.IsVoter() {
		r.reads.open.Store(true)
		return nil
	}
	if c, ok := r.group.CommitOfTerm(); ok && applied >= r.group.LastCommandAtOrBelow(c) {
		r.reads.open.Store(true)
		return nil
	}
	return fmt.Errorf("%w: this node restarted and has applied its log up to %d of the %d it held (what it may have acknowledged before it stopped)",
		api.ErrCatchingUp, applied, r.reads.startLast)
}

package cluster

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/wal"
)

// fence asks the other members of the configuration, before raft's first
// election timeout, whether they keep this node out (removed, replaced, or
// lost in a recovery): such a node must not start, or two of them coming
// back could elect each other as a majority of an old configuration. A
// member that does not answer in time says nothing; a refusal later stops
// the node (OnRefused).
func (g *Group) fence() error {
	if g.layer == nil {
		return nil
	}
	cf := g.raft.GetConfiguration()
	if cf.Error() != nil {
		return nil
	}
	wait := min(g.opts.HeartbeatTimeout/2, time.Second)
	refusals := make(chan error, len(cf.Configuration().Servers))
	n := 0
	for _, s := range cf.Configuration().Servers {
		if s.ID == g.id {
			continue
		}
		n++
		go func() {
			// Exits after at most wait (the dial's and the answer's
			// timeout).
			who, err := g.layer.Identify(string(s.Address), wait)
			if !errors.Is(err, raftconn.ErrRefused) || !sameNode(s.ID, raft.ServerID(who.ID)) {
				err = nil // only the member (any incarnation of it), at its address, says so
			}
			refusals <- err
		}()
	}
	for ; n > 0; n-- {
		if err := <-refusals; err != nil {
			if strings.Contains(err.Error(), "empty data directory") {
				return fmt.Errorf("%w: %w", ErrRemoved, err) // the refusal says what to do
			}
			return fmt.Errorf("%w: %w: start the node with an empty data directory (it comes back as a new member)", ErrRemoved, err)
		}
	}
	return nil
}

// Halt stops this node's raft at once (a node that must not go on: it was
// refused by its cluster, or its log was about to lose applied entries).
// Safe from any goroutine, raft's own included; Close still closes.
func (g *Group) Halt() {
	go g.raft.Shutdown() // waits for raft's goroutines: not on one of them
}

// CommitOfTerm returns the commit index this node learned when the entry
// there belongs to the current term: its leader committed in its term, so
// the index covers every command committed before the term (a leader just
// elected may still send an older commit index, which does not).
func (g *Group) CommitOfTerm() (uint64, bool) {
	c := g.raft.CommitIndex()
	if c == 0 {
		return 0, false
	}
	if _, id := g.raft.LeaderWithID(); id == "" {
		return 0, false
	}
	var l raft.Log
	if err := g.log.GetLog(c, &l); err != nil {
		return 0, false
	}
	return c, l.Term == g.raft.CurrentTerm()
}

// IsVoter reports whether this node is a voter of the latest configuration
// it knows.
func (g *Group) IsVoter() bool {
	cf := g.raft.GetConfiguration()
	if cf.Error() != nil {
		return false
	}
	for _, s := range cf.Configuration().Servers {
		if s.ID == g.id {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

// LastCommandAtOrBelow is the last command the log holds at or below index
// i (0: none).
func (g *Group) LastCommandAtOrBelow(i uint64) uint64 { return lastCommand(g.log, i) }

// lastCommand scans back from index i to the log's first entry for a
// command (a state machine's, not one of raft's own entries).
func lastCommand(store *wal.Store, i uint64) uint64 {
	first, _ := store.FirstIndex()
	last, _ := store.LastIndex()
	for i = min(i, last); i >= first && i > 0; i-- {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			return 0
		}
		if l.Type == raft.LogCommand {
			return i
		}
	}
	return 0
}

// applied is the last log index this node's state machine applied.
func (g *Group) applied() uint64 {
	if g.opts.Applied != nil {
		return g.opts.Applied()
	}
	return g.raft.AppliedIndex()
}

// Package groups opens and runs the raft groups a node holds after group 0
// (issue 51, docs/CLUSTER.md "Several raft groups per cluster"): each
// group's store under the data directory's groups/g, its replica (state
// machine, raft log, committer and stream) over group 0's raft port, and
// its submitter; and it says which group a key's slot belongs to. Group 0
// is the node's own replica, as in a cluster of one group: what is the
// cluster's (membership, removals, peers and links) stays there.
//
// What is built: the groups of a cluster without peers. Their streams are
// cut as they are applied (no peer reads them); a cluster of several
// groups with peers waits for each group's links (docs/CLUSTER.md).
package groups

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
)

// MaxGroups bounds a cluster's groups (hashicorp/raft has no multi-raft of
// its own: every group is a raft instance with its goroutines and log).
const MaxGroups = 64

// Deps is what a Set needs of its node: values and functions, never the
// node.
type Deps struct {
	// Count is the cluster's number of groups, group 0 included (2 to
	// MaxGroups).
	Count int
	// Dir is the node's data directory: group g lives under Dir/groups/g.
	Dir string
	// Replica is group 0's replica's deps: each group takes a copy, with
	// its own store, directory and place among the groups.
	Replica replica.Deps
	// Store are the options of each group's store.
	Store store.Options
	// Port is group 0's raft port (nil: a node alone, whose groups are
	// each a group of one); Removed is group 0's record of the servers the
	// cluster keeps out; MemberApplied(g) is how a group's leader learns a
	// learner's applied index in group g; FormWith(g) the servers to form
	// group g with (cluster.Options.FormWith).
	Port          func() *raftconn.Layer
	Removed       func(id raft.ServerID) string
	MemberApplied func(g int) func(id raft.ServerID, addr string) (uint64, error)
	FormWith      func(g int) func() []raft.Server
	// Bounds are what a write may be; Admit is the node's admission of a
	// write (open, in its cluster, not saturated), besides the group's own
	// term.
	Bounds *replica.Bounds
	Admit  func(ctx context.Context) error
	// Collect collects a group's tombstones, expired idempotency and
	// conflict records at its leader (links.Set.CollectIn, below the
	// cluster's cutoff), every CollectEvery (0: never on a timer).
	Collect      func(g *Group) (int, error)
	CollectEvery time.Duration
	Logger       *slog.Logger
}

// Group is one raft group after 0 at this node.
type Group struct {
	Number int
	Store  *store.Store
	Rep    *replica.Replica
	Sub    *replica.Submitter
}

// Set is the groups after 0 a node holds.
type Set struct {
	d     Deps
	slots *slot.Map
	gs    []*Group // gs[g-1] is group g
	stop  chan struct{}
	loop  sync.WaitGroup
	// closed makes Close's work happen once.
	closed sync.Once
	err    error
}

// Dir is where group g of a node whose data directory is dir lives.
func Dir(dir string, g int) string { return filepath.Join(dir, "groups", strconv.Itoa(g)) }

// Open opens each group after 0: its store, and its replica, which starts
// the group's raft over group 0's port. On an error it closes what it
// opened.
func Open(d Deps) (*Set, error) {
	if d.Count < 2 || d.Count > MaxGroups {
		return nil, fmt.Errorf("groups: %d groups (2 to %d)", d.Count, MaxGroups)
	}
	slots, err := slot.Initial(d.Count)
	if err != nil {
		return nil, err
	}
	s := &Set{d: d, slots: slots, stop: make(chan struct{})}
	for g := 1; g < d.Count; g++ {
		grp, err := s.open(g)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("groups: group %d: %w", g, err)
		}
		s.gs = append(s.gs, grp)
	}
	return s, nil
}

func (s *Set) open(g int) (*Group, error) {
	dir := Dir(s.d.Dir, g)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	so := s.d.Store
	st, err := store.Open(filepath.Join(dir, "store"), &so)
	if err != nil {
		return nil, err
	}
	rd := s.d.Replica
	rd.Store, rd.Dir = st, dir
	rd.Logger = s.d.Logger.With("group", g)
	// The group's stream has no reader yet: no identity to check with
	// peers, no links in its terms, no stream to seal at them.
	rd.Identity = func(bool) error { return nil }
	rd.BeginTerm = func() (replica.Term, error) { return quietTerm{}, nil }
	rd.Seal = func(entry.StreamID, string) error { return nil }
	if rd.Raft != nil {
		rf := *rd.Raft
		rf.Number, rf.Port, rf.Removed, rf.MemberApplied, rf.FormWith = g, s.d.Port(), s.d.Removed, s.d.MemberApplied(g), s.d.FormWith(g)
		rd.Raft = &rf
	}
	rep := replica.New(rd)
	if _, err := rep.Open(); err != nil {
		rep.Committer().Close()
		st.Close()
		return nil, err
	}
	sub := &replica.Submitter{Bounds: s.d.Bounds, Com: rep.Committer(), Format: func() int { return rep.Machine().Format() },
		Admit: func(ctx context.Context) error {
			if err := s.d.Admit(ctx); err != nil {
				return err
			}
			return rep.AwaitTerm(ctx)
		}}
	return &Group{Number: g, Store: st, Rep: rep, Sub: sub}, nil
}

// quietTerm is the term of a group whose stream no link reads.
type quietTerm struct{}

func (quietTerm) Run()   {}
func (quietTerm) Abort() {}
func (quietTerm) End()   {}

// Count is the cluster's number of groups, group 0 included.
func (s *Set) Count() int { return s.d.Count }

// Of is the group of key's slot.
func (s *Set) Of(key string) int { return s.slots.Group(key) }

// Group is group g (1 to Count-1).
func (s *Set) Group(g int) *Group { return s.gs[g-1] }

// All are the groups after 0, in order.
func (s *Set) All() []*Group { return s.gs }

// Run starts each group's lead loop, and the loop that cuts the groups'
// streams (it exits at Close).
func (s *Set) Run() {
	for _, g := range s.gs {
		g.Rep.Run()
	}
	s.loop.Add(1)
	go s.upkeep()
}

// Collect collects in every group after 0 this node leads (Deps.Collect),
// and reports how many tombstones went.
func (s *Set) Collect() (int, error) {
	total := 0
	var errs []error
	for _, g := range s.gs {
		if !g.Rep.Ready() || s.d.Collect == nil {
			continue
		}
		n, err := s.d.Collect(g)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("groups: collecting in group %d: %w", g.Number, err))
		}
	}
	return total, errors.Join(errs...)
}

// upkeep drops, at the leader of each group, the stream's entries the
// state machine applied (no peer reads them: a cluster of several groups
// has no links yet), and collects every CollectEvery. It exits at Close.
func (s *Set) upkeep() {
	defer s.loop.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var sinceCollect time.Duration
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if sinceCollect += time.Second; s.d.CollectEvery > 0 && sinceCollect >= s.d.CollectEvery {
			sinceCollect = 0
			if _, err := s.Collect(); err != nil {
				s.d.Logger.Warn("collecting in the groups", "err", err)
			}
		}
		for _, g := range s.gs {
			if !g.Rep.Ready() {
				continue
			}
			out := g.Rep.Stream()
			upTo := min(g.Rep.StreamApplied(), out.Last())
			if upTo < out.First() || out.Stream().IsZero() {
				continue
			}
			if err := g.Rep.ApplyCommand(&machine.Command{Truncate: &machine.TruncateCmd{Stream: out.Stream(), First: upTo + 1}}); err != nil {
				s.d.Logger.Debug("cutting a group's stream", "group", g.Number, "err", err)
			}
		}
	}
}

// Close stops every group: its lead loop, its committer, its raft (before
// group 0's, which holds the port) and its store.
func (s *Set) Close() error {
	s.closed.Do(func() { s.err = s.close() })
	return s.err
}

func (s *Set) close() error {
	close(s.stop)
	s.loop.Wait()
	var errs []error
	for i := len(s.gs) - 1; i >= 0; i-- {
		g := s.gs[i]
		g.Rep.Stop()
		g.Rep.Committer().Close()
		var err error
		g.Rep.Committer().Exclusive(func() {
			if grp := g.Rep.Group(); grp != nil {
				err = grp.Close()
			}
		})
		errs = append(errs, err, g.Store.Close())
	}
	return errors.Join(errs...)
}

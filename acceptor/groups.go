package acceptor

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/wire"
)

// Groups is a receiver of several raft groups (issue 51, docs/CLUSTER.md
// "A stream per group, and the peers' streams") as the acceptor's Store
// and Log. A peer's batch carries keys of every group: it is split by the
// key's group (wire.SplitInbound), each part proposed to its group's log
// at once, and it is applied when every part is: a part that committed
// before a failure collapses when the batch comes again, by its group's
// mark. A sender's mark of a stream here is the least of the groups'
// marks (each group's coverage of the stream): what the acknowledgment
// says, and where a sender resends from.
//
// What a peer's heartbeat records (its filters, its open streams, its
// re-seed flags) goes to every group's log, group 0's first: each group's
// state machine decides by what its own log holds. A snapshot batch (a
// re-seed, a backfill) is split as any: its header is in every part, so
// each group stages, reveals and ends it for its keys.
type Groups struct {
	// GroupOf names the group of a key (this cluster's slot map).
	GroupOf func(key string) int
	// Stores and Logs are the groups', in group order.
	Stores []Store
	Logs   []Log
	// TakesParts says whether every node of every group reads a part of a
	// batch (command format 14, machine.FormatParts); a batch is refused,
	// not written, until then.
	TakesParts func() bool
}

// Validate reports what makes g unusable.
func (g *Groups) Validate() error {
	var errs []error
	if g.GroupOf == nil {
		errs = append(errs, errors.New("acceptor: groups: no GroupOf"))
	}
	if g.TakesParts == nil {
		errs = append(errs, errors.New("acceptor: groups: no TakesParts"))
	}
	if len(g.Stores) == 0 || len(g.Stores) != len(g.Logs) {
		errs = append(errs, fmt.Errorf("acceptor: groups: %d stores and %d logs", len(g.Stores), len(g.Logs)))
	}
	return errors.Join(errs...)
}

// HWM is the least of the groups' marks of the stream (its commit, and
// the entries set aside in every group).
func (g *Groups) HWM(origin string, stream [16]byte) (entry.HWM, error) {
	var least entry.HWM
	dead := uint64(0)
	for i, st := range g.Stores {
		h, err := st.HWM(origin, stream)
		if err != nil {
			return entry.HWM{}, fmt.Errorf("group %d: %w", i, err)
		}
		dead += h.DeadLettered
		if i == 0 || h.Index < least.Index {
			least = h
		}
	}
	least.DeadLettered = dead
	return least, nil
}

// HWMsOfExcept are origin's streams but except, each at its least mark.
func (g *Groups) HWMsOfExcept(origin string, except [16]byte) ([]entry.HWM, error) {
	seen := map[[16]byte]bool{}
	for i, st := range g.Stores {
		hs, err := st.HWMsOfExcept(origin, except)
		if err != nil {
			return nil, fmt.Errorf("group %d: %w", i, err)
		}
		for _, h := range hs {
			seen[h.Stream] = true
		}
	}
	out := make([]entry.HWM, 0, len(seen))
	for s := range seen {
		h, err := g.HWM(origin, s)
		if err != nil {
			return nil, err
		}
		if h.Index > 0 {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b entry.HWM) int { return entry.StreamID(a.Stream).Compare(b.Stream) })
	return out, nil
}

// BegunReseed is group 0's: every group holds the re-seed's beginning (its
// header is in every part).
func (g *Groups) BegunReseed(sender string) (entry.StreamID, bool, error) {
	return g.Stores[0].BegunReseed(sender)
}

// DeadIndexes are the indexes set aside in any group, in order.
func (g *Groups) DeadIndexes(origin string, stream [16]byte, from, to uint64, max int) ([]uint64, error) {
	var all []uint64
	for i, st := range g.Stores {
		d, err := st.DeadIndexes(origin, stream, from, to, max)
		if err != nil {
			return nil, fmt.Errorf("group %d: %w", i, err)
		}
		all = append(all, d...)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	if len(all) > max {
		all = all[:max]
	}
	return all, nil
}

// ApplyInbound splits the batch and applies every part in its group, all
// at once, and returns when every part did. A failure of any part's log
// (an unknown outcome) fails the whole; a refusal of any part (a gap, a
// conflict) refuses it, though other groups may have applied theirs: the
// batch comes again and collapses there.
func (g *Groups) ApplyInbound(in *wire.Inbound, raw []byte) (*wire.InboundResult, error) {
	if len(g.Logs) == 1 {
		return g.Logs[0].ApplyInbound(in, raw)
	}
	if !g.TakesParts() {
		return nil, errors.New("acceptor: groups: a node of this cluster does not read the parts of a batch yet (command format 14): nothing was applied")
	}
	parts, err := wire.SplitInbound(in, len(g.Logs), g.GroupOf)
	if err != nil {
		return &wire.InboundResult{Err: err}, nil
	}
	results := make([]*wire.InboundResult, len(parts))
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		// Exits when its group's log answered (each log bounds its own
		// wait: a proposal times out).
		go func() {
			defer wg.Done()
			results[i], errs[i] = g.Logs[i].ApplyInbound(p, nil)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("group %d: %w", i, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return combine(results), nil
}

// combine is what the parts' results say of the whole batch: the least
// mark, the counts summed (an entry every group holds, a range delete,
// counts once per group), the first refusal.
func combine(rs []*wire.InboundResult) *wire.InboundResult {
	least := slices.MinFunc(rs, func(a, b *wire.InboundResult) int { return cmp.Compare(a.HWM, b.HWM) })
	out := &wire.InboundResult{HWM: least.HWM, HWMCommit: least.HWMCommit, Start: rs[0].Start, Resent: true}
	for _, r := range rs {
		if out.Err == nil {
			out.Err = r.Err
		}
		out.Start = min(out.Start, r.Start)
		out.Resent = out.Resent && r.Resent
		out.Applied += r.Applied
		out.Stale += r.Stale
		out.Duplicates += r.Duplicates
		out.DeadLettered += r.DeadLettered
		out.DroppedOwn += r.DroppedOwn
		out.DroppedUnknown += r.DroppedUnknown
		out.DroppedUnheard += r.DroppedUnheard
		out.DroppedWithheld += r.DroppedWithheld
		out.Staged += r.Staged
		out.Filtered = max(out.Filtered, r.Filtered)
		out.Resurrections += r.Resurrections
		out.Conflicts += r.Conflicts
		out.Superseded += r.Superseded
		out.RangeDiscards += r.RangeDiscards
		out.Requested = out.Requested || r.Requested
		out.Rejoin = out.Rejoin || r.Rejoin
		if out.OriginFrontier.Less(r.OriginFrontier) {
			out.OriginFrontier = r.OriginFrontier
		}
	}
	return out
}

// UpdateReseed changes the peer's re-seed record in every group, group 0
// last, and returns what group 0's held.
func (g *Groups) UpdateReseed(peer string, f func(byte) byte) (byte, error) {
	var first byte
	err := g.lastToFirst(func(i int, l Log) error {
		had, err := l.UpdateReseed(peer, f)
		if i == 0 {
			first = had
		}
		return err
	})
	return first, err
}

// SetFromPeer records the peer's filters in every group, group 0 last.
func (g *Groups) SetFromPeer(peer string, f entry.Filter, onward []entry.TargetSpans) error {
	return g.lastToFirst(func(_ int, l Log) error { return l.SetFromPeer(peer, f, onward) })
}

// SetOpenStreams records the peer's open streams in every group, group 0
// last.
func (g *Groups) SetOpenStreams(peer string, open []entry.StreamID) error {
	return g.lastToFirst(func(_ int, l Log) error { return l.SetOpenStreams(peer, open) })
}

// lastToFirst records a heartbeat's fact in every group, group 0 last:
// group 0's record is what the acceptor reads back (Options.OpenOf,
// FromPeer), so a failure in any group leaves it as it was, and the next
// heartbeat records the fact again in every group.
func (g *Groups) lastToFirst(f func(i int, l Log) error) error {
	for i := len(g.Logs) - 1; i >= 0; i-- {
		if err := f(i, g.Logs[i]); err != nil {
			return fmt.Errorf("group %d: %w", i, err)
		}
	}
	return nil
}

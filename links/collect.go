package links

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/wire"
)

// What the links hold back of the stream and of the tree: the entries a
// peer has not acknowledged (Truncate), and the tombstones a peer may still
// need (TombstoneCutoff, KeepRanges).

// idleBound is a bound every entry appended from now on is committed
// above, and the stream's last index, read in that order: the clock, then
// the floor of a group being stamped, then the end of the stream
// (transport.Options.IdleBound, as TombstoneCutoff reads them).
func (s *Set) idleBound() (hlc.Timestamp, uint64) {
	bound := s.d.Clock.Now() // every commit after it is above it
	if f := s.d.Floor(); f != nil && f.Less(bound) {
		bound = *f
	}
	return bound, s.d.Stream().Last()
}

// openStreams are this cluster's open streams, as heartbeats tell them
// (transport.Options.OpenStreams): a cluster of one raft group has one.
func (s *Set) openStreams() []entry.StreamID {
	return []entry.StreamID{s.d.Stream().Stream()}
}

// NoteIdle records the idle frontier of a peer's stream
// (acceptor.Options.OnIdle).
func (s *Set) NoteIdle(peer string, stream entry.StreamID, bound hlc.Timestamp) {
	s.idleMu.Lock()
	defer s.idleMu.Unlock()
	if s.idle == nil {
		s.idle = map[string]map[entry.StreamID]hlc.Timestamp{}
	}
	if s.idle[peer] == nil {
		s.idle[peer] = map[entry.StreamID]hlc.Timestamp{}
	}
	if s.idle[peer][stream].Less(bound) {
		s.idle[peer][stream] = bound
	}
}

// SetKept records what the last collection kept for each link.
func (s *Set) SetKept(kept map[string]machine.KeptCount) {
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	s.kept = kept
}

// Kept is what the last collection kept for the link to peer (nil:
// nothing).
func (s *Set) Kept(peer string) *api.KeptTombstones {
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	k, ok := s.kept[peer]
	if !ok {
		return nil
	}
	return &api.KeptTombstones{Tombstones: k.Tombstones, Ranges: k.Ranges, Bytes: k.Bytes}
}

// KeptForPeerLinks is what the last collection kept of peer's deletes for
// the peer's other links (nil: nothing).
func (s *Set) KeptForPeerLinks(peer string) *api.KeptTombstones {
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	var sum *api.KeptTombstones
	for name, k := range s.kept {
		if strings.HasPrefix(name, peer+"->") {
			if sum == nil {
				sum = &api.KeptTombstones{}
			}
			sum.Tombstones += k.Tombstones
			sum.Ranges += k.Ranges
			sum.Bytes += k.Bytes
		}
	}
	return sum
}

// KeepRanges are, per link, the ranges whose tombstones a collection keeps
// (entry.LinkSettings.KeepSpans), in the order a collect command carries
// them (nil before format 7: the log cannot carry them yet).
func (s *Set) KeepRanges() []machine.KeepRanges {
	if s.d.Format() < machine.FormatKeptTombstones {
		return nil
	}
	// The peers this node links to (configured, or found by gossip): a
	// link the log still records for a peer removed since keeps nothing
	// (its narrowing could never be released or widened).
	peers := map[string]bool{}
	for _, p := range s.d.Peers {
		peers[p.Name] = true
	}
	for _, p := range s.Peers() {
		peers[p.Name] = true
	}
	var out []machine.KeepRanges
	for _, name := range slices.Sorted(maps.Keys(peers)) {
		ls := s.d.Settings.Of(name)
		if spans := ls.KeepSpans(); len(spans) > 0 {
			out = append(out, machine.KeepRanges{Peer: name, Spans: spans})
		}
		// The ranges the peer keeps for its own other links, as its
		// heartbeats said: its deletes there stay here too, so that one it
		// loses with its data comes back to it by its rejoin (and reaches
		// the other link when that widens).
		for _, on := range ls.Onward {
			if on.Target != s.d.Local && len(on.Spans) > 0 {
				out = append(out, machine.KeepRanges{Peer: on.Target, Origin: name, Spans: on.Spans})
			}
		}
	}
	slices.SortFunc(out, func(a, b machine.KeepRanges) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Origin, b.Origin))
	})
	return out
}

// keepsBesides are the ranges this cluster keeps for its links other than
// to peer (transport.Options.Keeps): the peer keeps this cluster's deletes
// there too.
func (s *Set) keepsBesides(peer string) []wire.TargetSpans {
	var out []wire.TargetSpans
	for _, k := range s.KeepRanges() {
		if k.Origin == "" && k.Peer != peer {
			out = append(out, wire.TargetSpans{Target: k.Peer, Spans: k.Spans})
		}
	}
	return out
}

// Truncate drops the stream's outbound entries every peer acknowledged,
// through the cluster's log (every node drops the same). Only the leader's
// links know what the peers hold: elsewhere it does nothing.
func (s *Set) Truncate() error {
	if !s.d.Leading() || s.d.Halted() {
		return nil
	}
	// The command names the stream read here: if a new stream began
	// meanwhile, it cuts nothing.
	out := s.d.Stream()
	stream := out.Stream()
	upTo := min(s.d.Applied(), out.Last())
	for _, sh := range s.All() {
		if sh.Retains() {
			upTo = min(upTo, sh.Acked())
		}
	}
	if upTo < out.First() || stream.IsZero() {
		return nil
	}
	return s.d.Apply(&machine.Command{Truncate: &machine.TruncateCmd{Stream: stream, First: upTo + 1}})
}

// TombstoneCutoff is the stamp below which tombstones may go and, when
// nothing may be collected (a zero cutoff), why: the node logs it (DEBUG)
// and /admin/wal shows it. A tombstone is collected only when no write
// older than it can still arrive here, and every peer has the delete (or a
// re-seed will carry it):
//
//   - it is older than the retention window;
//   - inbound: for every peer cluster this node takes writes from, linked or
//     not, it lies more than the pin window below that cluster's applied
//     commit frontier here (a stamp lies within the pin window of its
//     commit, and commits grow within a stream);
//   - outbound: every link has every entry of this stream committed up to
//     the stamp plus the pin window, and none is detached, in or owed a
//     re-seed (the snapshot must still carry the tombstone);
//   - no dead letter holds a write it could shadow, no rejoin is under way
//     (this node's, or a peer's that will re-seed this node), and no
//     re-seed or backfill from a peer is open here (store.OpenSnapshot).
func (s *Set) TombstoneCutoff() (hlc.Timestamp, string, error) {
	d := s.d
	cutoff := hlc.Timestamp{Wall: d.Clock.Physical() - int64(d.TombstoneRetention)}
	lower := func(ts hlc.Timestamp) {
		if ts.Less(cutoff) {
			cutoff = ts
		}
	}
	if rj, err := d.Store.Rejoin(); err != nil || len(rj) > 0 {
		return hlc.Timestamp{}, "a rejoin is under way", err
	}
	if rr, err := d.Store.ReseedRequests(); err != nil || len(rr) > 0 {
		return hlc.Timestamp{}, fmt.Sprintf("a peer awaits a re-seed from this cluster (%d requests)", len(rr)), err
	}
	if open, err := s.openSnapshotsOfPeers(); err != nil || open {
		// A re-seed or backfill coming in relays old versions, which a
		// tombstone collected meanwhile could no longer shadow.
		return hlc.Timestamp{}, "a re-seed or backfill from a peer is open here", err
	}
	// Outbound first: read the clock, then the floor of a group being
	// stamped, then the WAL's end, so that an entry appended after the end
	// was read is either above the clock reading or below the floor.
	clockNow := d.Clock.Last()
	floorp := d.Floor()
	last := d.Stream().Last()
	for _, sh := range s.All() {
		dl := sh.Delivery()
		switch {
		case !dl.Complete:
			return hlc.Timestamp{}, "the link to " + sh.Peer().Name + " is detached, owed or running a re-seed", nil
		case dl.Acked >= last:
			bound := clockNow
			if floorp != nil && floorp.Less(bound) {
				bound = *floorp
			}
			lower(bound.Add(-d.PinWindow))
		case dl.AckedCommit.IsZero():
			// not known since the cursor moved
			return hlc.Timestamp{}, "how far " + sh.Peer().Name + " has this stream is not known since its cursor moved", nil
		default:
			lower(dl.AckedCommit.Add(-d.PinWindow))
		}
	}
	// Inbound: every peer cluster this node takes writes from, or links to.
	peers := map[string]bool{}
	for _, p := range d.Accepted() {
		peers[p] = true
	}
	for _, sh := range s.All() {
		peers[sh.Peer().Name] = true
	}
	frontiers, err := s.peerFrontiers()
	if err != nil {
		return hlc.Timestamp{}, "", err
	}
	for _, p := range slices.Sorted(maps.Keys(peers)) {
		f, ok := frontiers[p]
		if !ok {
			// Nothing known from this peer yet: it may hold any old write.
			return hlc.Timestamp{}, "nothing applied from " + p + " yet", nil
		}
		if f.why != "" {
			return hlc.Timestamp{}, f.why, nil
		}
		lower(f.at.Add(-d.PinWindow))
	}
	dls, err := d.Store.DeadLetters()
	if err != nil {
		return hlc.Timestamp{}, "", err
	}
	codec := wire.NewCodec()
	for _, dl := range dls {
		if e, err := codec.DecodeEntry(dl.Entry, wire.Defaults{}); err == nil {
			lower(e.LWW().HLC)
		}
	}
	return cutoff, "", nil
}

// frontier is how far a peer cluster's writes have come here: at, or why
// it is not known.
type frontier struct {
	at  hlc.Timestamp
	why string
}

// peerFrontiers are the peers' inbound frontiers here: for each, a stamp
// no write still to come from it is committed below.
//
// A peer that told its open streams (entry.LinkSettings.Open: from a
// build of issue 51 on) is as far as the least advanced of them: with
// several raft groups it runs a stream per group, and one group's stream
// may lag past the retention while the others run ahead, still to bring
// old writes. A stream's frontier is its applied commit frontier here, or
// its idle frontier (its sender had nothing more to send) when that is
// further; a stream of which neither is known holds collection back. Its
// sealed streams, not open any more, are left out: a stream a restore or a
// lost majority replaced never advances again.
//
// A peer that never told them (an older build) has one stream at a time,
// so its frontier is the furthest of its streams here, as before. A
// re-seed's one-off snapshot stream records no frontier.
func (s *Set) peerFrontiers() (map[string]frontier, error) {
	hwms, err := s.d.Store.HWMs()
	if err != nil {
		return nil, err
	}
	commits := map[string]map[entry.StreamID]hlc.Timestamp{}
	for _, h := range hwms {
		if commits[h.Origin] == nil {
			commits[h.Origin] = map[entry.StreamID]hlc.Timestamp{}
		}
		commits[h.Origin][entry.StreamID(h.Stream)] = h.Commit
	}
	s.idleMu.Lock()
	for p, streams := range s.idle {
		for st, b := range streams {
			if commits[p] == nil {
				commits[p] = map[entry.StreamID]hlc.Timestamp{}
			}
			if commits[p][st].Less(b) {
				commits[p][st] = b
			}
		}
	}
	s.idleMu.Unlock()
	out := map[string]frontier{}
	for p, streams := range commits {
		var f frontier
		if open := s.d.LinkOf(p).Open; len(open) > 0 {
			for i, st := range open {
				c := streams[st]
				if c.IsZero() {
					f = frontier{why: fmt.Sprintf("nothing applied from %s's open stream %s yet", p, st)}
					break
				}
				if i == 0 || c.Less(f.at) {
					f.at = c
				}
			}
		} else {
			for _, c := range streams {
				if f.at.Less(c) {
					f.at = c
				}
			}
		}
		out[p] = f
	}
	for p := range out {
		if out[p].why == "" && out[p].at.IsZero() {
			out[p] = frontier{why: "nothing applied from " + p + " yet"}
		}
	}
	return out, nil
}

// openSnapshotsOfPeers says whether a re-seed or backfill is open here from
// a peer this node still takes writes from. One from a peer removed from the
// configuration never ends and can relay nothing more, so it holds nothing
// back, as re-seed requests of such peers are forgotten at start
// (rejoin.PruneReseedState); with insecure peers any may come back.
func (s *Set) openSnapshotsOfPeers() (bool, error) {
	open, err := s.d.Store.OpenSnapshots()
	if err != nil || len(open) == 0 {
		return false, err
	}
	if s.d.Insecure {
		return true, nil
	}
	for _, p := range s.d.Accepted() {
		for _, o := range open {
			if o.Sender == p {
				return true, nil
			}
		}
	}
	return false, nil
}

// OldestCommitWall reads the commit HLC's wall time of a stream entry, for
// the age of a link's oldest unacknowledged entry.
func (s *Set) OldestCommitWall(index uint64) (int64, bool) {
	out := s.d.Stream()
	p, err := out.ReadRaw(index)
	if err != nil {
		return 0, false
	}
	e, err := wire.NewCodec().DecodeEntry(p, wire.Defaults{Origin: s.d.Local, Stream: out.Stream()})
	if err != nil {
		return 0, false
	}
	return e.Commit.Wall, true
}

// collectBatch bounds what one collect command drops of each kind.
const collectBatch = 10000

// CollectTombstones removes, through the cluster's log, the tombstones no
// write can resurrect any more (TombstoneCutoff), and the idempotency and
// conflict records expired, and reports how many tombstones went.
func (s *Set) CollectTombstones() (int, error) {
	return s.collect(s.d.Commit, s.d.Format, true)
}

// CollectIn collects, below the same cutoff, in another raft group of the
// cluster (issue 51: a group after 0 at its leader), through commit, its
// log at format: its tombstones, expired idempotency records and conflict
// records. What it kept is not reported (the links' figures are group 0's).
func (s *Set) CollectIn(commit func(*machine.Command) (*machine.Result, error), format func() int) (int, error) {
	return s.collect(commit, format, false)
}

func (s *Set) collect(commit func(*machine.Command) (*machine.Result, error), format func() int, report bool) (int, error) {
	d := s.d
	cutoff, why, err := s.TombstoneCutoff()
	if err != nil {
		return 0, err
	}
	if why != "" {
		d.Logger.Debug("tombstones are not collected now", "why", why)
	}
	total := 0
	keep := s.KeepRanges()
	for {
		cc := &machine.CollectCmd{Cutoff: cutoff, IdemBefore: d.Clock.Physical(), Max: collectBatch, Keep: keep}
		if format() >= machine.FormatConflicts {
			if before := d.Clock.Physical() - int64(d.ConflictRetention); before > 0 {
				cc.ConflictsBefore = hlc.Timestamp{Wall: before}
			}
			cc.ConflictsMaxBytes = d.ConflictMaxBytes
		}
		res, err := commit(&machine.Command{Collect: cc})
		if err != nil {
			return total, err
		}
		total += res.Collected
		if !cutoff.IsZero() && report {
			// What this collection kept (none ran below a zero cutoff:
			// the last figures stand).
			s.SetKept(res.Kept)
		}
		if res.Collected < collectBatch && res.CollectedIdem < collectBatch && res.CollectedConflicts < collectBatch {
			return total, nil
		}
	}
}

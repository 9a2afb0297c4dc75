package machine

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Inbound batches: a peer's batch is applied here, in the cluster's log, so
// that every node holds the same high-water marks and the dedup of one WAL
// identity is decided once for the cluster. The acceptor admits a batch
// first (authentication, shape, limits, the clock's offset: what depends on
// this node's configuration and clock) and hands over what it decided; the
// machine decides what depends on the tree: the sender's high-water mark,
// gaps and conflicts, the merge, dead letters, a re-seed's trailer.

// FormatRejoinHorizon is the format from which a rejoin's re-seed is judged
// against the collection horizon (applyInbound): every node of a cluster
// must take or leave the same versions, so the rule waits for the log to say
// every node applies it.
const FormatRejoinHorizon = 6

// skipRun is what a run of the stream's indexes from..to, none of which
// this group applies (a filtered marker's, or a part's foreign run),
// does to the mark: how far it moves it (0: the mark passed the run, a
// duplicate), or the refusal. The mark at the run's end must hold the
// run's commit (else the sender's stream was replaced: a conflict); a run
// beginning past the mark is a gap.
func skipRun(hwm *entry.HWM, from, to uint64, commit hlc.Timestamp, sender string, stream entry.StreamID) (uint64, error) {
	switch {
	case to == hwm.Index && !hwm.Commit.IsZero() && commit != hwm.Commit:
		return 0, &ConflictError{Origin: sender, Stream: stream, HWM: hwm.Index, HWMCommit: hwm.Commit, Got: commit}
	case to <= hwm.Index:
		return 0, nil
	case from > hwm.Index+1:
		return 0, &GapError{Origin: sender, Stream: stream, HWM: hwm.Index, Got: from}
	}
	return to - hwm.Index, nil
}

// coverForeign moves the mark past a part's foreign runs that begin before
// the index before (issue 51): other groups of this cluster apply their
// entries, this one only covers them, as a filtered marker's run, without
// the kept-home records of a sender's filter. A snapshot stream records no
// commit (as for its entries). It returns the runs left, or the refusal.
func coverForeign(hwm *entry.HWM, runs []wire.ForeignRun, before uint64, sender string, bt *wire.Batch, res *InboundResult) ([]wire.ForeignRun, error) {
	for len(runs) > 0 && runs[0].From < before {
		r := runs[0]
		n, err := skipRun(hwm, r.From, r.To, r.Commit, sender, bt.Stream)
		if err != nil {
			return runs, err
		}
		if n > 0 {
			res.Elsewhere += n
			hwm.Index = r.To
			if !bt.Snapshot {
				hwm.Commit = r.Commit
			}
		}
		runs = runs[1:]
	}
	return runs, nil
}

// lastOf is the last index a batch's entries and foreign runs reach.
func lastOf(ents []entry.Entry, runs []wire.ForeignRun) uint64 {
	last := uint64(0)
	if len(ents) > 0 {
		last = ents[len(ents)-1].Last()
	}
	if len(runs) > 0 {
		last = max(last, runs[len(runs)-1].To)
	}
	return last
}

// applyInbound applies an admitted batch in b.
func (m *Machine) applyInbound(b *store.Batch, in *Inbound) (*InboundResult, error) {
	bt, sender := in.Batch, in.Sender
	res := &InboundResult{}
	hwm, err := b.HWM(sender, bt.Stream)
	if err != nil {
		return nil, err
	}
	res.Start, res.HWM, res.HWMCommit = hwm.Index, hwm.Index, hwm.Commit
	refuse := func(err error) (*InboundResult, error) {
		res.Err = err
		return res, nil
	}
	if bt.Snapshot && !hwm.Commit.IsZero() {
		// Snapshot streams record no commit: this is one of the sender's
		// real streams, which a snapshot must not write into.
		return refuse(fmt.Errorf("%w: a snapshot batch in stream %s, one of %s's own streams", ErrForbidden, bt.Stream, sender))
	}
	if hwm.Index == 0 {
		if all, err := b.HWMsOf(sender); err != nil {
			return nil, err
		} else if len(all) >= in.MaxStreams {
			return refuse(fmt.Errorf("%w: %s already has %d streams here (the bound): a new one is refused", ErrForbidden, sender, len(all)))
		}
	}
	ents := bt.Entries
	// first is the batch's first index, or 0 when it holds none: a part of
	// a batch (a receiver of several groups) may hold foreign runs only.
	first := uint64(0)
	if len(ents) > 0 {
		first = ents[0].Index
	}
	if len(in.Foreign) > 0 && (first == 0 || in.Foreign[0].From < first) {
		first = in.Foreign[0].From
	}
	if bt.End != nil && hwm.Index == 0 && first > 1 {
		// The last batch of a re-seed whose trailer already committed here
		// (its answer was lost, the sender resent it): the snapshot stream
		// is forgotten, the real stream is at the trailer or beyond.
		real, err := b.HWM(sender, bt.End.Stream)
		if err != nil {
			return nil, err
		}
		if real.Index >= bt.End.Index {
			res.Resent, res.Duplicates, res.HWM = true, len(ents), lastOf(ents, in.Foreign)
			return res, nil
		}
	}
	var phase byte
	if in.Own != nil {
		if phase, err = b.RejoinPhase(sender); err != nil {
			return nil, err
		}
	}
	if bt.Backfill && hwm.Index == 0 && first > 0 {
		// A new backfill: what an earlier one that never ended carried
		// is no longer its business.
		if err := b.ClearBackfilled(sender); err != nil {
			return nil, err
		}
	}
	if bt.Snapshot && hwm.Index == 0 && (first > 0 || bt.Begin != nil) {
		// A snapshot stream opens: no tombstone is collected here until
		// it ends (store.OpenSnapshot says why).
		if err := m.openSnapshot(b, in); err != nil {
			return nil, err
		}
	}
	// A rejoin's re-seed (rj) comes from a node that lost data and was
	// restored or wiped: its versions older than this tree's collection
	// horizon, of keys this tree holds nothing of, may be deletes collected
	// here (a backup older than the tombstone retention brings them back),
	// and are not taken (docs/ANTIENTROPY.md "Possible resurrections").
	// Only a rejoin's: an ordinary re-seed or a backfill may carry old
	// versions this tree never had (a peer added with data of its own, keys
	// a filter held back), and the horizon says nothing of those. A rejoin's
	// legitimate versions are newer: what the node's lost stream wrote that
	// only some peers had is above this tree's inbound frontier for it, which
	// bounds the horizon, and nothing is collected while a rejoin is open.
	var horizon hlc.Timestamp
	if bt.Snapshot && bt.Rejoin && !bt.Backfill && m.format.Load() >= FormatRejoinHorizon {
		if horizon, err = m.st.CollectedBelow(); err != nil {
			return nil, err
		}
	}
	if m.format.Load() >= FormatConflicts && !bt.Snapshot && !bt.Backfill {
		collected, err := m.st.CollectedBelow()
		if err != nil {
			return nil, err
		}
		j := &conflictJudge{b: b, peer: sender, at: in.HLC, collected: collected, valueMax: ConflictValueMax, ownLine: m.format.Load() >= FormatConflictClaims,
			aliases: m.format.Load() >= FormatConflictAliases}
		if in.ConflictValueMax > 0 {
			j.valueMax = in.ConflictValueMax
		}
		b.Track(j.judge)
		defer func() { res.Conflicts, res.Superseded = j.logged, j.superseded }()
	}
	var codec *wire.Codec
	var unheard map[string]bool // authors unheardRelay dropped in this batch
	var kept keptHome
	// A snapshot's entries are staged until its trailer, which applies
	// them all, the trailer's own batch last (store/staged.go says why).
	stage := bt.Snapshot && bt.End == nil && bt.BackfillEnd == nil && m.format.Load() >= FormatStagedSnapshots
	if bt.Snapshot && (bt.End != nil || bt.BackfillEnd != nil) {
		if err := m.reveal(b, in, res); err != nil {
			return nil, err
		}
	}
	runs := in.Foreign
	for i := range ents {
		e := &ents[i]
		if len(runs) > 0 && runs[0].From < e.Index {
			var refusal error
			if runs, refusal = coverForeign(&hwm, runs, e.Index, sender, bt, res); refusal != nil {
				return refuse(refusal)
			}
		}
		if e.IsMarker() {
			// A run the sender's filter left out: nothing to apply, the
			// mark moves past it (acceptor refuses one in a snapshot).
			last := e.FilteredTo
			n, refusal := skipRun(&hwm, e.Index, last, e.Commit, sender, bt.Stream)
			if refusal != nil {
				return refuse(refusal)
			}
			if n == 0 {
				res.Duplicates++
				continue
			}
			hwm.Filtered += n
			res.Filtered += n
			if !bt.Snapshot && m.format.Load() >= FormatKeptHome {
				if err := kept.add(b, sender, m.Link(sender).FromPeer, hwm.Commit); err != nil {
					return nil, err
				}
			}
			hwm.Index, hwm.Commit = last, e.Commit
			continue
		}
		if e.Index == hwm.Index && !bt.Snapshot && !hwm.Commit.IsZero() && e.Commit != hwm.Commit {
			return refuse(&ConflictError{Origin: sender, Stream: bt.Stream, HWM: hwm.Index, HWMCommit: hwm.Commit, Got: e.Commit})
		}
		if e.Index <= hwm.Index {
			res.Duplicates++ // exact duplicate by WAL identity
			continue
		}
		if e.Index != hwm.Index+1 {
			return refuse(&GapError{Origin: sender, Stream: bt.Stream, HWM: hwm.Index, Got: e.Index})
		}
		hwm.Index = e.Index
		if !bt.Snapshot {
			// A snapshot stream records no commit frontier: its entries
			// relay old stamps, and only its trailer, once all of them are
			// in, moves the sender's frontier (on its real stream).
			hwm.Commit = e.Commit
		}
		if err := m.markBackfilled(b, in, e); err != nil {
			return nil, err
		}
		if in.Unknown[e.Index] {
			res.DroppedUnknown++
			hwm.Merged++
			continue
		}
		if author, ok := m.unheardRelay(bt, sender, in, e); ok {
			// A relay of a third cluster whose filter toward this one is
			// not heard here (unheardRelay says why): not taken, and the
			// snapshot's trailer claims none of that cluster's streams.
			if unheard == nil {
				unheard = map[string]bool{}
			}
			if !unheard[author] {
				unheard[author] = true
				if err := b.SetSnapshotUnheard(sender, bt.Stream, author); err != nil {
					return nil, err
				}
			}
			res.DroppedUnheard++
			hwm.Merged++
			continue
		}
		if m.withheldRelay(bt, sender, in, e) {
			// A relay the author's filter toward this cluster keeps home,
			// as the log says now: the acceptor screened the batch
			// before the filter it heard applied.
			res.DroppedWithheld++
			hwm.Merged++
			continue
		}
		if in.Own[e.Index] && phase != store.RejoinRequesting {
			// A snapshot relaying this cluster's own writes, which this
			// node did not ask for: it holds them already (or lost them
			// and will ask).
			res.DroppedOwn++
			hwm.Merged++
			continue
		}
		if reason, dead := in.Dead[e.Index]; dead {
			if codec == nil {
				codec = wire.NewCodec()
			}
			raw := codec.AppendEntry(nil, e, wire.Defaults{})
			if err := b.PutDeadLetter(store.DeadLetter{Origin: e.Origin, Stream: e.Stream, Index: e.Index,
				At: in.At, Reason: reason, Entry: raw}); err != nil {
				return nil, err
			}
			if err := m.markBackfilled(b, in, e); err != nil {
				return nil, err
			}
			m.log.Error("replicate: entry set aside as a dead letter", "sender", sender, "index", e.Index, "reason", reason)
			hwm.DeadLettered++
			res.DeadLettered++
			continue
		}
		if e.Op == entry.OpSet && e.Stamp.Less(horizon) {
			_, _, held, err := b.Stored(e.Key)
			if err != nil {
				return nil, err
			}
			taken := false
			if !held && e.LWW().Origin == sender && m.format.Load() >= FormatKeptHome {
				// The sender's own write where its filter kept keys home
				// from here, not backfilled since: one this tree never
				// received, not a delete it collected. Taken as a
				// backfill's would be (store/kepthome.go).
				if taken, err = kept.holds(b, sender, e.Key, e.Stamp); err != nil {
					return nil, err
				}
			}
			if !held && !taken {
				res.Resurrections++
				if res.Resurrections <= 3 {
					m.log.Warn("replicate: a version of a rejoin's re-seed older than this tree's collection horizon, of a key it holds nothing of, "+
						"not taken: it may have been deleted here (a possible resurrection; replicator diff lists them)",
						"sender", sender, "key", e.Key, "stamp", e.Stamp.String(), "horizon", horizon.String())
				}
				hwm.Merged++
				continue
			}
		}
		if stage {
			if codec == nil {
				codec = wire.NewCodec()
			}
			if err := b.Stage(sender, bt.Stream, e.Index, codec.AppendEntry(nil, e, wire.Defaults{})); err != nil {
				return nil, err
			}
			res.Staged++
			hwm.Merged++
			continue
		}
		before := b.RangeDeleted
		out, err := b.ApplyEntry(e)
		if err == nil && !bt.Snapshot && m.format.Load() >= FormatConflicts {
			err = markRestored(b, e)
			if b.RangeDeleted > before {
				// A range delete's discards are counted per range, not
				// judged per key (its tombstones carry no context).
				res.RangeDiscards++
			}
		}
		if err != nil {
			return nil, err
		}
		if err := m.markBackfilled(b, in, e); err != nil {
			return nil, err
		}
		switch out {
		case entry.Applied:
			res.Applied++
		case entry.Stale:
			res.Stale++
		case entry.Duplicate:
			res.Duplicates++ // content duplicate: same stamp already stored
		}
		hwm.Merged++
	}
	if len(runs) > 0 {
		if _, refusal := coverForeign(&hwm, runs, math.MaxUint64, sender, bt, res); refusal != nil {
			return refuse(refusal)
		}
	}
	if hwm.Index > res.Start {
		if err := b.SetHWM(hwm); err != nil {
			return nil, err
		}
	}
	if bt.End != nil {
		if res.Requested, res.Rejoin, err = m.trailer(b, in, unheard); err != nil {
			return nil, err
		}
	}
	if bt.BackfillEnd != nil {
		if err := m.backfillEnd(b, in); err != nil {
			return nil, err
		}
		if err := kept.carried(b, sender, bt.BackfillEnd.Spans); err != nil {
			return nil, err
		}
	}
	if kept.dirty {
		if err := b.SetKeptHome(sender, kept.ws); err != nil {
			return nil, err
		}
	}
	if hwm.Index > res.Start || bt.End != nil {
		if err := b.RaiseHLC(in.HLC); err != nil {
			return nil, err
		}
	}
	res.HWM, res.HWMCommit = hwm.Index, hwm.Commit
	hs, err := b.HWMsOfExcept(sender, bt.Stream)
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		if h.Stream != bt.Stream && res.OriginFrontier.Less(h.Commit) {
			res.OriginFrontier = h.Commit
		}
	}
	return res, nil
}

// reveal applies, in b, the entries staged by the snapshot stream whose
// trailer b carries, in their order (the stream's earlier batches were
// checked and screened when they came: what is staged is what they would
// have applied then).
func (m *Machine) reveal(b *store.Batch, in *Inbound, res *InboundResult) error {
	codec := wire.NewCodec()
	return b.Staged(in.Sender, in.Batch.Stream, func(index uint64, raw []byte) error {
		e, err := codec.DecodeEntry(raw, wire.Defaults{})
		if err != nil {
			return fmt.Errorf("%w: staged entry %d of %s's snapshot %s: %v", store.ErrCorrupt, index, in.Sender, in.Batch.Stream, err)
		}
		out, err := b.ApplyEntry(&e)
		if err != nil {
			return err
		}
		switch out {
		case entry.Applied:
			res.Applied++
		case entry.Stale:
			res.Stale++
		case entry.Duplicate:
			res.Duplicates++
		}
		return nil
	})
}

// trailer commits the end of a re-seed in the batch of its last entries: the
// sender's real stream is here up to the snapshot's position (its entries up
// to there are covered by the snapshot: seeded), the one-off snapshot stream
// is forgotten, and a rejoin moves on.
func (m *Machine) trailer(b *store.Batch, in *Inbound, unheard map[string]bool) (requested, rejoin bool, err error) {
	bt, sender := in.Batch, in.Sender
	if err := raiseTo(b, sender, bt.End); err != nil {
		return false, false, err
	}
	earlier, err := b.SnapshotUnheard(sender, bt.Stream)
	if err != nil {
		return false, false, err
	}
	for _, a := range earlier {
		if unheard == nil {
			unheard = map[string]bool{}
		}
		unheard[a] = true
	}
	if err := errors.Join(b.DeleteHWM(sender, bt.Stream), b.CloseSnapshot(sender, bt.Stream)); err != nil {
		return false, false, err
	}
	// The sender's marks of other clusters' streams: the snapshot holds the
	// effects of their entries up to there.
	for i, mk := range bt.Marks {
		if mk.Origin == m.cluster || mk.Origin == sender || i >= len(in.KnownMarks) || !in.KnownMarks[i] {
			continue
		}
		if unheard[mk.Origin] || m.filterUnheard(mk.Origin) {
			// This node took none of the origin's relays (or would not
			// have): its entries must come from it, kept to its filter.
			continue
		}
		h, err := b.HWM(mk.Origin, mk.Stream)
		if err != nil {
			return false, false, err
		}
		if mk.Index <= h.Index {
			continue
		}
		if h.Index == 0 {
			if all, err := b.HWMsOf(mk.Origin); err != nil {
				return false, false, err
			} else if len(all) >= in.MaxStreams {
				continue
			}
		}
		h.Seeded += mk.Index - h.Index
		h.Index, h.Commit = mk.Index, mk.Commit
		if err := b.SetHWM(h); err != nil {
			return false, false, err
		}
	}
	if bt.Requested {
		phase, err := b.RejoinPhase(sender)
		if err != nil {
			return false, false, err
		}
		if phase == store.RejoinRequesting {
			if err := b.SetRejoinIn(sender, store.RejoinSeeding); err != nil {
				return false, false, err
			}
			requested = true
		}
	}
	if bt.Rejoin {
		flags, err := b.ReseedRequest(sender)
		if err != nil {
			return false, false, err
		}
		if flags&store.AwaitRejoin != 0 {
			if err := b.SetReseedRequestIn(sender, flags&^store.AwaitRejoin); err != nil {
				return false, false, err
			}
			rejoin = true
		}
	}
	m.log.Info("replicate: re-seed received", "sender", sender, "stream", bt.End.Stream, "resume_after", bt.End.Index,
		"requested", requested, "rejoin", rejoin)
	return requested, rejoin, nil
}

// openSnapshot records a snapshot stream of the sender as open. A
// re-seed's Begin also raises the sender's real stream to where the
// snapshot was taken, counting what it skips as seeded, so the sender's
// live entries after it apply beside the snapshot's.
func (m *Machine) openSnapshot(b *store.Batch, in *Inbound) error {
	bt, sender := in.Batch, in.Sender
	o := store.OpenSnapshot{Sender: sender, Stream: bt.Stream, Kind: store.SnapshotReseed}
	if bt.Backfill {
		o.Kind = store.SnapshotBackfill
	}
	if bt.Begin != nil {
		if err := raiseTo(b, sender, bt.Begin); err != nil {
			return err
		}
		o.Begun, o.Real, o.Index = true, bt.Begin.Stream, bt.Begin.Index
		m.log.Info("replicate: re-seed began", "sender", sender, "stream", bt.Begin.Stream, "resume_after", bt.Begin.Index)
	}
	return b.OpenSnapshot(o)
}

// raiseTo raises the sender's stream at.Stream to at, counting the entries
// it skips as seeded (a snapshot carries their effects).
func raiseTo(b *store.Batch, sender string, at *wire.SnapshotEnd) error {
	real, err := b.HWM(sender, at.Stream)
	if err != nil || at.Index <= real.Index {
		return err
	}
	real.Seeded += at.Index - real.Index
	real.Index, real.Commit = at.Index, at.Commit
	return b.SetHWM(real)
}

// markBackfilled records the key a backfill's entry carried.
func (m *Machine) markBackfilled(b *store.Batch, in *Inbound, e *entry.Entry) error {
	if !in.Batch.Backfill || e.Key == "" || e.Op == entry.OpDeleteRange {
		return nil
	}
	return b.MarkBackfilled(in.Sender, e.Key)
}

// backfillEnd ends a backfill: the keys of its ranges it did not carry,
// that another cluster wrote below the sender's horizon, go (the sender
// collected their deletes while the ranges did not cross); the snapshot
// stream and the marks are forgotten. The sender's real stream does not
// move: live entries flowed meanwhile.
func (m *Machine) backfillEnd(b *store.Batch, in *Inbound) error {
	bt, sender := in.Batch, in.Sender
	dropped := 0
	for _, sp := range bt.BackfillEnd.Spans {
		n, err := b.DropUncarried(sender, m.cluster, sp.Start, sp.End, bt.BackfillEnd.Horizon)
		if err != nil {
			return err
		}
		dropped += n
	}
	if err := errors.Join(b.ClearBackfilled(sender), b.DeleteHWM(sender, bt.Stream), b.CloseSnapshot(sender, bt.Stream)); err != nil {
		return err
	}
	m.log.Info("replicate: backfill received", "sender", sender, "ranges", len(bt.BackfillEnd.Spans),
		"horizon", bt.BackfillEnd.Horizon, "dropped_uncarried", dropped)
	return nil
}

// sortedIndexes lists a set's indexes in order (commands encode sets as
// lists, so that one set always encodes to the same bytes).
func sortedIndexes(set map[uint64]bool) []uint64 {
	out := make([]uint64, 0, len(set))
	for i, ok := range set {
		if ok {
			out = append(out, i)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a] < out[b] })
	return out
}

// The inbound path's words live in wire (the acceptor shares them).
type (
	Inbound       = wire.Inbound
	InboundResult = wire.InboundResult
	GapError      = wire.GapError
	ConflictError = wire.ConflictError
)

// ErrForbidden refuses a batch the tree shows the sender may not send.
var ErrForbidden = wire.ErrForbidden

// unheardRelay reports a snapshot entry (a re-seed's or a backfill's)
// relaying a write of a third cluster that has not told this one its
// filter toward it (from FormatOriginFilters; the acceptor records what
// heartbeats tell, LinkCmd.SetFromPeer): this node lost its data since, or
// never heard from it. What that filter keeps home is unknown, so no relay
// of the author's writes is taken (a relay could hand this cluster keys the
// author keeps from it, which would then go stale here for good); the
// author sends its writes itself, kept to its filter. The log decides it,
// so every node of the cluster takes or leaves the same entries, and the
// decision holds for the whole snapshot (store.SetSnapshotUnheard): a
// filter heard in the middle of one does not let its trailer claim the
// author's streams.
func (m *Machine) unheardRelay(bt *wire.Batch, sender string, in *Inbound, e *entry.Entry) (string, bool) {
	if !bt.Snapshot || in.Own[e.Index] {
		return "", false
	}
	author := relayAuthor(e)
	if author == sender || author == m.cluster || !m.filterUnheard(author) {
		return "", false
	}
	return author, true
}

// withheldRelay reports a snapshot entry relaying a third cluster's write
// that the author's filter toward this cluster, as the log records it when
// the entry applies, keeps home (from FormatRelaysAtApply). The acceptor
// screens a batch by the filter it knows when the batch arrives; the
// heartbeat that recorded a filter may be committed after the screen and
// before the batch's apply, and then a relay the filter keeps home would be
// taken, where it would go stale for good (seen in the robustness run:
// a wiped cluster took a third cluster's home-only keys from a re-seed
// that arrived just after it heard their filter). The log decides it, so
// every node takes or leaves the same entries.
func (m *Machine) withheldRelay(bt *wire.Batch, sender string, in *Inbound, e *entry.Entry) bool {
	if !bt.Snapshot || in.Own[e.Index] || m.format.Load() < FormatRelaysAtApply {
		return false
	}
	author := relayAuthor(e)
	if author == sender || author == m.cluster {
		return false
	}
	f := m.Link(author).FromPeer
	return f != nil && f.KeepsHome(e)
}

// filterUnheard reports a cluster whose filter toward this one the log has
// not recorded (from FormatOriginFilters).
func (m *Machine) filterUnheard(cluster string) bool {
	return m.format.Load() >= FormatOriginFilters && m.Link(cluster).FromPeer == nil
}

// relayAuthor is the cluster whose write a snapshot entry relays.
func relayAuthor(e *entry.Entry) string {
	if e.Op == entry.OpCounter {
		return entry.ComponentCluster(e.CounterComponent())
	}
	return e.LWW().Origin
}

// keptHome is the sender's kept-home windows as one inbound batch reads and
// changes them (store/kepthome.go), read once, written once at its end.
type keptHome struct {
	ws            []store.KeptHome
	loaded, dirty bool
}

func (k *keptHome) load(b *store.Batch, sender string) error {
	if k.loaded {
		return nil
	}
	ws, err := b.KeptHome(sender)
	k.ws, k.loaded = ws, err == nil
	return err
}

// add records that the sender's filter kept entries home from here,
// committed after since: by its filter toward here as the log records it
// (every key when it is not recorded, or recorded as letting every key
// cross: the record is behind the marker).
func (k *keptHome) add(b *store.Batch, sender string, from *entry.Filter, since hlc.Timestamp) error {
	if err := k.load(b, sender); err != nil {
		return err
	}
	spans := []entry.Span{{}}
	if from != nil && !from.All() {
		spans = from.Excluded()
	}
	k.ws, k.dirty = store.AddKeptHome(k.ws, spans, since), true
	return nil
}

// carried forgets the ranges a backfill from the sender carried.
func (k *keptHome) carried(b *store.Batch, sender string, spans []entry.Span) error {
	if err := k.load(b, sender); err != nil {
		return err
	}
	if len(k.ws) > 0 {
		k.ws, k.dirty = store.CarriedKeptHome(k.ws, spans), true
	}
	return nil
}

func (k *keptHome) holds(b *store.Batch, sender, key string, stamp hlc.Timestamp) (bool, error) {
	if err := k.load(b, sender); err != nil {
		return false, err
	}
	return store.KeptHomeHolds(k.ws, key, stamp), nil
}

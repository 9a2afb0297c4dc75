package machine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// partsRig is one receiver applying a peer's batches whole (w) and a
// receiver of three raft groups applying their parts (gs), each machine
// over a real store, each with its own log index.
type partsRig struct {
	t     *testing.T
	w     *Machine
	wst   *store.Store
	wi    uint64
	gs    []*Machine
	gst   []*store.Store
	gi    []uint64
	slots *slot.Map
}

const rigGroups = 3

func newPartsRig(t *testing.T) *partsRig {
	slots, err := slot.Initial(rigGroups)
	if err != nil {
		t.Fatal(err)
	}
	r := &partsRig{t: t, slots: slots}
	r.w, r.wst = openMachine(t, t.TempDir())
	t.Cleanup(func() { r.wst.Close() })
	r.wi++
	mustApply(t, r.w, r.wi, &Command{Format: &FormatCmd{Version: ReadsFormat}})
	t.Cleanup(func() {
		for _, st := range r.gst {
			st.Close()
		}
	})
	for range rigGroups {
		m, st := openMachine(t, t.TempDir())
		mustApply(t, m, 1, &Command{Format: &FormatCmd{Version: ReadsFormat}})
		r.gs, r.gst, r.gi = append(r.gs, m), append(r.gst, st), append(r.gi, 1)
	}
	return r
}

func (r *partsRig) groupOf(key string) int { return r.slots.Group(key) }

func inboundOf(bt *wire.Batch) *Inbound {
	return &Inbound{Sender: "b", Batch: bt, At: 1, MaxStreams: 16, HLC: bt.Entries[len(bt.Entries)-1].Commit}
}

// whole applies a batch to the receiver of one group.
func (r *partsRig) whole(bt *wire.Batch) *InboundResult {
	r.t.Helper()
	r.wi++
	res := mustApply(r.t, r.w, r.wi, &Command{Inbound: inboundOf(bt)}).Inbound
	if res.Err != nil {
		r.t.Fatalf("whole batch: %v", res.Err)
	}
	return res
}

// split splits a batch for the receiver of several groups.
func (r *partsRig) split(bt *wire.Batch) []*Inbound {
	r.t.Helper()
	parts, err := wire.SplitInbound(inboundOf(bt), rigGroups, r.groupOf)
	if err != nil || len(parts) != rigGroups {
		r.t.Fatalf("split: %d parts, %v", len(parts), err)
	}
	return parts
}

// part applies group g's part (through the command's encoding).
func (r *partsRig) part(g int, p *Inbound) *InboundResult {
	r.t.Helper()
	r.gi[g]++
	return mustApply(r.t, r.gs[g], r.gi[g], &Command{Inbound: p}).Inbound
}

// frontier is the least of the groups' marks of the stream: the peer's
// frontier at the receiver of several groups.
func (r *partsRig) frontier(stream entry.StreamID) uint64 {
	r.t.Helper()
	f := uint64(1 << 63)
	for _, st := range r.gst {
		h, err := st.HWM("b", stream)
		if err != nil {
			r.t.Fatal(err)
		}
		f = min(f, h.Index)
	}
	return f
}

// same checks that every key the batches touched reads the same at both
// receivers (from its group's store), that no other group holds a value
// of it, and that every group's mark and commit are the whole receiver's.
func (r *partsRig) same(stream entry.StreamID, keys []string) {
	r.t.Helper()
	for _, k := range keys {
		want, werr := r.wst.Get(k)
		g := r.groupOf(k)
		got, gerr := r.gst[g].Get(k)
		if !errors.Is(werr, gerr) && (werr != nil || gerr != nil) || !reflect.DeepEqual(want, got) {
			r.t.Fatalf("key %q: the whole receiver holds %+v (%v), group %d %+v (%v)", k, want, werr, g, got, gerr)
		}
		wc, werr := r.wst.Counter(k)
		gc, gerr := r.gst[g].Counter(k)
		if !errors.Is(werr, gerr) && (werr != nil || gerr != nil) || !reflect.DeepEqual(wc, gc) {
			r.t.Fatalf("counter %q: the whole receiver holds %+v (%v), group %d %+v (%v)", k, wc, werr, g, gc, gerr)
		}
		for h, st := range r.gst {
			if h == g {
				continue
			}
			if rec, err := st.Get(k); err == nil && rec.Live(0) {
				r.t.Fatalf("key %q of group %d holds a value in group %d: %+v", k, g, h, rec)
			}
		}
	}
	wh, err := r.wst.HWM("b", stream)
	if err != nil {
		r.t.Fatal(err)
	}
	for g, st := range r.gst {
		h, err := st.HWM("b", stream)
		if err != nil {
			r.t.Fatal(err)
		}
		if h.Index != wh.Index || h.Commit != wh.Commit {
			r.t.Fatalf("group %d's mark %d at %v, the whole receiver's %d at %v", g, h.Index, h.Commit, wh.Index, wh.Commit)
		}
	}
}

// peerBatches makes n batches of a peer's stream b: sets, deletes,
// counters (totals of one component, growing), range deletes, atomic
// batches across keys, filtered markers, and a dead letter now and then.
func peerBatches(rng *rand.Rand, stream entry.StreamID, n int) ([]*wire.Batch, []map[uint64]string, []string) {
	keys := make([]string, 24)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	comp := entry.Component("b", stream, 0)
	totals := map[string]uint64{}
	index, wall := uint64(0), int64(1e15)
	var out []*wire.Batch
	var deads []map[uint64]string
	for range n {
		bt := &wire.Batch{Header: wire.Header{Sender: "b", Stream: stream}}
		dead := map[uint64]string{}
		for j := 1 + rng.IntN(12); j > 0; j-- {
			index++
			wall += 1000
			e := entry.Entry{Index: index, Origin: "b", Stream: stream, Commit: hlc.Timestamp{Wall: wall}}
			k := keys[rng.IntN(len(keys))]
			switch rng.IntN(8) {
			case 0, 1:
				e.Op, e.Key, e.Value = entry.OpSet, k, []byte(fmt.Sprint("v", index))
			case 2:
				e.Op, e.Key = entry.OpDelete, k
			case 3:
				totals[k] += uint64(1 + rng.IntN(5))
				e.Op, e.Key, e.Ctr, e.CtrComp = entry.OpCounter, "c"+k, &entry.PN{P: totals[k]}, comp
			case 4:
				// a range over several keys, of several groups
				from := rng.IntN(len(keys) - 6)
				e.Op, e.Key, e.End = entry.OpDeleteRange, keys[from], keys[from+2+rng.IntN(4)]
			case 5:
				e.Op = entry.OpMulti
				for range 2 + rng.IntN(3) {
					e.Ops = append(e.Ops, entry.BatchOp{Op: entry.OpSet, Key: keys[rng.IntN(len(keys))], Value: []byte(fmt.Sprint("m", index))})
				}
			case 6:
				// a run the sender's filter held back
				e.FilteredTo = index + uint64(rng.IntN(3))
				index = e.FilteredTo
			case 7:
				e.Op, e.Key, e.Value = entry.OpSet, k, []byte("dead")
				dead[index] = "a test's dead letter"
			}
			bt.Entries = append(bt.Entries, e)
		}
		out = append(out, bt)
		deads = append(deads, dead)
	}
	all := append([]string{}, keys...)
	for _, k := range keys {
		all = append(all, "c"+k)
	}
	return out, deads, all
}

// TestPartsApplyAsTheWhole: a peer's batches split into the parts of
// three groups (by the slot map), each part applied in its group, leave
// every key as the whole batches leave it at a receiver of one group, in
// the group that owns it and in no other, and every group's mark where the
// whole receiver's is. Then the failure cases: a part whose answer was
// lost, or that committed before a crash, collapses when the batch is
// resent (split again); a group behind the others (a restore, a crash
// before its part committed) takes the resend from the frontier, the least
// of the marks, while the others count it duplicate; a part that begins
// past its group's mark is a gap (a pipelined batch ahead of the one
// before); a foreign run that ends at the mark with another commit is a
// conflict.
func TestPartsApplyAsTheWhole(t *testing.T) {
	r := newPartsRig(t)
	stream := entry.StreamID{0xb}
	rng := rand.New(rand.NewPCG(51, 7))
	batches, deads, keys := peerBatches(rng, stream, 60)
	for i, bt := range batches {
		in := inboundOf(bt)
		in.Dead = deads[i]
		r.wi++
		if res := mustApply(t, r.w, r.wi, &Command{Inbound: in}).Inbound; res.Err != nil {
			t.Fatalf("whole batch %d: %v", i, res.Err)
		}
		parts, err := wire.SplitInbound(in, rigGroups, r.groupOf)
		if err != nil {
			t.Fatal(err)
		}
		for g, p := range parts {
			if res := r.part(g, p); res.Err != nil {
				t.Fatalf("batch %d, group %d: %v", i, g, res.Err)
			}
		}
		// the answer of group 1's part was lost: the resend collapses
		if i%7 == 3 {
			for g, p := range r.split(bt) {
				p.Dead = nil
				if res := r.part(g, p); res.Err != nil || res.Applied+res.Stale != 0 || res.HWM != bt.Entries[len(bt.Entries)-1].Last() {
					t.Fatalf("batch %d resent, group %d: %+v", i, g, res)
				}
			}
		}
	}
	r.same(stream, keys)
	dead := 0
	for _, st := range r.gst {
		dl, err := st.DeadLetters()
		if err != nil {
			t.Fatal(err)
		}
		dead += len(dl)
	}
	wdl, err := r.wst.DeadLetters()
	if err != nil || dead != len(wdl) || dead == 0 {
		t.Fatalf("%d dead letters in the groups, %d at the whole receiver (%v)", dead, len(wdl), err)
	}

	// A crash after groups 0 and 2 committed their parts of the next
	// batch, before group 1 did: the sender resends from the frontier.
	more, _, _ := peerBatches(rand.New(rand.NewPCG(51, 8)), stream, 4)
	last := batches[len(batches)-1].Entries[len(batches[len(batches)-1].Entries)-1].Last()
	renumber(more, last)
	r.whole(more[0])
	first := r.split(more[0])
	r.part(0, first[0])
	r.part(2, first[2])
	if f := r.frontier(stream); f != last {
		t.Fatalf("frontier %d, want %d: group 1 has not covered the batch", f, last)
	}
	// batch 2 pipelined ahead of batch 1 in group 1: a gap, nothing applied
	r.whole(more[1])
	second := r.split(more[1])
	if res := r.part(1, second[1]); !isGap(res.Err) {
		t.Fatalf("group 1 took batch 2's part before batch 1's: %+v", res)
	}
	r.part(0, second[0])
	r.part(2, second[2])
	// the resend from the frontier: both batches again
	for _, bt := range more[:2] {
		for g, p := range r.split(bt) {
			res := r.part(g, p)
			if res.Err != nil || (g != 1 && res.Applied+res.Stale != 0) {
				t.Fatalf("resent, group %d: %+v", g, res)
			}
		}
	}
	r.same(stream, keys)

	// A group restored to an earlier state (its mark behind the others):
	// the frontier is its mark, and the resend from it leaves all equal.
	dir := filepath.Join(t.TempDir(), "group1")
	if err := r.gst[1].Checkpoint(dir); err != nil {
		t.Fatal(err)
	}
	for _, bt := range more[2:] {
		r.whole(bt)
		for g, p := range r.split(bt) {
			r.part(g, p)
		}
	}
	r.gst[1].Close()
	m, st := openMachine(t, dir)
	r.gs[1], r.gst[1] = m, st
	if f := r.frontier(stream); f != more[1].Entries[len(more[1].Entries)-1].Last() {
		t.Fatalf("frontier %d after group 1's restore, want the end of batch 2", f)
	}
	for _, bt := range more[2:] {
		for g, p := range r.split(bt) {
			if res := r.part(g, p); res.Err != nil || (g != 1 && res.Applied+res.Stale != 0) {
				t.Fatalf("resent after a restore, group %d: %+v", g, res)
			}
		}
	}
	r.same(stream, keys)

	// The sender's stream replaced (its indexes reused with other commits):
	// a foreign run ending at a group's mark with another commit is a
	// conflict there, as an entry would be.
	end := r.frontier(stream)
	wh, _ := r.wst.HWM("b", stream)
	forged := &Inbound{Sender: "b", At: 1, MaxStreams: 16, HLC: hlc.Timestamp{Wall: 9e15},
		Batch:   &wire.Batch{Header: wire.Header{Sender: "b", Stream: stream}},
		Foreign: []wire.ForeignRun{{From: end, To: end, Commit: wh.Commit.Add(1)}}}
	if res := r.part(0, forged); !isConflict(res.Err) {
		t.Fatalf("a foreign run at the mark with another commit: %+v", res)
	}
}

// renumber moves batches made from index 1 to follow last.
func renumber(bts []*wire.Batch, last uint64) {
	for _, bt := range bts {
		for i := range bt.Entries {
			e := &bt.Entries[i]
			e.Index += last
			if e.FilteredTo > 0 {
				e.FilteredTo += last
			}
			e.Commit.Wall += 1e12
		}
	}
}

func isGap(err error) bool {
	var g *GapError
	return errors.As(err, &g)
}

func isConflict(err error) bool {
	var c *ConflictError
	return errors.As(err, &c)
}

// TestSnapshotPartsApplyAsTheWhole: a re-seed and a backfill split into
// the parts of three groups leave every key as at a receiver of one group:
// their entries staged in each group until the trailer's part reveals
// them, the trailer raising the sender's real stream and a third
// cluster's stream to its marks in every group, a trailer sent again
// answered as resent by every group (also one whose part holds foreign
// runs only), and a backfill's end dropping in each group the keys of its
// ranges it did not carry.
func TestSnapshotPartsApplyAsTheWhole(t *testing.T) {
	r := newPartsRig(t)
	at := func(i uint64) hlc.Timestamp { return hlc.Timestamp{Wall: 2e15 + int64(i)} }
	streamC := entry.StreamID{0xc}
	all := func(c *Command) {
		r.wi++
		mustApply(t, r.w, r.wi, c)
		for g := range r.gs {
			r.gi[g]++
			mustApply(t, r.gs[g], r.gi[g], c)
		}
	}
	// c's filter toward this cluster is heard (its relays are taken).
	all(&Command{Link: &LinkCmd{Peer: "c", SetFromPeer: true}})
	// keys of each group
	byGroup := make([][]string, rigGroups)
	for i := 0; len(byGroup[0]) < 6 || len(byGroup[1]) < 6 || len(byGroup[2]) < 6; i++ {
		k := fmt.Sprintf("s%03d", i)
		byGroup[r.groupOf(k)] = append(byGroup[r.groupOf(k)], k)
	}
	var keys []string
	for _, ks := range byGroup {
		keys = append(keys, ks...)
	}
	// apply sends a batch whole and in parts; it returns the parts'
	// results.
	apply := func(h wire.Header, ents ...entry.Entry) []*InboundResult {
		t.Helper()
		h.Sender = "b"
		in := &Inbound{Sender: "b", MaxStreams: 16, HLC: at(5000), Batch: &wire.Batch{Header: h, Entries: ents}}
		if h.End != nil {
			in.KnownMarks = make([]bool, len(h.Marks))
			for i := range in.KnownMarks {
				in.KnownMarks[i] = true
			}
		}
		r.wi++
		wres := mustApply(t, r.w, r.wi, &Command{Inbound: in}).Inbound
		if wres.Err != nil {
			t.Fatalf("whole: %v", wres.Err)
		}
		parts, err := wire.SplitInbound(in, rigGroups, r.groupOf)
		if err != nil {
			t.Fatal(err)
		}
		var out []*InboundResult
		for g, p := range parts {
			res := r.part(g, p)
			if res.Err != nil {
				t.Fatalf("group %d: %v", g, res.Err)
			}
			out = append(out, res)
		}
		return out
	}
	relay := func(stream entry.StreamID, i uint64, k, origin string, stamp hlc.Timestamp) entry.Entry {
		return entry.Entry{Index: i, Origin: "b", Stream: stream, Commit: at(1000), Stamp: stamp, StampOrigin: origin, Op: entry.OpSet, Key: k, Value: []byte(k + origin)}
	}
	// Live writes of b first, to keys of every group.
	var live []entry.Entry
	for i, k := range keys[:9] {
		live = append(live, entry.Entry{Index: uint64(i + 1), Origin: "b", Stream: streamB, Commit: at(uint64(10 + i)), Op: entry.OpSet, Key: k, Value: []byte("live")})
	}
	apply(wire.Header{Stream: streamB}, live...)

	// A re-seed in three batches; its trailer's entries are all of group 0.
	snapS := entry.StreamID{0x5a}
	var ents []entry.Entry
	for i, k := range keys {
		origin := "b"
		if i%2 == 0 {
			origin = "c"
		}
		ents = append(ents, relay(snapS, uint64(i+1), k, origin, at(uint64(100+i))))
	}
	third := len(ents) / 3
	apply(wire.Header{Stream: snapS, Snapshot: true}, ents[:third]...)
	apply(wire.Header{Stream: snapS, Snapshot: true}, ents[third:2*third]...)
	for _, k := range keys[9:] {
		if rec, err := r.gst[r.groupOf(k)].Get(k); err == nil {
			t.Fatalf("key %q shows before the trailer: %+v", k, rec)
		}
	}
	pos := &wire.SnapshotEnd{Stream: streamB, Index: 40, Commit: at(40)}
	marks := []wire.Mark{{Origin: "c", Stream: streamC, Index: 7, Commit: at(7)}}
	trailerEnts := append([]entry.Entry{}, ents[2*third:]...)
	trailer := wire.Header{Stream: snapS, Snapshot: true, End: pos, Marks: marks}
	apply(trailer, trailerEnts...)
	r.same(streamB, keys)
	for g, st := range r.gst {
		if h, _ := st.HWM("c", streamC); h.Index != 7 {
			t.Fatalf("group %d: c's mark %d after the trailer, want 7", g, h.Index)
		}
	}
	// The trailer's batch again: resent in every group.
	for g, res := range apply(trailer, trailerEnts...) {
		if !res.Resent || res.Applied != 0 {
			t.Fatalf("group %d: the trailer sent again: %+v", g, res)
		}
	}
	// A trailer whose entries are all of group 0, sent again: the other
	// groups' parts hold foreign runs only, and are resent too.
	snap2 := entry.StreamID{0x5b}
	pos2 := &wire.SnapshotEnd{Stream: streamB, Index: 41, Commit: at(41)}
	apply(wire.Header{Stream: snap2, Snapshot: true}, relay(snap2, 1, byGroup[1][0], "b", at(300)), relay(snap2, 2, byGroup[2][0], "b", at(301)))
	for g, st := range r.gst {
		// open in group 0 too, whose part held foreign runs only: no
		// tombstone goes there until it ends
		if open, err := st.OpenSnapshots(); err != nil || len(open) != 1 || open[0].Stream != snap2 {
			t.Fatalf("group %d: open snapshots %+v (%v), want %s", g, open, err, snap2)
		}
	}
	last := []entry.Entry{relay(snap2, 3, byGroup[0][0], "b", at(302)), relay(snap2, 4, byGroup[0][1], "b", at(303))}
	apply(wire.Header{Stream: snap2, Snapshot: true, End: pos2}, last...)
	r.same(streamB, keys)
	for g, res := range apply(wire.Header{Stream: snap2, Snapshot: true, End: pos2}, last...) {
		if !res.Resent {
			t.Fatalf("group %d: the trailer of foreign runs only, sent again: %+v", g, res)
		}
	}

	// A backfill of the range s0: it carries some keys of every group and
	// not the others, which its end drops where c wrote them below its
	// horizon.
	bf := entry.StreamID{0x7a}
	var carried []entry.Entry
	for i, k := range keys {
		if i%3 == 0 {
			carried = append(carried, relay(bf, uint64(len(carried)+1), k, "c", at(uint64(500+i))))
		}
	}
	apply(wire.Header{Stream: bf, Snapshot: true, Backfill: true}, carried[:len(carried)/2]...)
	apply(wire.Header{Stream: bf, Snapshot: true, Backfill: true,
		BackfillEnd: &wire.BackfillEnd{Horizon: at(1000), Spans: []entry.Span{{Start: "s0", End: "s1"}}}}, carried[len(carried)/2:]...)
	r.same(streamB, keys)
	dropped := 0
	for _, k := range keys {
		if _, err := r.wst.Get(k); errors.Is(err, store.ErrNotFound) {
			dropped++
		}
	}
	if dropped == 0 {
		t.Fatal("the backfill's end dropped nothing: the test shows nothing of it")
	}
}

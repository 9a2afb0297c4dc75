package machine

import (
	"errors"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// TestSnapshotRevealedWithItsTrailer (issue 48): a snapshot arrives in
// batches of keys; a transaction of c relayed in it, its keys in two
// batches, shows whole or not at all. From format 13 the entries are
// staged and the trailer's batch applies them all; a refused trailer
// applies none; an abandoned snapshot's staged entries go with it and
// never show; a backfill is staged the same way. Before the format, each
// batch applies as it comes (a node of an older build does).
func TestSnapshotRevealedWithItsTrailer(t *testing.T) {
	at := func(i uint64) hlc.Timestamp { return hlc.Timestamp{Wall: 2e15 + int64(i)} }
	txn := at(7) // one stamp: c's transaction of tx/a and tx/b
	pos := &wire.SnapshotEnd{Stream: streamB, Index: 40, Commit: at(40)}
	relay := func(stream entry.StreamID, i uint64, k string, stamp hlc.Timestamp) entry.Entry {
		return entry.Entry{Index: i, Origin: "b", Stream: stream, Commit: at(1000), Stamp: stamp, StampOrigin: "c",
			Op: entry.OpSet, Key: k, Value: []byte("v")}
	}
	batch := func(h wire.Header, ents ...entry.Entry) *Command {
		h.Sender, h.Snapshot = "b", true
		return &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: at(2000), Batch: &wire.Batch{Header: h, Entries: ents}}}
	}
	staged := func(st *store.Store, stream entry.StreamID) int {
		b := st.NewBatch()
		defer b.Close()
		n := 0
		if err := b.Staged("b", stream, func(uint64, []byte) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	present := func(st *store.Store, k string) bool {
		_, err := st.Get(k)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}

	for _, format := range []uint8{FormatCounterFloors, FormatStagedSnapshots} {
		m, st := openMachine(t, t.TempDir())
		idx := uint64(0)
		apply := func(c *Command) *InboundResult {
			idx++
			r := mustApply(t, m, idx, c).Inbound
			if r != nil && r.Err != nil {
				t.Fatalf("format %d, command %d: %v", format, idx, r.Err)
			}
			return r
		}
		apply(&Command{Mint: &MintCmd{Stream: testStream}})
		apply(&Command{Format: &FormatCmd{Version: format}})
		apply(&Command{Link: &LinkCmd{Peer: "c", SetFromPeer: true, Filter: entry.Filter{}}})

		// A re-seed in two batches, the transaction straddling them.
		snapS := entry.StreamID{0x5a}
		r := apply(batch(wire.Header{Stream: snapS}, relay(snapS, 1, "one", at(3)), relay(snapS, 2, "tx/a", txn)))
		if format < FormatStagedSnapshots {
			if r.Applied != 2 || !present(st, "tx/a") {
				t.Fatalf("format %d applies a snapshot's batch as it comes: %+v", format, r)
			}
			st.Close()
			continue
		}
		if r.Staged != 2 || r.Applied != 0 || present(st, "tx/a") || present(st, "one") || staged(st, snapS) != 2 {
			t.Fatalf("the first batch of a snapshot shows before its trailer: %+v", r)
		}
		if h, _ := st.HWM("b", snapS); h.Index != 2 || h.Merged != 2 {
			t.Fatalf("the snapshot stream's mark does not count what it staged: %+v", h)
		}
		// The trailer's batch with a gap is refused: nothing shows.
		idx++
		if res := mustApply(t, m, idx, batch(wire.Header{Stream: snapS, End: pos}, relay(snapS, 4, "tx/b", txn))).Inbound; res.Err == nil {
			t.Fatal("a trailer batch with a gap was taken")
		}
		if present(st, "tx/a") || staged(st, snapS) != 2 {
			t.Fatal("a refused trailer showed the snapshot or forgot what it staged")
		}
		// A trailer heard twice: the first reveals everything at once.
		r = apply(batch(wire.Header{Stream: snapS, End: pos}, relay(snapS, 3, "tx/b", txn)))
		if r.Applied != 3 || !present(st, "tx/a") || !present(st, "tx/b") || !present(st, "one") || staged(st, snapS) != 0 {
			t.Fatalf("the trailer did not reveal the snapshot whole: %+v", r)
		}
		if r = apply(batch(wire.Header{Stream: snapS, End: pos}, relay(snapS, 3, "tx/b", txn))); !r.Resent || r.Applied != 0 {
			t.Fatalf("the resent trailer: %+v", r)
		}

		// An abandoned re-seed: a new one of the same sender forgets it,
		// and what it staged never shows.
		gone, next := entry.StreamID{0x6a}, entry.StreamID{0x6b}
		apply(batch(wire.Header{Stream: gone}, relay(gone, 1, "gone/x", at(9))))
		apply(batch(wire.Header{Stream: next}, relay(next, 1, "next/x", at(9))))
		if staged(st, gone) != 0 || staged(st, next) != 1 {
			t.Fatalf("staged after a new re-seed: abandoned %d, new %d", staged(st, gone), staged(st, next))
		}
		apply(batch(wire.Header{Stream: next, End: pos}))
		if present(st, "gone/x") || !present(st, "next/x") {
			t.Fatal("an abandoned re-seed's staged entry showed, or the new one's did not")
		}

		// A backfill is staged until its end.
		bf := entry.StreamID{0x7a}
		apply(batch(wire.Header{Stream: bf, Backfill: true}, relay(bf, 1, "bf/x", at(11))))
		if present(st, "bf/x") {
			t.Fatal("a backfill's batch shows before its end")
		}
		r = apply(batch(wire.Header{Stream: bf, Backfill: true, BackfillEnd: &wire.BackfillEnd{Spans: []entry.Span{{Start: "bf/"}}}}))
		if r.Applied != 1 || !present(st, "bf/x") || staged(st, bf) != 0 {
			t.Fatalf("the backfill's end did not reveal it: %+v", r)
		}
		if open, err := st.OpenSnapshots(); err != nil || len(open) != 0 {
			t.Fatalf("open snapshots at the end: %+v %v", open, err)
		}
		st.Close()
	}
}

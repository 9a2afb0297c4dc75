package machine

import (
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// TestRejoinTakesWhatAFilterKeptHome (a robustness run, seed 7): b's link
// to c kept w/ home while b wrote w/k (c got a filtered marker), c's
// collection horizon passed it, and b was restored from a backup taken
// before the narrowing: b never knew to backfill the range, and its
// rejoin's re-seed carried w/k older than c's horizon, of a key c held
// nothing of, which c refused as a possible resurrection: c lacked w/k for
// good. From format 13 c records where b's filter kept keys home, and
// since when, until a backfill from b carries the ranges, and takes b's
// own versions there as a backfill's. Versions from before the window,
// outside its ranges or of another author stay refused.
func TestRejoinTakesWhatAFilterKeptHome(t *testing.T) {
	at := func(w int64) hlc.Timestamp { return hlc.Timestamp{Wall: 2e15 + w} }
	for _, format := range []uint8{FormatCounterFloors, FormatKeptHome} {
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
		inbound := func(h wire.Header, ents ...entry.Entry) *Command {
			h.Sender = "b"
			return &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: at(5000), Batch: &wire.Batch{Header: h, Entries: ents}}}
		}
		apply(&Command{Mint: &MintCmd{Stream: testStream}})
		apply(&Command{Format: &FormatCmd{Version: format}})
		apply(&Command{Link: &LinkCmd{Peer: "b", SetFromPeer: true, Filter: entry.Filter{Exclude: []string{"w/"}}}})
		apply(&Command{Link: &LinkCmd{Peer: "c", SetFromPeer: true, Filter: entry.Filter{}}})
		// b's live stream: x/a crosses, then w/k's entries are a marker.
		apply(inbound(wire.Header{Stream: streamB},
			entry.Entry{Index: 1, Origin: "b", Stream: streamB, Commit: at(10), Stamp: at(10), Op: entry.OpSet, Key: "x/a", Value: []byte("v")},
			entry.Entry{Index: 2, Origin: "b", Stream: streamB, Commit: at(30), FilteredTo: 3}))
		apply(&Command{Collect: &CollectCmd{Cutoff: at(100), Max: 10}})

		snapStream := byte(0x70)
		rejoin := func(ents ...entry.Entry) *InboundResult {
			snapStream++
			s := entry.StreamID{snapStream}
			for i := range ents {
				ents[i].Index, ents[i].Origin, ents[i].Stream, ents[i].Commit, ents[i].Op = uint64(i+1), "b", s, at(4000), entry.OpSet
				ents[i].Value = []byte("v")
			}
			return apply(inbound(wire.Header{Stream: s, Snapshot: true, Rejoin: true,
				End: &wire.SnapshotEnd{Stream: streamB, Index: 3, Commit: at(30)}}, ents...))
		}
		r := rejoin(
			entry.Entry{Key: "w/k", Stamp: at(20)},                   // b's, in the window: never received here
			entry.Entry{Key: "w/old", Stamp: at(5)},                  // before the window
			entry.Entry{Key: "y/z", Stamp: at(20)},                   // outside its ranges
			entry.Entry{Key: "w/c", Stamp: at(20), StampOrigin: "c"}, // another author's
		)
		_, err := st.Get("w/k")
		if format < FormatKeptHome {
			if err == nil || r.Resurrections != 4 {
				t.Fatalf("format %d judges as its builds do: w/k %v, %+v", format, err, r)
			}
			st.Close()
			continue
		}
		if err != nil || r.Resurrections != 3 || r.Applied != 1 {
			t.Fatalf("w/k not taken (%v) or the others taken: %+v", err, r)
		}
		// A backfill of w/ from b: the window is carried, and a rejoin's
		// old version there is judged by the horizon again.
		bf := entry.StreamID{0x7f}
		apply(inbound(wire.Header{Stream: bf, Snapshot: true, Backfill: true, BackfillEnd: &wire.BackfillEnd{Spans: []entry.Span{{Start: "w/", End: "w0"}}}}))
		b := st.NewBatch()
		ws, err := b.KeptHome("b")
		b.Close()
		if err != nil || len(ws) != 0 {
			t.Fatalf("windows after the backfill: %+v %v", ws, err)
		}
		if r := rejoin(entry.Entry{Key: "w/k2", Stamp: at(20)}); r.Resurrections != 1 {
			t.Fatalf("after the backfill: %+v", r)
		}
		st.Close()
	}
}

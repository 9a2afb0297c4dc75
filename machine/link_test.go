package machine

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/wire"
)

// TestFilteredMarkers: a marker raises the sender's mark past its run,
// counted as filtered; a marker the mark already passed is a duplicate; one
// that starts past the mark is a gap; one that overlaps the mark counts only
// what it adds; the commit frontier moves to the run's last commit.
func TestFilteredMarkers(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	ts := hlc.Timestamp{Wall: 2e15}
	at := func(i uint64) hlc.Timestamp { return hlc.Timestamp{Wall: ts.Wall + int64(i)} }
	marker := func(from, to uint64) entry.Entry {
		return entry.Entry{Index: from, Origin: "b", Stream: streamB, Commit: at(to), FilteredTo: to}
	}
	set := func(i uint64, k string) entry.Entry {
		return entry.Entry{Index: i, Origin: "b", Stream: streamB, Commit: at(i), Stamp: at(i), Op: entry.OpSet, Key: k, Value: []byte("v")}
	}
	batch := func(ents ...entry.Entry) *Command {
		return &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: at(100),
			Batch: &wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: ents}}}
	}
	res := mustApply(t, m, 2, batch(marker(1, 5), set(6, "s/6"), marker(7, 9)))
	if r := res.Inbound; r.Err != nil || r.HWM != 9 || r.Filtered != 8 || r.Applied != 1 || r.HWMCommit != at(9) {
		t.Fatalf("first batch: %+v", r)
	}
	// resent: every index already applied
	res = mustApply(t, m, 3, batch(marker(7, 9)))
	if r := res.Inbound; r.Err != nil || r.HWM != 9 || r.Filtered != 0 || r.Duplicates != 1 {
		t.Fatalf("resent marker: %+v", r)
	}
	// a gap
	res = mustApply(t, m, 4, batch(marker(11, 12)))
	var gap *GapError
	if r := res.Inbound; !errors.As(r.Err, &gap) || gap.HWM != 9 {
		t.Fatalf("a marker past the mark: %+v", r)
	}
	// overlapping the mark: only the new part counts
	res = mustApply(t, m, 5, batch(marker(8, 12), set(13, "s/13")))
	if r := res.Inbound; r.Err != nil || r.HWM != 13 || r.Filtered != 3 || r.Applied != 1 {
		t.Fatalf("overlapping marker: %+v", r)
	}
	// a marker ending at the mark with another commit: two writes under
	// one identity
	res = mustApply(t, m, 6, batch(entry.Entry{Index: 13, Origin: "b", Stream: streamB, Commit: at(99), FilteredTo: 13}))
	var conflict *ConflictError
	if r := res.Inbound; !errors.As(r.Err, &conflict) {
		t.Fatalf("a marker that contradicts the mark's commit: %+v", r)
	}
	h, err := st.HWM("b", streamB)
	if err != nil {
		t.Fatal(err)
	}
	if h.Index != 13 || h.Filtered != 11 || h.Merged != 2 || h.Merged+h.Filtered+h.DeadLettered+h.Seeded != h.Index {
		t.Fatalf("the mark does not account for its indexes: %+v", h)
	}
}

// TestLinkCommand: a filter takes effect at the stream's next index; a
// seed applies only to a link the log says nothing of; widening records
// the ranges to backfill, and a done of an older generation leaves a later
// widening pending; a build that reads format 2 refuses the command.
func TestLinkCommand(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	defer func() { st.Close() }()
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Local: []Proposal{s.put("a", "1"), s.put("b", "2")}})
	shared := entry.Filter{Include: []string{"shared/"}}
	mustApply(t, m, 3, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: shared, Seed: true}})
	mustApply(t, m, 4, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: entry.Filter{Include: []string{"other/"}}, Seed: true}})
	ls := m.Link("c")
	if f, _ := ls.FilterAt(testStream, 1); f.String() != "+shared/" || len(ls.Backfill) != 0 {
		t.Fatalf("after a seed and a second seed: %+v", ls)
	}
	wide := entry.Filter{Include: []string{"shared/", "tenant1/"}}
	mustApply(t, m, 5, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: wide}})
	ls = m.Link("c")
	if f, _ := ls.FilterAt(testStream, 2); f.String() != "+shared/" {
		t.Fatalf("entry 2, before the change, ships by %s", f)
	}
	if f, _ := ls.FilterAt(testStream, 3); f.String() != "+shared/ +tenant1/" {
		t.Fatalf("entry 3, after the change, ships by %s", f)
	}
	if ls.BackfillGen != 1 || len(ls.Backfill) != 1 || ls.Backfill[0] != (entry.Span{Start: "tenant1/", End: "tenant10"}) {
		t.Fatalf("pending backfill: %+v", ls)
	}
	mustApply(t, m, 6, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: entry.Filter{Include: []string{"shared/", "tenant1/", "tenant2/"}}}})
	mustApply(t, m, 7, &Command{Link: &LinkCmd{Peer: "c", BackfillDone: 1}})
	if ls = m.Link("c"); ls.BackfillGen != 2 || len(ls.Backfill) != 2 {
		t.Fatalf("a done of generation 1 cleared a later widening: %+v", ls)
	}
	mustApply(t, m, 8, &Command{Link: &LinkCmd{Peer: "c", BackfillDone: 2}})
	if ls = m.Link("c"); len(ls.Backfill) != 0 {
		t.Fatalf("done of the last generation: %+v", ls)
	}
	// The settings survive a reopen.
	st.Close()
	m, st = openMachine(t, dir)
	if got := m.Link("c"); got.Current().String() != "+shared/ +tenant1/ +tenant2/" {
		t.Fatalf("after a reopen: %+v", got)
	}
	// A build that reads format 2 stops at a link command rather than
	// ship by another filter than its cluster.
	old, err := Open(st, Options{Cluster: "a", ReadsFormat: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Apply(9, encode(t, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true}})); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a format-2 build applied a link command: %v", err)
	}
}

// TestReseedBegin: a re-seed's begin raises the sender's real stream at
// once (what it skips counted as seeded), so live entries after it apply
// while the snapshot's go on in their own stream; the re-seed stays open
// (holding tombstone collection) until its trailer, and a new one forgets
// an abandoned one.
func TestReseedBegin(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	ts := hlc.Timestamp{Wall: 2e15}
	at := func(i uint64) hlc.Timestamp { return hlc.Timestamp{Wall: ts.Wall + int64(i)} }
	live := func(i uint64, k, v string) *Command {
		e := entry.Entry{Index: i, Origin: "b", Stream: streamB, Commit: at(i), Stamp: at(i), Op: entry.OpSet, Key: k, Value: []byte(v)}
		return &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: at(i),
			Batch: &wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{e}}}}
	}
	snapA, snapB := entry.StreamID{0x1a}, entry.StreamID{0x1b}
	pos := &wire.SnapshotEnd{Stream: streamB, Index: 40, Commit: at(40)}
	snap := func(stream entry.StreamID, i uint64, k string, stamp uint64, begin, end bool) *Command {
		e := entry.Entry{Index: i, Origin: "b", Stream: stream, Commit: at(1000), Stamp: at(stamp), Op: entry.OpSet, Key: k, Value: []byte("old")}
		h := wire.Header{Sender: "b", Stream: stream, Snapshot: true}
		if begin {
			h.Begin = pos
		}
		if end {
			h.End = pos
		}
		return &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: at(41), Batch: &wire.Batch{Header: h, Entries: []entry.Entry{e}}}}
	}
	mustApply(t, m, 2, live(1, "k/1", "v"))
	// An abandoned re-seed that began, then a new one.
	if r := mustApply(t, m, 3, snap(snapA, 1, "k/a", 5, true, false)).Inbound; r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := mustApply(t, m, 4, snap(snapB, 1, "k/b", 5, true, false)).Inbound; r.Err != nil {
		t.Fatal(r.Err)
	}
	h, _ := st.HWM("b", streamB)
	if h.Index != 40 || h.Seeded != 39 || h.Merged != 1 || h.Commit != at(40) {
		t.Fatalf("the real stream after the begin: %+v", h)
	}
	open, err := st.OpenSnapshots()
	if err != nil || len(open) != 1 || open[0].Stream != snapB || !open[0].Begun || open[0].Index != 40 || open[0].Real != streamB {
		t.Fatalf("open snapshots: %+v %v", open, err)
	}
	if h, _ := st.HWM("b", snapA); h.Index != 0 {
		t.Fatalf("the abandoned snapshot stream's mark stays: %+v", h)
	}
	if s, ok, err := st.BegunReseed("b"); err != nil || !ok || s != snapB {
		t.Fatalf("begun re-seed: %v %v %v", s, ok, err)
	}
	// A live entry after the position applies beside the snapshot, and
	// the snapshot's older version of the same key loses to it.
	if r := mustApply(t, m, 5, live(41, "k/x", "new")).Inbound; r.Err != nil || r.Applied != 1 || r.HWM != 41 {
		t.Fatalf("live entry after the begin: %+v", r)
	}
	if r := mustApply(t, m, 6, snap(snapB, 2, "k/x", 3, false, true)).Inbound; r.Err != nil || r.Stale != 1 {
		t.Fatalf("the trailer batch: %+v", r)
	}
	if rec, err := st.Get("k/x"); err != nil || string(rec.Value) != "new" {
		t.Fatalf("k/x: %+v %v", rec, err)
	}
	if open, err := st.OpenSnapshots(); err != nil || len(open) != 0 {
		t.Fatalf("open after the trailer: %+v %v", open, err)
	}
	h, _ = st.HWM("b", streamB)
	if h.Index != 41 || h.Merged+h.Filtered+h.DeadLettered+h.Seeded != h.Index {
		t.Fatalf("the mark does not account for its indexes: %+v", h)
	}
	// A whole re-seed in one batch opens and ends in the same commit.
	if r := mustApply(t, m, 7, snap(entry.StreamID{0x1c}, 1, "k/c", 5, true, true)).Inbound; r.Err != nil {
		t.Fatal(r.Err)
	}
	if open, err := st.OpenSnapshots(); err != nil || len(open) != 0 {
		t.Fatalf("open after a one-batch re-seed: %+v %v", open, err)
	}
}

// TestFilterEpochsBounded: a filter change that would keep more epochs
// than the bound, all of them for entries the stream still keeps, is
// refused (the entries would otherwise ship by a filter not their own);
// once the stream is cut behind them, changes go through again.
func TestFilterEpochsBounded(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	idx := uint64(1)
	apply := func(c *Command) *Result {
		idx++
		return mustApply(t, m, idx, c)
	}
	mustApply(t, m, idx, &Command{Mint: &MintCmd{Stream: testStream}})
	filter := func(i int) *Command {
		return &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: entry.Filter{Include: []string{fmt.Sprintf("p%03d/", i)}}}}
	}
	for i := 0; i < MaxFilterEpochs; i++ {
		apply(&Command{Local: []Proposal{s.put(fmt.Sprintf("k%d", i), "v")}})
		if res := apply(filter(i)); !res.Swapped {
			t.Fatalf("change %d refused", i)
		}
	}
	apply(&Command{Local: []Proposal{s.put("last", "v")}})
	before := m.Link("c")
	if res := apply(filter(MaxFilterEpochs)); res.Swapped {
		t.Fatal("a change past the bound went through")
	}
	if got := m.Link("c"); len(got.Filters) != len(before.Filters) || !got.Current().Equal(before.Current()) {
		t.Fatalf("a refused change changed the link: %d epochs, %s", len(got.Filters), got.Current())
	}
	ls := m.Link("c")
	if f, _ := ls.FilterAt(testStream, 2); f.String() != "+p000/" || ls.Current().String() != "+p063/" {
		t.Fatalf("entry 2 ships by %s, the current filter is %s", f, ls.Current())
	}
	// The stream cut behind all but the last entries: old epochs go.
	apply(&Command{Truncate: &TruncateCmd{Stream: testStream, First: m.out.Last()}})
	if res := apply(filter(MaxFilterEpochs)); !res.Swapped {
		t.Fatal("a change refused after the stream was cut")
	}
	if n := len(m.Link("c").Filters); n > 2 {
		t.Fatalf("%d epochs kept after the cut", n)
	}
}

// TestPendingBackfillCollapses: ranges pending for a backfill that grow
// past what one trailer may name (the filter widened piecemeal many times)
// collapse to every range the filter lets cross.
func TestPendingBackfillCollapses(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	idx := uint64(1)
	set := func(f entry.Filter) {
		idx++
		mustApply(t, m, idx, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: f}})
	}
	set(entry.Filter{}) // every key, nothing pending
	for cycle := 0; cycle < 5; cycle++ {
		var ex []string
		for i := 0; i < entry.MaxFilterPrefixes; i++ {
			ex = append(ex, fmt.Sprintf("%d/%03d", cycle, 2*i)) // disjoint, not adjacent
		}
		set(entry.Filter{Exclude: ex}) // narrows
		set(entry.Filter{})            // widens: 64 more ranges pending
	}
	ls := m.Link("c")
	if len(ls.Backfill) > wire.MaxBackfillSpans {
		t.Fatalf("%d ranges pending, past the bound of %d", len(ls.Backfill), wire.MaxBackfillSpans)
	}
	if len(ls.Backfill) != 1 || ls.Backfill[0] != (entry.Span{}) {
		t.Fatalf("pending after the collapse: %d ranges %v", len(ls.Backfill), ls.Backfill[:min(3, len(ls.Backfill))])
	}
}

// TestUnheardRelaysHoldTheirMarks: b re-seeds this cluster (a) and relays
// writes of c, whose filter toward a the log has not recorded (a lost its
// data, or never heard from c). The relays are not taken; c's filter is
// heard in the middle of the snapshot; the trailer's mark of c's stream is
// still not taken (c sends its entries itself), across a reopen too, while
// a mark of d, whose filter was heard before, is. Relays of d's writes
// are taken, and the records of the snapshot go with its trailer.
func TestUnheardRelaysHoldTheirMarks(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	defer func() { st.Close() }()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatOriginFilters}})
	mustApply(t, m, 3, &Command{Link: &LinkCmd{Peer: "d", SetFromPeer: true}})
	at := func(i uint64) hlc.Timestamp { return hlc.Timestamp{Wall: 2e15 + int64(i)} }
	snapS := entry.StreamID{0x5a}
	streamC, streamD := entry.StreamID{0xc}, entry.StreamID{0xd}
	relay := func(i uint64, origin, k string) entry.Entry {
		return entry.Entry{Index: i, Origin: "b", Stream: snapS, Commit: at(1000), Stamp: at(i), StampOrigin: origin,
			Op: entry.OpSet, Key: k, Value: []byte("v")}
	}
	snap := func(end bool, ents ...entry.Entry) *Command {
		h := wire.Header{Sender: "b", Stream: snapS, Snapshot: true}
		if end {
			h.End = &wire.SnapshotEnd{Stream: streamB, Index: 9, Commit: at(9)}
			h.Marks = []wire.Mark{{Origin: "c", Stream: streamC, Index: 7, Commit: at(7)}, {Origin: "d", Stream: streamD, Index: 5, Commit: at(5)}}
		}
		in := &Inbound{Sender: "b", MaxStreams: 16, HLC: at(2000), Batch: &wire.Batch{Header: h, Entries: ents}}
		if end {
			in.KnownMarks = []bool{true, true}
		}
		return &Command{Inbound: in}
	}
	r := mustApply(t, m, 4, snap(false, relay(1, "c", "c/1"), relay(2, "d", "d/1"), relay(3, "b", "b/1"))).Inbound
	if r.Err != nil || r.DroppedUnheard != 1 || r.Applied != 2 || r.HWM != 3 {
		t.Fatalf("first batch: %+v", r)
	}
	if _, err := st.Get("c/1"); err == nil {
		t.Fatal("a relay of c's write was taken while c's filter toward a was not heard")
	}
	// c's filter is heard now (it keeps nothing home), and a reopen forgets
	// nothing of the snapshot.
	mustApply(t, m, 5, &Command{Link: &LinkCmd{Peer: "c", SetFromPeer: true}})
	st.Close()
	m, st = openMachine(t, dir)
	r = mustApply(t, m, 6, snap(true, relay(4, "c", "c/2"), relay(5, "d", "d/2"))).Inbound
	if r.Err != nil || r.DroppedUnheard != 0 || r.Applied != 2 {
		t.Fatalf("trailer batch: %+v", r)
	}
	if h, _ := st.HWM("c", streamC); h.Index != 0 {
		t.Fatalf("the trailer claimed c's stream to %d, though c's relays before its filter was heard were not taken", h.Index)
	}
	if h, _ := st.HWM("d", streamD); h.Index != 5 || h.Seeded != 5 {
		t.Fatalf("d's stream after the trailer: %+v", h)
	}
	b := st.NewBatch()
	left, err := b.SnapshotUnheard("b", snapS)
	b.Close()
	if err != nil || len(left) != 0 {
		t.Fatalf("the snapshot's records after its trailer: %v %v", left, err)
	}
	// A later snapshot, c heard before it: c's mark is taken.
	snapS = entry.StreamID{0x5b}
	if r = mustApply(t, m, 7, snap(true, relay(1, "c", "c/3"))).Inbound; r.Err != nil || r.Applied != 1 {
		t.Fatalf("a later snapshot: %+v", r)
	}
	if h, _ := st.HWM("c", streamC); h.Index != 7 {
		t.Fatalf("c's stream after a snapshot that took its relays: %+v", h)
	}
}

// TestRebackfillAfterALoss: a's link to c was narrowed and widened, and
// the widening's backfill is done; c then loses data (a's shipper rewinds).
// A rebackfill command makes the ranges the recorded narrower filter kept
// home pending again, as a new generation; on a link whose recorded
// filters never kept anything home it changes nothing.
func TestRebackfillAfterALoss(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatKeptTombstones}})
	narrow := entry.Filter{Exclude: []string{"w/1"}}
	s := &stamper{wall: 1e15}
	mustApply(t, m, 3, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: narrow}})
	mustApply(t, m, 4, &Command{Local: []Proposal{s.put("w/1x", "v")}}) // an entry the narrowing kept home
	mustApply(t, m, 5, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true}})
	ls := m.Link("c")
	if ls.BackfillGen != 1 || len(ls.Backfill) != 1 {
		t.Fatalf("after the widening: %+v", ls)
	}
	mustApply(t, m, 6, &Command{Link: &LinkCmd{Peer: "c", BackfillDone: 1}})
	if ls := m.Link("c"); len(ls.Backfill) != 0 {
		t.Fatalf("after the backfill: %+v", ls)
	}
	lc := &LinkCmd{Peer: "c", Rebackfill: true}
	if got, err := Decode(encode(t, &Command{Link: lc})); err != nil || !got.Link.Rebackfill {
		t.Fatalf("rebackfill decoded as %+v (%v)", got.Link, err)
	}
	mustApply(t, m, 7, &Command{Link: lc})
	ls = m.Link("c")
	want := entry.Span{Start: "w/1", End: entry.PrefixEnd("w/1")}
	if ls.BackfillGen != 2 || len(ls.Backfill) != 1 || ls.Backfill[0] != want {
		t.Fatalf("after a rebackfill: generation %d, pending %+v; want 2, [%+v]", ls.BackfillGen, ls.Backfill, want)
	}
	mustApply(t, m, 8, &Command{Link: &LinkCmd{Peer: "d", SetBandwidth: true, Bandwidth: 1 << 20}})
	mustApply(t, m, 9, &Command{Link: &LinkCmd{Peer: "d", Rebackfill: true}})
	if ls := m.Link("d"); ls.BackfillGen != 0 || len(ls.Backfill) != 0 {
		t.Fatalf("a rebackfill of a link that never kept anything home: %+v", ls)
	}
}

// TestRelayWithheldByTheFilterAtApply (issue 46, seen in the robustness
// run): a snapshot relays c's write that c's filter toward this cluster
// keeps home, and the acceptor's screen did not withhold it (it saw the
// filter before the heartbeat that recorded c's filter applied). From
// format 8 the state machine leaves it out by the filter the log holds;
// before it, a node of an older build would take it (the gate).
func TestRelayWithheldByTheFilterAtApply(t *testing.T) {
	for _, format := range []uint8{FormatOriginFilters, FormatRelaysAtApply} {
		m, st := openMachine(t, t.TempDir())
		mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
		mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: format}})
		mustApply(t, m, 3, &Command{Link: &LinkCmd{Peer: "c", SetFromPeer: true, Filter: entry.Filter{Exclude: []string{"c-only/"}}}})
		at := func(i uint64) hlc.Timestamp { return hlc.Timestamp{Wall: 2e15 + int64(i)} }
		snapS := entry.StreamID{0x5c}
		relay := func(i uint64, k string) entry.Entry {
			return entry.Entry{Index: i, Origin: "b", Stream: snapS, Commit: at(1000), Stamp: at(i), StampOrigin: "c",
				Op: entry.OpSet, Key: k, Value: []byte("v")}
		}
		in := &Inbound{Sender: "b", MaxStreams: 16, HLC: at(2000), Batch: &wire.Batch{
			Header: wire.Header{Sender: "b", Stream: snapS, Snapshot: true}, Entries: []entry.Entry{relay(1, "c-only/x"), relay(2, "shared/x")}}}
		r := mustApply(t, m, 4, &Command{Inbound: in}).Inbound
		_, err := st.Get("c-only/x")
		switch {
		case r.Err != nil:
			t.Fatalf("format %d: %v", format, r.Err)
		case format >= FormatRelaysAtApply && (err == nil || r.DroppedWithheld != 1 || r.Applied != 1 || r.HWM != 2):
			t.Fatalf("format %d: the home-only relay was taken (%v) or miscounted: %+v", format, err, r)
		case format < FormatRelaysAtApply && err != nil:
			t.Fatalf("format %d: an older format must apply as its builds do: %v", format, err)
		}
		if _, err := st.Get("shared/x"); err != nil {
			t.Fatalf("format %d: the relay the filter lets cross was not taken: %v", format, err)
		}
		st.Close()
	}
}

// TestOpenStreamsRecorded: a peer's open streams (issue 51) are recorded
// as its heartbeat told them, replaced by the next, and read back after a
// reopen; recording them changes nothing else of the link.
func TestOpenStreamsRecorded(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	defer func() { st.Close() }()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: FormatOpenStreams}})
	mustApply(t, m, 3, &Command{Link: &LinkCmd{Peer: "b", SetBandwidth: true, Bandwidth: 1 << 20}})
	if got := m.Link("b").Open; got != nil {
		t.Fatalf("open streams %v before any heartbeat told them", got)
	}
	two := []entry.StreamID{{1}, {2}}
	mustApply(t, m, 4, &Command{Link: &LinkCmd{Peer: "b", SetOpen: true, Open: two}})
	if got := m.Link("b"); !slices.Equal(got.Open, two) || got.Bandwidth != 1<<20 {
		t.Fatalf("link %+v, want open streams %v and the bandwidth kept", got, two)
	}
	one := []entry.StreamID{{3}}
	mustApply(t, m, 5, &Command{Link: &LinkCmd{Peer: "b", SetOpen: true, Open: one}})
	st.Close()
	m, st = openMachine(t, dir)
	if got := m.Link("b"); !slices.Equal(got.Open, one) || got.Bandwidth != 1<<20 {
		t.Fatalf("after a reopen: link %+v, want open streams %v", got, one)
	}
}

// TestGroupsRecorded: group 0's log records the cluster's slot map once (a
// cluster of several groups), reads it back after a reopen, takes the same
// map again as a no-op and does not take another (moves are not built);
// a cluster of one group has none.
func TestGroupsRecorded(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	defer func() { st.Close() }()
	if m.Slots() != nil {
		t.Fatal("a slot map before any was recorded")
	}
	three, err := slot.Initial(3)
	if err != nil {
		t.Fatal(err)
	}
	if r := mustApply(t, m, 1, &Command{Groups: &GroupsCmd{Map: three}}); !r.Swapped {
		t.Fatal("the first slot map was not taken")
	}
	st.Close()
	m, st = openMachine(t, dir)
	if got := m.Slots(); got == nil || got.Groups != 3 || got.Owner != three.Owner || got.Gen != three.Gen {
		t.Fatalf("after a reopen: %+v", got)
	}
	if r := mustApply(t, m, 2, &Command{Groups: &GroupsCmd{Map: three}}); !r.Swapped {
		t.Fatal("the same map again was not taken")
	}
	five, _ := slot.Initial(5)
	if r := mustApply(t, m, 3, &Command{Groups: &GroupsCmd{Map: five}}); r.Swapped || m.Slots().Groups != 3 {
		t.Fatalf("another map was taken: %+v, now %d groups", r, m.Slots().Groups)
	}
}

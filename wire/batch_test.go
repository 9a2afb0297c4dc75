package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

func TestBatchRoundTrip(t *testing.T) {
	b := &Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}}, Entries: []entry.Entry{
		{Index: 7, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, Stamp: hlc.Timestamp{Wall: 9}, Op: entry.OpSet, Key: "k", Value: []byte("v")},
		{Index: 8, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 10}, Stamp: hlc.Timestamp{Wall: 4}, Op: entry.OpDelete, Key: "k"},
	}}
	got, err := DecodeBatch(EncodeBatch(b))
	if err != nil {
		t.Fatal(err)
	}
	if got.Sender != "a" || got.Stream != b.Stream || len(got.Entries) != 2 {
		t.Fatalf("%+v", got)
	}
	for i := range b.Entries {
		w, g := b.Entries[i], got.Entries[i]
		if g.Index != w.Index || g.Origin != w.Origin || g.Stream != w.Stream || g.Commit != w.Commit || g.Stamp != w.Stamp || g.Key != w.Key || string(g.Value) != string(w.Value) || g.Op != w.Op {
			t.Fatalf("entry %d: %+v vs %+v", i, g, w)
		}
	}
}

func TestDecodeBatchRefuses(t *testing.T) {
	good := EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}}})
	for name, body := range map[string][]byte{
		"empty":     {},
		"not a map": {0x91, 0x01},
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0x00),
	} {
		if _, err := DecodeBatch(body); !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}}, Entries: []entry.Entry{
		{Index: 7, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, Op: entry.OpSet, Key: "k", Value: []byte("v")}}}))
	f.Add([]byte{0x84})
	// a re-seed's last batch, requested and ending a rejoin, with a counter
	// of a component and an oversize stub
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{2}, Snapshot: true, Requested: true, Rejoin: true,
		End:   &SnapshotEnd{Stream: entry.StreamID{1}, Index: 40, Commit: hlc.Timestamp{Wall: 8, Logical: 1}},
		Marks: []Mark{{Origin: "c", Stream: entry.StreamID{3}, Index: 7, Commit: hlc.Timestamp{Wall: 5}}}}, Entries: []entry.Entry{
		{Index: 1, Origin: "a", Stream: entry.StreamID{2}, Commit: hlc.Timestamp{Wall: 9}, Op: entry.OpCounter, Key: "c",
			Ctr: &entry.PN{P: 3}, CtrComp: "b/0123456789abcdef0123456789abcdef", StampOrigin: "b"},
		{Index: 2, Origin: "a", Stream: entry.StreamID{2}, Commit: hlc.Timestamp{Wall: 9}, Op: entry.OpSet, Key: "k", Oversize: 1 << 30}}}))
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}, Rejoining: RejoinSeeding}}))
	// a filtered marker, then a batch a filter cut (range deletes in it)
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}}, Entries: []entry.Entry{
		{Index: 3, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, FilteredTo: 40},
		{Index: 41, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 10}, Op: entry.OpMulti, Ops: []entry.BatchOp{
			{Op: entry.OpSet, Key: "s/a", Value: []byte("v")}, {Op: entry.OpDeleteRange, Key: "s/", End: "s/t/"}, {Op: entry.OpDeleteRange, Key: "s/t0"}}}}}))
	// a backfill's last batch
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{2}, Snapshot: true, Backfill: true,
		BackfillEnd: &BackfillEnd{Horizon: hlc.Timestamp{Wall: 77, Logical: 2}, Spans: []entry.Span{{Start: "t/", End: "t0"}, {Start: "z"}}}},
		Entries: []entry.Entry{{Index: 1, Origin: "a", Stream: entry.StreamID{2}, Commit: hlc.Timestamp{Wall: 9}, Op: entry.OpSet, Key: "t/1", StampOrigin: "b"}}}))
	// A re-seed's first batch, beginning where its trailer will end.
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{2}, Snapshot: true,
		Begin: &SnapshotEnd{Stream: entry.StreamID{1}, Index: 5, Commit: hlc.Timestamp{Wall: 7}}}}))
	// a heartbeat telling the sender's filter, what it keeps for its other
	// links, and its idle frontier
	f.Add(EncodeBatch(&Batch{Header: heartbeatWithFilters()}))
	// nesting where the format has none, and lengths that lie
	f.Add(append([]byte{0x84, 0xa1, 'v', 0x01, 0xa7, 'e', 'n', 't', 'r', 'i', 'e', 's'}, append(bytes.Repeat([]byte{0x91}, 20000), 0xc0)...))
	f.Add(append(AppendBatchHeader(nil, "a", entry.StreamID{1}, 1), 0x81, 0xa1, 'k', 0xdb, 0x7f, 0xff, 0xff, 0xff, 'x'))
	f.Add(append(AppendBatchHeader(nil, "a", entry.StreamID{1}, 1), 0x82, 0xa1, 'i', 0x01, 0xa1, 'k', 0xdd, 0x7f, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := DecodeBatch(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error outside the refusal classes: %v", err)
			}
			return
		}
		again, err := DecodeBatch(EncodeBatch(b))
		if err != nil || len(again.Entries) != len(b.Entries) || again.Sender != b.Sender ||
			again.Snapshot != b.Snapshot || again.Requested != b.Requested || again.Rejoin != b.Rejoin ||
			again.Rejoining != b.Rejoining || (again.End == nil) != (b.End == nil) || (b.End != nil && *again.End != *b.End) ||
			again.Backfill != b.Backfill || !reflect.DeepEqual(again.BackfillEnd, b.BackfillEnd) || !reflect.DeepEqual(again.Open, b.Open) || !reflect.DeepEqual(again.Entries, b.Entries) {
			t.Fatalf("re-encoded batch differs: %v", err)
		}
	})
}

// TestDecodeBatchDeepNesting: a 4.6 MB chain of nested arrays, where the
// wire format has no nesting (in entries placed before sender and stream,
// and inside an entry), is refused as malformed: it used to be skipped
// recursively until the stack overflowed and killed the process.
func TestDecodeBatchDeepNesting(t *testing.T) {
	nest := append(bytes.Repeat([]byte{0x91}, 4600000), 0xc0) // [[[[...nil...]]]]
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.EncodeMapLen(4)
	enc.EncodeString("v")
	enc.EncodeUint(Version)
	enc.EncodeString("entries")
	buf.Write(nest)
	enc.EncodeString("sender")
	enc.EncodeString("a")
	enc.EncodeString("stream")
	enc.EncodeBytes(make([]byte, 16))
	if _, err := DecodeBatch(buf.Bytes()); !errors.Is(err, ErrMalformed) {
		t.Fatalf("nesting before sender: %v", err)
	}
	// inside an entry: the key is an array of arrays
	head := AppendBatchHeader(nil, "a", entry.StreamID{1}, 1)
	var e bytes.Buffer
	ee := msgpack.NewEncoder(&e)
	ee.EncodeMapLen(4)
	ee.EncodeString("i")
	ee.EncodeUint(1)
	ee.EncodeString("k")
	e.Write(nest)
	if _, err := DecodeBatch(append(head, e.Bytes()...)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("nesting inside an entry: %v", err)
	}
	// a length that lies: a string said to be 2 GiB in a 30-byte body
	lie := append(AppendBatchHeader(nil, "a", entry.StreamID{1}, 1), 0x81, 0xa1, 'k', 0xdb, 0x7f, 0xff, 0xff, 0xff, 'x')
	if _, err := DecodeBatch(lie); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a lying length: %v", err)
	}
}

func TestMarkerAndBackfillRoundTrip(t *testing.T) {
	b := &Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}}, Entries: []entry.Entry{
		{Index: 3, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, FilteredTo: 40}}}
	got, err := DecodeBatch(EncodeBatch(b))
	if err != nil {
		t.Fatal(err)
	}
	if e := got.Entries[0]; !e.IsMarker() || e.Index != 3 || e.Last() != 40 || e.Covers() != 38 || e.Commit.Wall != 9 {
		t.Fatalf("marker: %+v", e)
	}
	// A marker with a payload, or ending before it starts, is refused.
	for _, e := range []entry.Entry{
		{Index: 3, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, FilteredTo: 2},
		{Index: 3, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, FilteredTo: 5, Key: "k"},
	} {
		if _, err := DecodeBatch(EncodeBatch(&Batch{Header: b.Header, Entries: []entry.Entry{e}})); !errors.Is(err, ErrMalformed) {
			t.Fatalf("marker %+v: %v", e, err)
		}
	}
	// Backfill fields outside a backfill's snapshot are refused.
	bad := EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}, BackfillEnd: &BackfillEnd{Spans: []entry.Span{{Start: "a"}}}}})
	if _, err := DecodeBatch(bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a backfill end on a live batch: %v", err)
	}
}

func TestReseedBeginRoundTrip(t *testing.T) {
	at := &SnapshotEnd{Stream: entry.StreamID{1}, Index: 41, Commit: hlc.Timestamp{Wall: 9, Logical: 2}}
	h := Header{Sender: "a", Stream: entry.StreamID{7}, Snapshot: true, Begin: at}
	got, err := DecodeBatch(EncodeBatch(&Batch{Header: h}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Begin == nil || *got.Begin != *at || got.End != nil {
		t.Fatalf("begin: %+v", got.Header)
	}
	// Both in one batch (a snapshot of one batch) must agree.
	h.End = at
	if got, err := DecodeBatch(EncodeBatch(&Batch{Header: h})); err != nil || *got.End != *got.Begin {
		t.Fatalf("begin and end: %+v %v", got, err)
	}
	for name, bad := range map[string]Header{
		"on a live batch":        {Sender: "a", Stream: entry.StreamID{7}, Begin: at},
		"in its own stream":      {Sender: "a", Stream: entry.StreamID{1}, Snapshot: true, Begin: at},
		"on a backfill":          {Sender: "a", Stream: entry.StreamID{7}, Snapshot: true, Backfill: true, Begin: at},
		"differing from the end": {Sender: "a", Stream: entry.StreamID{7}, Snapshot: true, Begin: at, End: &SnapshotEnd{Stream: entry.StreamID{1}, Index: 40}},
	} {
		if _, err := DecodeBatch(EncodeBatch(&Batch{Header: bad})); !errors.Is(err, ErrMalformed) {
			t.Errorf("a begin %s: %v", name, err)
		}
	}
}

func heartbeatWithFilters() Header {
	return Header{Sender: "a", Stream: entry.StreamID{1},
		OwnFilter: &entry.Filter{Exclude: []string{"c-only/"}},
		Keeps: []TargetSpans{
			{Target: "b", Spans: []entry.Span{{Start: "c-only/", End: "c-only0"}}},
			{Target: "d", Spans: []entry.Span{{Start: "a", End: "b"}, {Start: "x"}}},
		},
		Idle: &IdleFrontier{Index: 9, Bound: hlc.Timestamp{Wall: 77}},
		Open: []entry.StreamID{{0, 5}, {1}, {2, 9}},
	}
}

// TestHeartbeatOpenStreams: a heartbeat's open streams (issue 51) decode
// as sent; a list out of order, with a stream twice, a zero stream, without
// the heartbeat's own stream, longer than MaxOpenStreams, or on a batch
// that carries entries or a snapshot is refused as malformed.
func TestHeartbeatOpenStreams(t *testing.T) {
	h := heartbeatWithFilters()
	got, err := DecodeBatch(EncodeBatch(&Batch{Header: h}))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Open, h.Open) {
		t.Fatalf("decoded open streams %v, sent %v", got.Open, h.Open)
	}
	many := make([]entry.StreamID, MaxOpenStreams+1)
	for i := range many {
		many[i] = entry.StreamID{1, byte(i)}
	}
	for name, open := range map[string][]entry.StreamID{
		"out of order":    {{2}, {1}},
		"a stream twice":  {{1}, {1}},
		"a zero stream":   {{}, {1}},
		"not its own":     {{0, 5}, {2}},
		"more than bound": many,
	} {
		bad := heartbeatWithFilters()
		bad.Open = open
		if _, err := DecodeBatch(EncodeBatch(&Batch{Header: bad})); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	withEntries := Batch{Header: Header{Sender: "a", Stream: entry.StreamID{1}, Open: []entry.StreamID{{1}}}, Entries: []entry.Entry{
		{Index: 7, Origin: "a", Stream: entry.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, Op: entry.OpSet, Key: "k", Value: []byte("v")}}}
	if _, err := DecodeBatch(EncodeBatch(&withEntries)); !errors.Is(err, ErrMalformed) {
		t.Errorf("open streams on a batch of entries: %v", err)
	}
	snap := Header{Sender: "a", Stream: entry.StreamID{1}, Snapshot: true, Open: []entry.StreamID{{1}}}
	if _, err := DecodeBatch(EncodeBatch(&Batch{Header: snap})); !errors.Is(err, ErrMalformed) {
		t.Errorf("open streams on a snapshot batch: %v", err)
	}
}

// TestHeartbeatFiltersRoundTrip: a heartbeat's filter, the ranges the
// sender keeps for its other links (issue 45) and its idle frontier decode
// as sent; keeps out of order, empty or inverted are refused, as are keeps
// on a snapshot batch.
func TestHeartbeatFiltersRoundTrip(t *testing.T) {
	h := heartbeatWithFilters()
	got, err := DecodeBatch(EncodeBatch(&Batch{Header: h}))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Keeps, h.Keeps) || got.OwnFilter == nil || !got.OwnFilter.Equal(*h.OwnFilter) || got.Idle == nil || *got.Idle != *h.Idle {
		t.Fatalf("decoded %+v, sent %+v", got.Header, h)
	}
	for name, keeps := range map[string][]TargetSpans{
		"targets out of order": {{Target: "d", Spans: []entry.Span{{Start: "a"}}}, {Target: "b", Spans: []entry.Span{{Start: "a"}}}},
		"a target twice":       {{Target: "b", Spans: []entry.Span{{Start: "a"}}}, {Target: "b", Spans: []entry.Span{{Start: "b"}}}},
		"no ranges":            {{Target: "b"}},
		"inverted range":       {{Target: "b", Spans: []entry.Span{{Start: "b", End: "a"}}}},
		"overlapping ranges":   {{Target: "b", Spans: []entry.Span{{Start: "a", End: "c"}, {Start: "b", End: "d"}}}},
		"bad target":           {{Target: "B!", Spans: []entry.Span{{Start: "a"}}}},
	} {
		bad := heartbeatWithFilters()
		bad.Keeps = keeps
		if _, err := DecodeBatch(EncodeBatch(&Batch{Header: bad})); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	snap := heartbeatWithFilters()
	snap.OwnFilter, snap.Idle, snap.Open, snap.Snapshot = nil, nil, nil, true
	if _, err := DecodeBatch(EncodeBatch(&Batch{Header: snap})); !errors.Is(err, ErrMalformed) {
		t.Errorf("keeps on a snapshot batch: %v", err)
	}
}

package transport

import (
	"errors"
	"testing"

	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

func TestBatchRoundTrip(t *testing.T) {
	b := &Batch{Header: Header{Sender: "a", Stream: wal.StreamID{1}}, Entries: []wal.Entry{
		{Index: 7, Origin: "a", Stream: wal.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, Stamp: hlc.Timestamp{Wall: 9}, Op: store.OpSet, Key: "k", Value: []byte("v")},
		{Index: 8, Origin: "a", Stream: wal.StreamID{1}, Commit: hlc.Timestamp{Wall: 10}, Stamp: hlc.Timestamp{Wall: 4}, Op: store.OpDelete, Key: "k"},
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
	good := EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: wal.StreamID{1}}})
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
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: wal.StreamID{1}}, Entries: []wal.Entry{
		{Index: 7, Origin: "a", Stream: wal.StreamID{1}, Commit: hlc.Timestamp{Wall: 9}, Op: store.OpSet, Key: "k", Value: []byte("v")}}}))
	f.Add([]byte{0x84})
	// a re-seed's last batch, requested and ending a rejoin, with a counter
	// of a component and an oversize stub
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: wal.StreamID{2}, Snapshot: true, Requested: true, Rejoin: true,
		End: &SnapshotEnd{Stream: wal.StreamID{1}, Index: 40, Commit: hlc.Timestamp{Wall: 8, Logical: 1}}}, Entries: []wal.Entry{
		{Index: 1, Origin: "a", Stream: wal.StreamID{2}, Commit: hlc.Timestamp{Wall: 9}, Op: store.OpCounter, Key: "c",
			Ctr: &store.PN{P: 3}, CtrComp: "b/0123456789abcdef0123456789abcdef", StampOrigin: "b"},
		{Index: 2, Origin: "a", Stream: wal.StreamID{2}, Commit: hlc.Timestamp{Wall: 9}, Op: store.OpSet, Key: "k", Oversize: 1 << 30}}}))
	f.Add(EncodeBatch(&Batch{Header: Header{Sender: "a", Stream: wal.StreamID{1}, Rejoining: RejoinSeeding}}))
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
			again.Rejoining != b.Rejoining || (again.End == nil) != (b.End == nil) || (b.End != nil && *again.End != *b.End) {
			t.Fatalf("re-encoded batch differs: %v", err)
		}
	})
}

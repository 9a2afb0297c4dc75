package machine

import (
	"slices"
	"testing"

	"github.com/replicator/replicator/entry"
)

// TestDeleteOfNothingWritesNothing: a delete of a key that holds no value
// here (never written, deleted already, under a range delete) writes no
// tombstone and no stream entry, decided in commit order within a group;
// a batch keeps only its deletes of live keys and its sets; a keyed delete
// is written (its answer is recorded). Before the format that says every
// member decides so, a delete of nothing writes as it did.
func TestDeleteOfNothingWritesNothing(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	del := func(k string) Proposal {
		return Proposal{Entry: entry.Entry{Op: entry.OpDelete, Key: k, Commit: s.next()}}
	}
	batch := func(ops ...entry.BatchOp) Proposal {
		return Proposal{Entry: entry.Entry{Op: entry.OpMulti, Ops: ops, Commit: s.next()}}
	}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	// Before the format, a delete of nothing still writes its tombstone
	// (a member of an older build would): the streams stay the same.
	if w := mustApply(t, m, 2, &Command{Local: []Proposal{del("before")}}).Writes[0]; w.Entry.Index == 0 {
		t.Fatalf("a delete of nothing before format %d wrote nothing: %+v", FormatDeletesOfNothing, w)
	}
	mustApply(t, m, 3, &Command{Format: &FormatCmd{Version: FormatDeletesOfNothing}})
	base := m.Outbound().Last()
	index := uint64(3)
	apply := func(ps ...Proposal) *Result {
		t.Helper()
		index++
		return mustApply(t, m, index, &Command{Local: ps})
	}

	// Never written: nothing. Written then deleted twice in one group: the
	// first delete writes, the second (the key holds a tombstone now, in
	// commit order) does not.
	res := apply(del("never"), s.put("k", "v"), del("k"), del("k"))
	w := res.Writes
	if w[0].Err != nil || w[0].Entry.Index != 0 || w[0].Existed != 0 {
		t.Fatalf("delete of a key never written: %+v", w[0])
	}
	if w[2].Entry.Index == 0 || w[2].Existed != 1 {
		t.Fatalf("delete of a live key: %+v", w[2])
	}
	if w[3].Entry.Index != 0 || w[3].Existed != 0 {
		t.Fatalf("second delete of the key in the same group: %+v", w[3])
	}
	if last := m.Outbound().Last(); last != base+2 {
		t.Fatalf("the stream holds %d entries, want %d (the put and one delete)", last, base+2)
	}
	if _, err := st.Get("never"); err == nil {
		t.Fatal("a tombstone was written for a key never written")
	}

	// Under a range delete: nothing.
	apply(s.put("r/1", "v"), Proposal{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "r/", End: "r0", Commit: s.next()}})
	before := m.Outbound().Last()
	if w := apply(del("r/1")).Writes[0]; w.Entry.Index != 0 || m.Outbound().Last() != before {
		t.Fatalf("delete under a range delete: %+v, stream %d -> %d", w, before, m.Outbound().Last())
	}

	// A batch keeps its set and its delete of a live key, drops the rest;
	// a batch of nothing but such deletes writes nothing.
	apply(s.put("live", "v"))
	w1 := apply(batch(entry.BatchOp{Op: entry.OpDelete, Key: "never2"}, entry.BatchOp{Op: entry.OpSet, Key: "s", Value: []byte("1")},
		entry.BatchOp{Op: entry.OpDelete, Key: "live"})).Writes[0]
	keys := []string{}
	for _, op := range w1.Entry.Ops {
		keys = append(keys, op.Key)
	}
	if w1.Entry.Index == 0 || !slices.Equal(keys, []string{"s", "live"}) || w1.Existed != 1 {
		t.Fatalf("batch: %+v (ops %v)", w1, keys)
	}
	before = m.Outbound().Last()
	if w := apply(batch(entry.BatchOp{Op: entry.OpDelete, Key: "never3"})).Writes[0]; w.Entry.Index != 0 || m.Outbound().Last() != before {
		t.Fatalf("a batch of deletes of nothing: %+v", w)
	}

	// Keyed: written, so that its answer is recorded.
	if w := apply(keyed(del("never4"), "idem", "fp", AnswerWrite)).Writes[0]; w.Entry.Index == 0 || w.Entry.Idem == nil {
		t.Fatalf("a keyed delete of nothing: %+v", w)
	}
}

package machine

import (
	"bytes"
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

var (
	testStream = entry.StreamID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	streamB    = entry.StreamID{0xb}
)

func openMachine(t *testing.T, dir string) (*Machine, *store.Store) {
	t.Helper()
	st, err := store.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open(st, Options{Cluster: "a"})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	return m, st
}

// stamper hands out growing commit stamps, as a leader's clock does.
type stamper struct{ wall int64 }

func (s *stamper) next() hlc.Timestamp {
	s.wall += 1000
	return hlc.Timestamp{Wall: s.wall}
}

func (s *stamper) put(key, val string) Proposal {
	return Proposal{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: []byte(val), Commit: s.next()}}
}

func (s *stamper) incr(key string, d int64) Proposal {
	return Proposal{Entry: entry.Entry{Op: entry.OpCounter, Key: key, Commit: s.next()}, Delta: d}
}

func keyed(p Proposal, key, fp string, kind AnswerKind) Proposal {
	p.Keyed = &Keyed{Key: key, Fingerprint: []byte(fp), Answer: kind, Expires: p.Entry.Commit.Wall + 1e12}
	return p
}

func encode(t testing.TB, c *Command) []byte {
	t.Helper()
	b, err := NewEncoder().Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustApply(t *testing.T, m *Machine, index uint64, c *Command) *Result {
	t.Helper()
	res, err := m.Apply(index, encode(t, c))
	if err != nil {
		t.Fatalf("apply %d: %v", index, err)
	}
	return res
}

// script is a log of commands exercising every decision: writes,
// conditions, counters, kinds, keyed retries in and across groups,
// conflicts, a stale stamp, truncation and cursors.
func script(t testing.TB) [][]byte {
	cmds := scriptCommands()
	out := make([][]byte, len(cmds))
	enc := NewEncoder()
	for i, c := range cmds {
		b, err := enc.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

// scriptCommands are script's commands as a proposer builds them.
func scriptCommands() []*Command {
	s := &stamper{wall: 1e15}
	var cmds []*Command
	local := func(ps ...Proposal) { cmds = append(cmds, &Command{Local: ps}) }
	cmds = append(cmds, &Command{Mint: &MintCmd{Stream: testStream}})
	local(s.put("x", "1"), s.put("y", "1"), s.incr("hits", 5))
	cas := s.put("x", "2")
	cas.Cond = &Condition{IfNoneMatch: true}               // refused: x holds a value
	local(cas, s.incr("hits", -2), s.put("hits", "plain")) // the last refused: a counter key
	k1 := keyed(s.incr("hits", 10), "k1", "fp1", AnswerCounter)
	k1again := keyed(s.incr("hits", 10), "k1", "fp1", AnswerCounter)
	k1other := keyed(s.incr("hits", 7), "k1", "fp-other", AnswerCounter)
	local(k1, k1again, k1other)
	local(keyed(s.incr("hits", 10), "k1", "fp1", AnswerCounter)) // a retry in a later group
	stale := s.put("z", "stale")
	stale.Entry.Commit = hlc.Timestamp{Wall: 1} // a deposed leader's stamp
	local(stale, Proposal{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "y", End: "yz", Commit: s.next()}})
	batch := Proposal{Entry: entry.Entry{Op: entry.OpMulti, Commit: s.next(),
		Ops: []entry.BatchOp{{Op: entry.OpSet, Key: "b1", Value: []byte("v")}, {Op: entry.OpDelete, Key: "x"}}}}
	local(keyed(batch, "op:o1", "fpb", AnswerBatch))
	cmds = append(cmds, &Command{Cursor: &CursorCmd{Peer: "b", At: entry.Cursor{Stream: testStream, Index: 3}}})
	cmds = append(cmds, &Command{Cursor: &CursorCmd{Peer: "b", At: entry.Cursor{Stream: testStream, Index: 2}}})
	cmds = append(cmds, &Command{Truncate: &TruncateCmd{Stream: testStream, First: 3}})
	local(s.put("late", "1"))
	// a keyed write, a range delete over it, the write's retry: the
	// record's write is superseded by the range, so the retry replays
	local(keyed(s.put("p", "v"), "kp", "fpp", AnswerWrite))
	local(Proposal{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "p", End: "q", Commit: s.next()}})
	local(keyed(s.put("p", "v"), "kp", "fpp", AnswerWrite))
	// a peer's batch, the same batch again, and one past a gap
	inbound := func(from, to uint64) *Command {
		bt := &wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}}
		for i := from; i <= to; i++ {
			ts := hlc.Timestamp{Wall: 2e15 + int64(i)}
			bt.Entries = append(bt.Entries, entry.Entry{Index: i, Origin: "b", Stream: streamB, Commit: ts, Stamp: ts,
				Op: entry.OpSet, Key: fmt.Sprintf("from-b/%d", i), Value: []byte("v")})
		}
		return &Command{Inbound: &Inbound{Sender: "b", Batch: bt, At: 1, HLC: hlc.Timestamp{Wall: 2e15 + 100},
			MaxStreams: 16, Dead: map[uint64]string{to: "over a limit"}}}
	}
	cmds = append(cmds, inbound(1, 3), inbound(1, 3), inbound(5, 6), inbound(4, 4))
	return cmds
}

// TestDecodedAppliesAsBuilt: a leader applies the commands it built, as
// built; followers and replays decode them from the log. Both must decide
// and write the same.
func TestDecodedAppliesAsBuilt(t *testing.T) {
	built := scriptCommands()
	encoded := script(t)
	m1, st1 := openMachine(t, t.TempDir())
	defer st1.Close()
	m2, st2 := openMachine(t, t.TempDir())
	defer st2.Close()
	var r1, r2 []*Result
	for i := range built {
		a, err := m1.ApplyCommand(uint64(i+1), built[i])
		if err != nil {
			t.Fatal(err)
		}
		r1 = append(r1, a)
		r2 = append(r2, mustApplyRaw(t, m2, uint64(i+1), encoded[i]))
	}
	if a, b := observe(t, m1, st1, r1), observe(t, m2, st2, r2); !reflect.DeepEqual(a, b) {
		t.Fatalf("as built:\n%+v\ndecoded:\n%+v", a, b)
	}
	for i := range r1 {
		for j := range r1[i].Writes {
			if w1, w2 := r1[i].Writes[j], r2[i].Writes[j]; !reflect.DeepEqual(w1.Entry, w2.Entry) {
				t.Fatalf("command %d write %d: as built %+v, decoded %+v", i+1, j, w1.Entry, w2.Entry)
			}
		}
	}
}

type outcome struct {
	digest   store.Digest
	hits     int64
	cursor   entry.Cursor
	first    uint64
	last     uint64
	outbound [][]byte
	results  []string
}

func observe(t *testing.T, m *Machine, st *store.Store, results []*Result) outcome {
	t.Helper()
	d, err := st.Digest()
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.Counter("hits")
	if err != nil {
		t.Fatal(err)
	}
	cur, _, err := st.Cursor("b")
	if err != nil {
		t.Fatal(err)
	}
	o := outcome{digest: d, hits: c.Value(), cursor: cur, first: m.Outbound().First(), last: m.Outbound().Last()}
	for i := o.first; i <= o.last; i++ {
		raw, err := m.Outbound().ReadRaw(i)
		if err != nil {
			t.Fatalf("outbound %d: %v", i, err)
		}
		o.outbound = append(o.outbound, raw)
	}
	for _, r := range results {
		if r.Inbound != nil {
			o.results = append(o.results, fmt.Sprintf("%+v", *r.Inbound))
		}
		for _, w := range r.Writes {
			s := fmt.Sprintf("err=%v index=%d value=%d", w.Err, w.Entry.Index, w.CounterValue)
			if w.Replay != nil {
				s += " replay=" + string(w.Replay.Body)
			}
			o.results = append(o.results, s)
		}
	}
	return o
}

func TestScriptDecisions(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	var results []*Result
	for i, c := range script(t) {
		res, err := m.Apply(uint64(i+1), c)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	w := func(cmd, p int) Write { return results[cmd].Writes[p] }
	if e := w(1, 2).Entry; e.Index != 3 || e.Ctr == nil || *e.Ctr != (entry.PN{P: 5}) || e.Stream != testStream || e.Origin != "a" {
		t.Fatalf("first increment: %+v", e)
	}
	if err := w(2, 0).Err; !errors.Is(err, ErrPrecondition) {
		t.Fatalf("If-None-Match on a live key: %v", err)
	}
	if err := w(2, 2).Err; !errors.Is(err, ErrKindConflict) {
		t.Fatalf("a plain write on a counter: %v", err)
	}
	if got := w(2, 1).CounterValue; got != 3 {
		t.Fatalf("counter after -2: %d", got)
	}
	first := w(3, 0)
	if first.Err != nil || first.CounterValue != 13 || first.Entry.Idem == nil {
		t.Fatalf("keyed increment: %+v", first)
	}
	if r := w(3, 1).Replay; r == nil || !bytes.Equal(r.Body, first.Entry.Idem.Body) {
		t.Fatalf("retry in the same group: %+v", w(3, 1))
	}
	if err := w(3, 2).Err; !errors.Is(err, ErrIdempotencyConflict) {
		t.Fatalf("another request under the key: %v", err)
	}
	if r := w(4, 0).Replay; r == nil || !bytes.Equal(r.Body, first.Entry.Idem.Body) {
		t.Fatalf("retry in a later group: %+v", w(4, 0))
	}
	if err := w(5, 0).Err; !errors.Is(err, ErrStaleStamp) {
		t.Fatalf("a stale stamp: %v", err)
	}
	if e := w(5, 1).Entry; e.Index != 6 {
		t.Fatalf("indexes stay dense past a refused write: %d", e.Index)
	}
	if c, err := st.Counter("hits"); err != nil || c.Value() != 13 {
		t.Fatalf("hits = %d (%v), want 13: 5 - 2 + 10 once", c.Value(), err)
	}
	if _, err := st.Get("z"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the stale write was stored: %v", err)
	}
	if cur, _, _ := st.Cursor("b"); cur.Index != 2 {
		t.Fatalf("cursor %d, want the last recorded, 2", cur.Index)
	}
	ob := m.Outbound()
	if ob.First() != 3 || ob.Last() != 10 {
		t.Fatalf("outbound [%d, %d], want [3, 10]", ob.First(), ob.Last())
	}
	if _, err := ob.ReadRaw(2); !errors.Is(err, entry.ErrNotKept) {
		t.Fatalf("a truncated entry: %v", err)
	}
	codec := wire.NewCodec()
	for i := ob.First(); i <= ob.Last(); i++ {
		raw, err := ob.ReadRaw(i)
		if err != nil {
			t.Fatal(err)
		}
		e, err := codec.DecodeEntry(raw, wire.Defaults{Origin: "a", Stream: testStream})
		if err != nil || e.Index != i {
			t.Fatalf("outbound %d decodes to %d: %v", i, e.Index, err)
		}
	}
	if got, want := ob.BytesAfter(ob.First()-1), int64(sizeOf(t, ob)); got != want {
		t.Fatalf("bytes after first-1 = %d, entries hold %d", got, want)
	}
	a, err := st.LocalApplied()
	if err != nil || a.Index != 10 || a.Stream != testStream {
		t.Fatalf("local applied %+v %v", a, err)
	}
	if r := results[len(results)-5].Writes[0].Replay; r == nil || !bytes.Equal(r.Body, results[len(results)-7].Writes[0].Entry.Idem.Body) {
		t.Fatalf("a retry of a write a range delete superseded: %+v", results[len(results)-5].Writes[0])
	}
	in := results[len(results)-4:]
	if r := in[0].Inbound; r == nil || r.Err != nil || r.Applied != 2 || r.DeadLettered != 1 || r.HWM != 3 {
		t.Fatalf("a peer's batch: %+v", in[0].Inbound)
	}
	if r := in[1].Inbound; r.Err != nil || r.Duplicates != 3 || r.Applied != 0 || r.HWM != 3 {
		t.Fatalf("the same batch again: %+v", r)
	}
	var gap *GapError
	if r := in[2].Inbound; !errors.As(r.Err, &gap) || gap.HWM != 3 || gap.Got != 5 {
		t.Fatalf("a batch past a gap: %+v", r)
	}
	if _, err := st.Get("from-b/5"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused batch applied: %v", err)
	}
	if r := in[3].Inbound; r.Err != nil || r.HWM != 4 || r.Applied != 0 || r.DeadLettered != 1 {
		t.Fatalf("the batch that fills the gap: %+v", r)
	}
	if h, err := st.HWMs(); err != nil || len(h) != 1 || h[0].Index != 4 || h[0].Merged != 2 || h[0].DeadLettered != 2 {
		t.Fatalf("marks %+v %v", h, err)
	}
	if dl, err := st.DeadLetters(); err != nil || len(dl) != 2 {
		t.Fatalf("dead letters %d %v", len(dl), err)
	}
	hw, _ := st.HLCHighWater()
	if hw != (hlc.Timestamp{Wall: 2e15 + 100}) {
		t.Fatalf("hlc high water %s, want the last batch's reading", hw)
	}
}

func sizeOf(t *testing.T, ob *Outbound) int {
	n := 0
	for i := ob.First(); i <= ob.Last(); i++ {
		raw, err := ob.ReadRaw(i)
		if err != nil {
			t.Fatal(err)
		}
		n += len(raw)
	}
	return n
}

// Every node applying the same log decides the same and holds the same
// bytes, whatever it applied before a restart.
func TestSameLogSameState(t *testing.T) {
	cmds := script(t)
	run := func(restartAt int) outcome {
		dir := t.TempDir()
		m, st := openMachine(t, dir)
		var results []*Result
		for i, c := range cmds {
			if i == restartAt {
				st.Close()
				m, st = openMachine(t, dir)
			}
			res, err := m.Apply(uint64(i+1), c)
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
		}
		defer st.Close()
		return observe(t, m, st, results)
	}
	want := run(-1)
	for _, at := range []int{1, 3, 5, len(cmds) - 1} {
		if got := run(at); !reflect.DeepEqual(got, want) {
			t.Fatalf("restarted before command %d: %+v\nwant %+v", at+1, got, want)
		}
	}
}

// A replay of the log after a restart changes nothing: the commands at or
// below the recorded index are skipped, the rest apply once.
func TestReplayChangesNothing(t *testing.T) {
	cmds := script(t)
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	var results []*Result
	for i, c := range cmds[:6] {
		res, err := m.Apply(uint64(i+1), c)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	st.Close()
	m, st = openMachine(t, dir)
	defer st.Close()
	if m.Applied() != 6 {
		t.Fatalf("applied %d after reopen, want 6", m.Applied())
	}
	for i, c := range cmds {
		res, err := m.Apply(uint64(i+1), c)
		if err != nil {
			t.Fatal(err)
		}
		if res.Skipped != (i < 6) {
			t.Fatalf("command %d skipped=%v", i+1, res.Skipped)
		}
		if i >= 6 {
			results = append(results, res)
		}
	}
	got := observe(t, m, st, results)

	m2, st2 := openMachine(t, t.TempDir())
	defer st2.Close()
	var once []*Result
	for i, c := range cmds {
		once = append(once, mustApplyRaw(t, m2, uint64(i+1), c))
	}
	if want := observe(t, m2, st2, once); !reflect.DeepEqual(got, want) {
		t.Fatalf("replayed:\n%+v\napplied once:\n%+v", got, want)
	}
	if got.hits != 13 {
		t.Fatalf("hits %d", got.hits)
	}
}

func mustApplyRaw(t *testing.T, m *Machine, index uint64, b []byte) *Result {
	t.Helper()
	res, err := m.Apply(index, b)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestLocalBeforeMintWritesNothing(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	res := mustApply(t, m, 1, &Command{Local: []Proposal{s.put("k", "v")}})
	if !errors.Is(res.Writes[0].Err, ErrNoStream) {
		t.Fatalf("%v", res.Writes[0].Err)
	}
	if _, err := st.Get("k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("written: %v", err)
	}
}

// A new stream starts at index 1, and increments count under its own
// component (fresh totals no max-merge of the old stream's can absorb).
func TestMintStartsAStream(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Local: []Proposal{s.put("k", "v"), s.incr("c", 2)}})
	next := entry.StreamID{9}
	notify := m.Outbound().Notify()
	mustApply(t, m, 3, &Command{Mint: &MintCmd{Stream: next, Epoch: 7}})
	select {
	case <-notify:
	default:
		t.Fatal("a new stream did not wake the readers")
	}
	res := mustApply(t, m, 4, &Command{Local: []Proposal{s.incr("c", 3)}})
	e := res.Writes[0].Entry
	if e.Stream != next || e.Index != 1 || e.CtrComp != entry.Component("a", next, 7) || *e.Ctr != (entry.PN{P: 3}) {
		t.Fatalf("first entry of the new stream: %+v", e)
	}
	if res.Writes[0].CounterValue != 5 {
		t.Fatalf("counter %d, want 5", res.Writes[0].CounterValue)
	}
	st.Close()
	m, st = openMachine(t, dir)
	defer st.Close()
	if m.Stream() != next || m.Outbound().Last() != 1 || m.Outbound().First() != 1 {
		t.Fatalf("after reopen: stream %s [%d, %d]", m.Stream(), m.Outbound().First(), m.Outbound().Last())
	}
	if _, err := st.Outbound(testStream, 2); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the sealed stream's entries stayed: %v", err)
	}
}

// A command that fails mid-batch (here a peer's batch whose second entry
// cannot be applied, after its first was merged into the batch) leaves
// nothing: the tree, the marks and the applied index stay as they were, and
// the next command at that index applies.
func TestFailedApplyChangesNothing(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	ts := hlc.Timestamp{Wall: 2e15}
	good := entry.Entry{Index: 1, Origin: "b", Stream: streamB, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: "from-b/1", Value: []byte("v")}
	stub := entry.Entry{Index: 2, Origin: "b", Stream: streamB, Commit: ts.Add(1), Stamp: ts.Add(1), Op: entry.OpSet, Key: "from-b/2", Oversize: 5 << 20}
	bad := &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: ts.Add(1),
		Batch: &wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{good, stub}}}}
	if _, err := m.Apply(2, encode(t, bad)); err == nil {
		t.Fatal("a stub that was not set aside applied")
	}
	if m.Applied() != 1 {
		t.Fatalf("applied %d after a failed command, want 1", m.Applied())
	}
	if _, err := st.Get("from-b/1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the failed batch's first entry is in the tree: %v", err)
	}
	if h, err := st.HWMs(); err != nil || len(h) != 0 {
		t.Fatalf("marks after a failed batch: %+v %v", h, err)
	}
	fixed := &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: ts.Add(1), Dead: map[uint64]string{2: "too large"},
		Batch: &wire.Batch{Header: wire.Header{Sender: "b", Stream: streamB}, Entries: []entry.Entry{good, stub}}}}
	res := mustApply(t, m, 2, fixed)
	if r := res.Inbound; r == nil || r.Err != nil || r.Applied != 1 || r.DeadLettered != 1 || r.HWM != 2 {
		t.Fatalf("the command at the same index, the stub set aside: %+v", res.Inbound)
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		c := randomCommand(rng)
		if i%2 == 1 {
			c.ID = ProposalID{Node: fmt.Sprintf("n%d", rng.IntN(9)), Process: rng.Uint64(), Seq: rng.Uint64N(1<<40) + 1}
		}
		b := encode(t, &c)
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if !reflect.DeepEqual(normalize(got), normalize(c)) {
			t.Fatalf("round trip:\n%+v\n%+v", got, c)
		}
	}
}

// normalize fills what decoding fills (an unpinned stamp is the commit).
func normalize(c Command) Command {
	for i := range c.Local {
		e := &c.Local[i].Entry
		if e.Stamp.IsZero() {
			e.Stamp = e.Commit
		}
	}
	return c
}

func randomCommand(rng *rand.Rand) Command {
	stamp := func() hlc.Timestamp {
		return hlc.Timestamp{Wall: rng.Int64N(1 << 62), Logical: rng.Uint32N(3)}
	}
	switch Kind(rng.IntN(int(kinds)-1) + 1) {
	case KindCursor:
		return Command{Cursor: &CursorCmd{Peer: "b", At: entry.Cursor{Stream: testStream, Index: rng.Uint64()}}}
	case KindTruncate:
		return Command{Truncate: &TruncateCmd{Stream: testStream, First: rng.Uint64()}}
	case KindMint:
		return Command{Mint: &MintCmd{Stream: entry.StreamID{byte(rng.IntN(255) + 1)}, Epoch: rng.Uint32()}}
	case KindCollect:
		cc := &CollectCmd{Cutoff: stamp(), IdemBefore: rng.Int64(), Max: rng.IntN(maxCollect) + 1}
		if rng.IntN(2) == 0 { // format 4: the conflict log's retention
			cc.ConflictsBefore, cc.ConflictsMaxBytes = stamp(), rng.Int64N(1<<40)+1
		}
		return Command{Collect: cc}
	case KindDeadLetter:
		return Command{DeadLetter: &DeadLetterCmd{Origin: "b", Stream: testStream, Index: rng.Uint64(), Action: DeadReplay + byte(rng.IntN(2))}}
	case KindRemoveNode:
		return Command{RemoveNode: &RemoveNodeCmd{ID: fmt.Sprintf("n%d", rng.IntN(9))}}
	case KindFormat:
		return Command{Format: &FormatCmd{Version: ReadsFormat}}
	case KindGroups:
		mp, _ := slot.Initial(1 + rng.IntN(8))
		return Command{Groups: &GroupsCmd{Map: mp}}
	}
	var ps []Proposal
	for j := rng.IntN(4); j >= 0; j-- {
		e := entry.Entry{Commit: stamp(), Key: fmt.Sprintf("k%d", rng.IntN(9))}
		p := Proposal{}
		switch rng.IntN(5) {
		case 0:
			e.Op, e.Value = entry.OpSet, []byte("v")
		case 1:
			e.Op = entry.OpDelete
		case 2:
			e.Op, e.End = entry.OpDeleteRange, e.Key+"z"
		case 3:
			e.Op, p.Delta = entry.OpCounter, rng.Int64N(100)-50
		case 4:
			e.Op, e.Key, e.Ops = entry.OpMulti, "", []entry.BatchOp{{Op: entry.OpSet, Key: "m", Value: []byte("1")}}
		}
		if rng.IntN(3) == 0 {
			e.Stamp = stamp()
		}
		p.Entry = e
		if rng.IntN(3) == 0 {
			p.Cond = &Condition{IfMatch: "1.0.a", IfNoneMatch: rng.IntN(2) == 0}
		}
		if rng.IntN(3) == 0 {
			p.Keyed = &Keyed{Key: "key", Fingerprint: []byte{1, 2}, Answer: AnswerWrite, OpID: "o", Expires: rng.Int64()}
		}
		ps = append(ps, p)
	}
	return Command{Local: ps}
}

func TestDecodeRefuses(t *testing.T) {
	good := encode(t, &Command{Truncate: &TruncateCmd{Stream: testStream, First: 5}})
	cases := map[string][]byte{
		"empty":          nil,
		"newer version":  append([]byte{9}, good[1:]...),
		"trailing bytes": append(append([]byte{}, good...), 0),
		"unknown kind":   {1, 0x92, 0x63, 0x01},
		"short":          good[:len(good)-1],
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// a proposal carrying what the machine assigns
	s := &stamper{wall: 1}
	p := s.put("k", "v")
	p.Entry.Idem = &entry.Idem{Key: "x"}
	b, err := NewEncoder().Encode(&Command{Local: []Proposal{p}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(b); err != nil {
		t.Fatalf("the encoder must drop an entry's idempotency record: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, b := range script(f) {
		f.Add(b)
	}
	f.Add(encode(f, &Command{Record: &RecordCmd{Peer: "b", Record: RecordRejoin, Expect: 1, Set: 2}}))
	f.Add(encode(f, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 5, Logical: 1}, IdemBefore: 9, Max: 100}}))
	f.Add(encode(f, &Command{DeadLetter: &DeadLetterCmd{Origin: "b", Stream: testStream, Index: 3, Action: DeadDiscard}}))
	f.Add(encode(f, &Command{RemoveNode: &RemoveNodeCmd{ID: "a3"}}))
	f.Add(encode(f, &Command{RemoveNode: &RemoveNodeCmd{ID: "a3.0badcafe", Why: 3}}))
	f.Add(encode(f, &Command{RemoveNode: &RemoveNodeCmd{ID: "a3.", Why: 2}}))
	// encoding 2: the proposal's ID, then a command; and the Format command
	f.Add(encode(f, &Command{Format: &FormatCmd{Version: 2}}))
	f.Add(encode(f, &Command{Format: &FormatCmd{Version: 3}}))
	f.Add(encode(f, &Command{Repair: &RepairCmd{Peer: "b", Versions: []wire.TreeVersion{{Key: "k", Stamp: hlc.Timestamp{Wall: 9}, Origin: "b", Value: []byte("v"), Whole: true, Ctx: []wire.ContextItem{{Origin: "a", Stamp: hlc.Timestamp{Wall: 3}}}}, {Key: "n", Counter: true, Stamp: hlc.Timestamp{Wall: 9}, Origin: "b", Whole: true, Totals: []wire.Component{{Cluster: "b", P: 2}}}}}}))
	f.Add(encode(f, &Command{Link: &LinkCmd{Peer: "c", SetFilter: true, Filter: entry.Filter{Include: []string{"shared/"}, Exclude: []string{"shared/tmp/"}}, Seed: true}}))
	// format 13: a link's compression, and peers added and removed at run time
	f.Add(encode(f, &Command{Link: &LinkCmd{Peer: "c", SetCompression: true, Compression: "zstd", Seed: true}}))
	f.Add(encode(f, &Command{Peer: &PeerCmd{Name: "c", URLs: []string{"http://c1:7400", "https://c2:7400"}, Secret: []byte("sealed")}}))
	f.Add(encode(f, &Command{Peer: &PeerCmd{Name: "c", Remove: true}}))
	f.Add(encode(f, &Command{Link: &LinkCmd{Peer: "c", SetBandwidth: true, Bandwidth: 1 << 20, BackfillDone: 3}}))
	f.Add(encode(f, &Command{Link: &LinkCmd{Peer: "c", Rebackfill: true}}))
	// format 14: the cluster's groups, a part of a batch (issue 51), and a
	// peer's open streams
	if three, err := slot.Initial(3); err == nil {
		f.Add(encode(f, &Command{Groups: &GroupsCmd{Map: three}}))
	}
	f.Add(encode(f, &Command{Inbound: &Inbound{Sender: "b", MaxStreams: 16, HLC: hlc.Timestamp{Wall: 50}, Batch: &wire.Batch{
		Header: wire.Header{Sender: "b", Stream: testStream}, Entries: []entry.Entry{
			{Index: 3, Origin: "b", Stream: testStream, Commit: hlc.Timestamp{Wall: 30}, Op: entry.OpSet, Key: "k", Value: []byte("v")}}},
		Foreign: []wire.ForeignRun{{From: 1, To: 2, Commit: hlc.Timestamp{Wall: 20}}, {From: 4, To: 9, Commit: hlc.Timestamp{Wall: 90}}}}}))
	f.Add(encode(f, &Command{Link: &LinkCmd{Peer: "c", SetOpen: true, Open: []entry.StreamID{{1}, {2, 7}}}}))
	f.Add(encode(f, &Command{Link: &LinkCmd{Peer: "c", SetFromPeer: true, Filter: entry.Filter{Exclude: []string{"t/"}},
		Onward: []entry.TargetSpans{{Target: "b", Spans: []entry.Span{{Start: "t/", End: "t0"}}}}}}))
	f.Add(encode(f, &Command{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 9}, Max: 5, Keep: []KeepRanges{
		{Peer: "b", Spans: []entry.Span{{Start: "t/", End: "t0"}}}, {Peer: "b", Origin: "c", Spans: []entry.Span{{Start: "u/"}}}}}}))
	f.Add(encode(f, &Command{ID: ProposalID{Node: "a1", Process: 7, Seq: 1}, Truncate: &TruncateCmd{Stream: testStream, First: 5}}))
	for _, c := range scriptCommands() {
		c.ID = ProposalID{Node: "a2", Process: 1 << 60, Seq: 1 << 33}
		f.Add(encode(f, c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Decode(b)
		if err != nil {
			return
		}
		again, err := NewEncoder().Encode(&c)
		if err != nil {
			t.Fatalf("a decoded command does not encode: %v", err)
		}
		c2, err := Decode(again)
		if err != nil {
			t.Fatalf("a re-encoded command does not decode: %v", err)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("decode(encode(c)) != c:\n%+v\n%+v", c, c2)
		}
	})
}

func TestOutboundReopenKeepsBounds(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	for i := 0; i < 5; i++ {
		mustApply(t, m, uint64(i+2), &Command{Local: []Proposal{s.put(fmt.Sprint(i), "v"), s.put("x", "y")}})
	}
	mustApply(t, m, 7, &Command{Truncate: &TruncateCmd{Stream: testStream, First: 4}})
	before := []int64{m.Outbound().BytesAfter(3), m.Outbound().BytesAfter(7), m.Outbound().BytesAfter(10)}
	st.Close()
	m, st = openMachine(t, dir)
	ob := m.Outbound()
	if ob.First() != 4 || ob.Last() != 10 {
		t.Fatalf("[%d, %d] after reopen, want [4, 10]", ob.First(), ob.Last())
	}
	after := []int64{ob.BytesAfter(3), ob.BytesAfter(7), ob.BytesAfter(10)}
	if !reflect.DeepEqual(before, after) || after[0] == 0 || after[2] != 0 {
		t.Fatalf("bytes after 3, 7, 10: %v before, %v after", before, after)
	}
	mustApply(t, m, 8, &Command{Truncate: &TruncateCmd{Stream: testStream, First: 100}})
	if ob.First() != 11 || ob.Last() != 10 || ob.BytesAfter(3) != 0 {
		t.Fatalf("emptied: [%d, %d], %d bytes", ob.First(), ob.Last(), ob.BytesAfter(3))
	}
	st.Close()
	m, st = openMachine(t, filepath.Clean(dir))
	if m.Outbound().First() != 11 || m.Outbound().Last() != 10 {
		t.Fatalf("emptied, reopened: [%d, %d]", m.Outbound().First(), m.Outbound().Last())
	}
	st.Close()
}

// A mint of the current stream with another epoch changes only the epoch:
// the stream goes on, increments count under fresh totals.
func TestMintNewEpoch(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Local: []Proposal{s.incr("c", 2)}})
	mustApply(t, m, 3, &Command{Mint: &MintCmd{Stream: testStream, Epoch: 5}})
	res := mustApply(t, m, 4, &Command{Local: []Proposal{s.incr("c", 3)}})
	e := res.Writes[0].Entry
	if m.Epoch() != 5 || e.Stream != testStream || e.Index != 2 || e.CtrComp != entry.Component("a", testStream, 5) || *e.Ctr != (entry.PN{P: 3}) {
		t.Fatalf("after the new epoch: epoch %d, entry %+v", m.Epoch(), e)
	}
	if res.Writes[0].CounterValue != 5 {
		t.Fatalf("counter %d", res.Writes[0].CounterValue)
	}
}

// After the log is forgotten, the next log's commands apply from index 1
// and continue the stream.
func TestForgetLog(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	s := &stamper{wall: 1e15}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Local: []Proposal{s.put("a", "1")}})
	if err := m.ForgetLog(); err != nil {
		t.Fatal(err)
	}
	st.Close()
	m, st = openMachine(t, dir)
	defer st.Close()
	if m.Applied() != 0 {
		t.Fatalf("applied %d after forgetting the log", m.Applied())
	}
	res := mustApply(t, m, 1, &Command{Local: []Proposal{s.put("b", "1")}})
	if res.Skipped || res.Writes[0].Entry.Index != 2 || res.Writes[0].Entry.Stream != testStream {
		t.Fatalf("first command of the new log: %+v", res)
	}
}

// Peer records change by compare-and-set: a change proposed from a stale
// read does nothing, and UpdateRecord reads again.
func TestPeerRecords(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	d := NewDirect(m)
	if before, err := d.UpdateRecord("b", RecordReseed, func(byte) byte { return 3 }); err != nil || before != 0 {
		t.Fatalf("set: before %d, %v", before, err)
	}
	res, err := d.Apply(&Command{Record: &RecordCmd{Peer: "b", Record: RecordReseed, Expect: 0, Set: 7}})
	if err != nil || res.Swapped {
		t.Fatalf("a change from a stale read: swapped %v, %v", res.Swapped, err)
	}
	if before, err := d.UpdateRecord("b", RecordReseed, func(f byte) byte { return f &^ 1 }); err != nil || before != 3 {
		t.Fatalf("clear a flag: before %d, %v", before, err)
	}
	if _, err := d.UpdateRecord("b", RecordRejoin, func(byte) byte { return store.RejoinSeeding }); err != nil {
		t.Fatal(err)
	}
	r, _ := st.ReseedRequests()
	j, _ := st.Rejoin()
	if r["b"] != 2 || j["b"] != store.RejoinSeeding {
		t.Fatalf("records R %v J %v", r, j)
	}
	if _, err := d.UpdateRecord("b", RecordRejoin, func(byte) byte { return 0 }); err != nil {
		t.Fatal(err)
	}
	if j, _ := st.Rejoin(); len(j) != 0 {
		t.Fatalf("a zero record stays: %v", j)
	}
}

// Collection, dead-letter decisions and node removals are commands: every
// node drops, replays and records the same, and a replay changes nothing.
func TestCollectDeadLettersAndRemovals(t *testing.T) {
	s := &stamper{wall: 3e15}
	extra := []*Command{
		{Local: []Proposal{{Entry: entry.Entry{Op: entry.OpDelete, Key: "late", Commit: s.next()}},
			keyed(s.put("kept", "v"), "kk", "fpk", AnswerWrite)}},
		{DeadLetter: &DeadLetterCmd{Origin: "b", Stream: streamB, Index: 3, Action: DeadReplay}},
		{DeadLetter: &DeadLetterCmd{Origin: "b", Stream: streamB, Index: 4, Action: DeadDiscard}},
		{DeadLetter: &DeadLetterCmd{Origin: "b", Stream: streamB, Index: 9, Action: DeadDiscard}}, // none
		// tombstones below 3e15 (the script's) and idempotency records
		// expired by 1e15+1e12+1e6 (the script's keyed writes') go
		{Collect: &CollectCmd{Cutoff: hlc.Timestamp{Wall: 3e15}, IdemBefore: 1e15 + 1e12 + 1e6, Max: 1000}},
		{RemoveNode: &RemoveNodeCmd{ID: "a3"}},
		// one incarnation of a2, replaced: a2 itself stays a member
		{RemoveNode: &RemoveNodeCmd{ID: "a2.1234abcd", Why: 2}},
	}
	cmds := script(t)
	for _, c := range extra {
		cmds = append(cmds, encode(t, c))
	}
	type seen struct {
		results                []string
		tombstones, idem, dead int
		late, fromB3, fromB4   bool
		removed, removedOther  bool
		incarnations           []byte
		digest                 store.Digest
	}
	run := func(restartAt int) seen {
		dir := t.TempDir()
		m, st := openMachine(t, dir)
		var sn seen
		for i, c := range cmds {
			if i == restartAt {
				st.Close()
				m, st = openMachine(t, dir)
				// a replay of what the tree holds changes nothing
				for j := 0; j < i; j++ {
					if res, err := m.Apply(uint64(j+1), cmds[j]); err != nil || !res.Skipped {
						t.Fatalf("replay of %d: %+v %v", j+1, res, err)
					}
				}
			}
			res, err := m.Apply(uint64(i+1), c)
			if err != nil {
				t.Fatal(err)
			}
			if i >= len(cmds)-len(extra) {
				sn.results = append(sn.results, fmt.Sprintf("collected=%d/%d found=%v", res.Collected, res.CollectedIdem, res.Found))
			}
		}
		defer st.Close()
		r, err := st.Get("late")
		sn.late = err == nil && r.Tombstone // stamped above the cutoff: kept
		_, err = st.Get("from-b/3")
		sn.fromB3 = err == nil
		_, err = st.Get("from-b/4")
		sn.fromB4 = err == nil
		dl, err := st.DeadLetters()
		if err != nil {
			t.Fatal(err)
		}
		sn.dead = len(dl)
		for _, k := range []string{"k1", "kk"} {
			if _, ok, err := st.Idem(k); err != nil {
				t.Fatal(err)
			} else if ok {
				sn.idem++
			}
		}
		why, _ := m.Removed("a3")
		other, _ := m.Removed("a2")
		sn.removed, sn.removedOther = why == 1, other != 0
		for _, id := range []string{"a2.1234abcd", "a2.ffffffff", "a2.", "a3.1234abcd"} {
			why, _ := m.Removed(id)
			sn.incarnations = append(sn.incarnations, why)
		}
		if sn.digest, err = st.Digest(); err != nil {
			t.Fatal(err)
		}
		return sn
	}
	want := run(-1)
	if !want.late || !want.fromB3 || want.fromB4 || want.dead != 0 || want.idem != 1 || !want.removed || want.removedOther ||
		!bytes.Equal(want.incarnations, []byte{2, 0, 0, 1}) {
		t.Fatalf("after the commands: %+v", want)
	}
	if want.results[4] != "collected=5/3 found=false" || want.results[1] != "collected=0/0 found=true" || want.results[3] != "collected=0/0 found=false" {
		t.Fatalf("results %v", want.results)
	}
	for _, at := range []int{len(cmds) - len(extra), len(cmds) - 3, len(cmds) - 1} {
		if got := run(at); !reflect.DeepEqual(got, want) {
			t.Fatalf("restarted before command %d:\n%+v\nwant %+v", at+1, got, want)
		}
	}
}

// TestProposalIDs: a command of encoding 2 carries its proposal's ID, read
// back whole by Decode and alone by PeekID; one of encoding 1 has none.
func TestProposalIDs(t *testing.T) {
	p := NewProposer("a1")
	q := NewProposer("a1") // the same node after a restart
	id1, id2, other := p.Next(), p.Next(), q.Next()
	if id1 == id2 || id1 == other || id1.IsZero() || id1.Seq != 1 || id2.Seq != 2 {
		t.Fatalf("ids %s %s %s", id1, id2, other)
	}
	c := &Command{ID: id2, Truncate: &TruncateCmd{Stream: testStream, First: 9}}
	b := encode(t, c)
	if b[0] != commandV2 {
		t.Fatalf("encoding %d", b[0])
	}
	if got, ok := PeekID(b); !ok || got != id2 {
		t.Fatalf("peek: %v %v", got, ok)
	}
	d, err := Decode(b)
	if err != nil || d.ID != id2 || d.Truncate == nil || *d.Truncate != *c.Truncate {
		t.Fatalf("decode: %+v %v", d, err)
	}
	c.ID = ProposalID{}
	b = encode(t, c)
	if _, ok := PeekID(b); ok || b[0] != commandV1 {
		t.Fatalf("a command without an id: encoding %d, peek %v", b[0], ok)
	}
	if _, err := NewEncoder().Encode(&Command{Truncate: c.Truncate, Mint: &MintCmd{Stream: testStream}}); err == nil {
		t.Fatal("a command of two kinds encoded")
	}
}

// TestFormatCommand: the log's command encoding moves only through a
// Format command, is kept in the tree (a reopen, and a snapshot's tree,
// have it), and never goes back. A machine playing a build before encoding
// 2 refuses both the Format command and a command of encoding 2, as such a
// build does.
func TestFormatCommand(t *testing.T) {
	dir := t.TempDir()
	m, st := openMachine(t, dir)
	if m.Format() != 1 {
		t.Fatalf("a new machine at format %d", m.Format())
	}
	mustApply(t, m, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	mustApply(t, m, 2, &Command{Format: &FormatCmd{Version: 2}})
	if m.Format() != 2 {
		t.Fatalf("format %d after the Format command", m.Format())
	}
	id := NewProposer("a1").Next()
	s := &stamper{wall: 1e15}
	res := mustApply(t, m, 3, &Command{ID: id, Local: []Proposal{s.put("k", "v")}})
	if res.Writes[0].Entry.Index != 1 {
		t.Fatalf("a command of encoding 2: %+v", res.Writes[0])
	}
	st.Close()
	m, st = openMachine(t, dir)
	if m.Format() != 2 {
		t.Fatalf("format %d after a reopen", m.Format())
	}
	st.Close()

	old, err := store.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	om, err := Open(old, Options{Cluster: "a", ReadsFormat: 1})
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, om, 1, &Command{Mint: &MintCmd{Stream: testStream}})
	if _, err := om.Apply(2, encode(t, &Command{Format: &FormatCmd{Version: 2}})); !errors.Is(err, ErrMalformed) {
		t.Fatalf("an old build took the Format command: %v", err)
	}
	if _, err := om.Apply(2, encode(t, &Command{ID: id, Local: []Proposal{s.put("k", "v")}})); !errors.Is(err, ErrMalformed) {
		t.Fatalf("an old build took a command of encoding 2: %v", err)
	}
	mustApply(t, om, 2, &Command{Local: []Proposal{s.put("k", "v")}})
}

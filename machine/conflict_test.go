package machine

import (
	"sort"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// conflictCluster is one cluster's machine at format 4, with what it wrote
// (its stream's entries, as peers receive them) and what it applied of a
// peer's stream.
type conflictCluster struct {
	t      *testing.T
	name   string
	m      *Machine
	st     *store.Store
	index  uint64
	stamps *stamper
	out    []entry.Entry
	hwm    map[string]uint64
}

func newConflictCluster(t *testing.T, name string, stream entry.StreamID, wall int64) *conflictCluster {
	return newConflictClusterOn(t, name, stream, wall, nil)
}

// newConflictClusterOn is newConflictCluster on a store opened with opts.
func newConflictClusterOn(t *testing.T, name string, stream entry.StreamID, wall int64, opts *store.Options) *conflictCluster {
	st, err := store.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := Open(st, Options{Cluster: name})
	if err != nil {
		t.Fatal(err)
	}
	c := &conflictCluster{t: t, name: name, m: m, st: st, stamps: &stamper{wall: wall}, hwm: map[string]uint64{}}
	c.apply(&Command{Mint: &MintCmd{Stream: stream}})
	c.apply(&Command{Format: &FormatCmd{Version: FormatConflicts}})
	return c
}

func (c *conflictCluster) apply(cmd *Command) *Result {
	c.t.Helper()
	c.index++
	return mustApply(c.t, c.m, c.index, cmd)
}

func (c *conflictCluster) put(key, val string) {
	c.t.Helper()
	res := c.apply(&Command{Local: []Proposal{c.stamps.put(key, val)}})
	if w := res.Writes[0]; w.Err != nil {
		c.t.Fatal(w.Err)
	}
	c.out = append(c.out, res.Writes[0].Entry)
}

// ship applies every entry of from's stream that c has not yet, in one
// batch; again re-sends them all (a redelivery).
func (c *conflictCluster) ship(from *conflictCluster, again bool) *InboundResult {
	c.t.Helper()
	start := c.hwm[from.name]
	if again {
		start = 0
	}
	var ents []entry.Entry
	for _, e := range from.out {
		if e.Index > start {
			ents = append(ents, e)
		}
		// The clock observes what arrives (the HLC's receive rule).
		c.stamps.wall = max(c.stamps.wall, e.Commit.Wall)
	}
	if len(ents) == 0 {
		return &InboundResult{}
	}
	bt := &wire.Batch{Header: wire.Header{Sender: from.name, Stream: from.m.Stream()}, Entries: ents}
	res := c.apply(&Command{Inbound: &Inbound{Sender: from.name, Batch: bt, At: 1, HLC: c.stamps.next(), MaxStreams: 16}})
	if res.Inbound.Err != nil {
		c.t.Fatal(res.Inbound.Err)
	}
	c.hwm[from.name] = res.Inbound.HWM
	return res.Inbound
}

// log is the conflict log as key -> "loser>winner" of the values.
func (c *conflictCluster) log() map[string][]entry.Conflict {
	c.t.Helper()
	all, next, err := c.st.Conflicts(store.ConflictQuery{Limit: 1000})
	if err != nil || next != "" {
		c.t.Fatalf("conflicts: %v (next %q)", err, next)
	}
	out := map[string][]entry.Conflict{}
	for _, r := range all {
		out[r.Key] = append(out[r.Key], r)
	}
	return out
}

// TestConflictLog: two clusters write while cut off from each other (keys on
// both sides, one written three times on one side, keys on one side only),
// then exchange their streams: both logs hold exactly the keys written on
// both sides, each once, with the same loser and winner at both, the
// loser's value kept. A sequential overwrite across the clusters logs
// nothing, and a redelivered batch logs nothing twice.
func TestConflictLog(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	b := newConflictCluster(t, "b", entry.StreamID{0xb}, 1e15+500)

	a.put("both1", "a1") // b's later write wins
	b.put("both1", "b1")
	b.put("both2", "b1") // a's last of three wins
	a.put("both2", "a1")
	a.put("both2", "a2")
	a.put("both2", "a3")
	a.put("only-a", "a")
	b.put("only-b", "b")
	b.put("both3", "b-first") // b's only write loses to a's
	a.put("both3", "a-later")

	ra := a.ship(b, false)
	rb := b.ship(a, false)
	for _, c := range []*conflictCluster{a, b} {
		lg := c.log()
		keys := make([]string, 0, len(lg))
		for k := range lg {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) != 3 || keys[0] != "both1" || keys[1] != "both2" || keys[2] != "both3" {
			t.Fatalf("%s logged %v, want both1, both2, both3", c.name, keys)
		}
		want := map[string][2]string{"both1": {"a1", "b"}, "both2": {"b1", "a"}, "both3": {"b-first", "a"}}
		for k, w := range want {
			if len(lg[k]) != 1 {
				t.Fatalf("%s: %d records of %s: %+v", c.name, len(lg[k]), k, lg[k])
			}
			r := lg[k][0]
			if string(r.LoserValue) != w[0] || r.Winner.Origin != w[1] || r.Possible || r.ID != entry.ConflictID(k, r.Loser, r.Winner) {
				t.Fatalf("%s: %s logged %+v, want loser %q beaten by %s's write", c.name, k, r, w[0], w[1])
			}
		}
	}
	if ra.Conflicts+rb.Conflicts < 3 {
		t.Fatalf("conflicts counted %d and %d", ra.Conflicts, rb.Conflicts)
	}
	ids := func(c *conflictCluster) map[string]bool {
		m := map[string]bool{}
		for _, rs := range c.log() {
			for _, r := range rs {
				m[r.ID] = true
			}
		}
		return m
	}
	ia, ib := ids(a), ids(b)
	for id := range ia {
		if !ib[id] {
			t.Fatalf("conflict %s logged at a, not at b: %v vs %v", id, ia, ib)
		}
	}

	// Sequential: a writes, b has it, b overwrites, a has that.
	a.put("seq", "a")
	b.ship(a, false)
	b.put("seq", "b")
	a.ship(b, false)
	if lg := a.log(); len(lg["seq"]) != 0 {
		t.Fatalf("a sequential overwrite was logged: %+v", lg["seq"])
	}
	if lg := b.log(); len(lg["seq"]) != 0 {
		t.Fatalf("a sequential overwrite was logged at b: %+v", lg["seq"])
	}

	// Redelivery of everything b ever sent logs nothing more.
	before := len(ids(a))
	if r := a.ship(b, true); r.Conflicts != 0 {
		t.Fatalf("a redelivered batch logged %d conflicts", r.Conflicts)
	}
	if n := len(ids(a)); n != before {
		t.Fatalf("%d records after a redelivery, %d before", n, before)
	}
}

// TestConflictRetention: the log's collection drops records older than
// the cutoff, then the oldest while the log is over its byte bound, and
// counts them; the figures follow every record in and out.
func TestConflictRetention(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	b := newConflictCluster(t, "b", entry.StreamID{0xb}, 1e15+500)
	for i := 0; i < 6; i++ {
		a.put(string(rune('k'+i)), "a")
		b.put(string(rune('k'+i)), "b")
		a.ship(b, false) // one batch per conflict: each logged at its own time
	}
	st, err := a.st.ConflictStats()
	if err != nil || st.Records != 6 || st.Bytes <= 0 {
		t.Fatalf("stats after 6 conflicts: %+v %v", st, err)
	}
	recs, _, _ := a.st.Conflicts(store.ConflictQuery{})
	times := make([]hlc.Timestamp, 0, len(recs))
	for _, r := range recs {
		times = append(times, r.At)
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Less(times[j]) })
	// Older than the third record's time: two go.
	res := a.apply(&Command{Collect: &CollectCmd{Max: 100, ConflictsBefore: times[2]}})
	if res.CollectedConflicts != 2 {
		t.Fatalf("collected %d by age, want 2", res.CollectedConflicts)
	}
	// A bound of about two records: the oldest two of the four left go.
	per := st.Bytes / 6
	res = a.apply(&Command{Collect: &CollectCmd{Max: 100, ConflictsMaxBytes: 2*per + per/2}})
	if res.CollectedConflicts != 2 {
		t.Fatalf("collected %d by size, want 2", res.CollectedConflicts)
	}
	st, err = a.st.ConflictStats()
	if err != nil || st.Records != 2 || st.Dropped != 4 || st.Bytes != 2*per {
		t.Fatalf("stats after retention: %+v %v (a record: %d bytes)", st, err, per)
	}
	left, _, _ := a.st.Conflicts(store.ConflictQuery{})
	for _, r := range left {
		if r.At.Less(times[4]) {
			t.Fatalf("an older record was kept: %+v", r)
		}
	}
}

// TestConflictWithoutContext: a winner from a peer that sends no context
// is logged as a possible conflict; equal values are not a conflict.
func TestConflictWithoutContext(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	a.put("k", "a")
	a.put("same", "v")
	ts := hlc.Timestamp{Wall: 2e15}
	bt := &wire.Batch{Header: wire.Header{Sender: "b", Stream: entry.StreamID{0xb}}, Entries: []entry.Entry{
		{Index: 1, Origin: "b", Stream: entry.StreamID{0xb}, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: "k", Value: []byte("b")},
		{Index: 2, Origin: "b", Stream: entry.StreamID{0xb}, Commit: ts.Add(1), Stamp: ts.Add(1), Op: entry.OpSet, Key: "same", Value: []byte("v")},
	}}
	res := a.apply(&Command{Inbound: &Inbound{Sender: "b", Batch: bt, At: 1, HLC: ts.Add(2), MaxStreams: 16}})
	if res.Inbound.Err != nil || res.Inbound.Conflicts != 1 {
		t.Fatalf("inbound: %+v", res.Inbound)
	}
	lg := a.log()
	if len(lg["k"]) != 1 || !lg["k"][0].Possible || lg["k"][0].Incoming || string(lg["k"][0].LoserValue) != "a" {
		t.Fatalf("k: %+v", lg["k"])
	}
	if len(lg["same"]) != 0 {
		t.Fatalf("equal values logged: %+v", lg["same"])
	}
}

// TestConflictThreeClusters: three concurrent versions of a key, delivered
// to each cluster in a different order, leave the same records under the
// same IDs everywhere (each loser against the final winner); a version
// written after seeing another, delivered before it to a third cluster, is
// no conflict there.
func TestConflictThreeClusters(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	b := newConflictCluster(t, "b", entry.StreamID{0xb}, 1e15+300)
	c := newConflictCluster(t, "c", entry.StreamID{0xc}, 1e15+600)
	a.put("k", "x")
	b.put("k", "y")
	c.put("k", "z") // the newest: wins everywhere
	a.ship(b, false)
	a.ship(c, false)
	b.ship(c, false)
	b.ship(a, false)
	c.ship(a, false)
	c.ship(b, false)
	want := ""
	for _, cl := range []*conflictCluster{a, b, c} {
		recs := cl.log()["k"]
		sort.Slice(recs, func(i, j int) bool { return recs[i].ID < recs[j].ID })
		got := ""
		for _, r := range recs {
			got += r.ID + ":" + string(r.LoserValue) + ">" + r.Winner.Origin + " "
		}
		if len(recs) != 2 || recs[0].Winner.Origin != "c" || recs[1].Winner.Origin != "c" {
			t.Fatalf("%s logged %s, want x and y lost to c's z", cl.name, got)
		}
		if want == "" {
			want = got
		} else if got != want {
			t.Fatalf("%s logged %s, a logged %s", cl.name, got, want)
		}
	}

	// Sequential through b, reordered at c: a writes, b sees it and
	// overwrites, c gets b's version first and a's after.
	a.put("s", "a")
	b.ship(a, false)
	b.put("s", "b")
	c.ship(b, false)
	c.ship(a, false)
	if recs := c.log()["s"]; len(recs) != 0 {
		t.Fatalf("a sequential overwrite delivered out of order was logged: %+v", recs)
	}
}

// TestRangeDeleteDiscardsCounted: a peer's range delete over live keys it
// had not seen logs no record per key; the batch counts it once.
func TestRangeDeleteDiscardsCounted(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	a.put("r/1", "a")
	a.put("r/2", "a")
	ts := hlc.Timestamp{Wall: 2e15}
	bt := &wire.Batch{Header: wire.Header{Sender: "b", Stream: entry.StreamID{0xb}}, Entries: []entry.Entry{
		{Index: 1, Origin: "b", Stream: entry.StreamID{0xb}, Commit: ts, Stamp: ts, Op: entry.OpDeleteRange, Key: "r/", End: "r0"},
	}}
	res := a.apply(&Command{Inbound: &Inbound{Sender: "b", Batch: bt, At: 1, HLC: ts.Add(1), MaxStreams: 16}})
	if res.Inbound.Err != nil || res.Inbound.RangeDiscards != 1 || res.Inbound.Conflicts != 0 {
		t.Fatalf("inbound: %+v", res.Inbound)
	}
	if lg := a.log(); len(lg) != 0 {
		t.Fatalf("a range delete's discards were logged per key: %+v", lg)
	}
	// A third cluster's write of a key of the range, older than the range
	// delete, arrives after it: the range delete discards it too, and it is
	// not logged (the keys' tombstones, written by the range, have no
	// context: it was logged as a possible conflict).
	old := hlc.Timestamp{Wall: 15e14}
	ct := &wire.Batch{Header: wire.Header{Sender: "c", Stream: entry.StreamID{0xc}}, Entries: []entry.Entry{
		{Index: 1, Origin: "c", Stream: entry.StreamID{0xc}, Commit: old, Stamp: old, Op: entry.OpSet, Key: "r/1", Value: []byte("c"),
			Ctx: entry.Context{{Origin: "c", HLC: old}}},
	}}
	res = a.apply(&Command{Inbound: &Inbound{Sender: "c", Batch: ct, At: 1, HLC: ts.Add(2), MaxStreams: 16}})
	if res.Inbound.Err != nil || res.Inbound.Conflicts != 0 {
		t.Fatalf("inbound from c: %+v", res.Inbound)
	}
	if lg := a.log(); len(lg) != 0 {
		t.Fatalf("a write discarded by a range delete was logged: %+v", lg)
	}
}

// TestConflictValueBound: the inbound command's value bound decides what a
// record keeps of the loser's value (whole, or its length and hash), the
// same on every node since it rides in the log.
func TestConflictValueBound(t *testing.T) {
	a := newConflictCluster(t, "a", entry.StreamID{0xa}, 1e15)
	a.put("small", "ab")
	a.put("big", "abcdef")
	ts := hlc.Timestamp{Wall: 2e15}
	ctx := func(ts hlc.Timestamp) entry.Context { return entry.Context{{Origin: "b", HLC: ts}} }
	bt := &wire.Batch{Header: wire.Header{Sender: "b", Stream: entry.StreamID{0xb}}, Entries: []entry.Entry{
		{Index: 1, Origin: "b", Stream: entry.StreamID{0xb}, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: "small", Value: []byte("b"), Ctx: ctx(ts)},
		{Index: 2, Origin: "b", Stream: entry.StreamID{0xb}, Commit: ts.Add(1), Stamp: ts.Add(1), Op: entry.OpSet, Key: "big", Value: []byte("b"), Ctx: ctx(ts.Add(1))},
	}}
	res := a.apply(&Command{Inbound: &Inbound{Sender: "b", Batch: bt, At: 1, HLC: ts.Add(2), MaxStreams: 16, ConflictValueMax: 4}})
	if res.Inbound.Err != nil || res.Inbound.Conflicts != 2 {
		t.Fatalf("inbound: %+v", res.Inbound)
	}
	lg := a.log()
	if r := lg["small"]; len(r) != 1 || string(r[0].LoserValue) != "ab" {
		t.Fatalf("small: %+v", r)
	}
	if r := lg["big"]; len(r) != 1 || r[0].LoserValue != nil || r[0].LoserLen != 6 || len(r[0].LoserHash) != 32 {
		t.Fatalf("big: %+v", r)
	}
}

// TestConflictRecordSurvivesAnotherOriginsClaim (issue 46): a peer's write
// whose context claims it saw the loser of a record, and not its winner (a
// third cluster's), does not erase the record of the lost write: only the
// loser's own line moving on does. The record stays as it was.
func TestConflictRecordSurvivesAnotherOriginsClaim(t *testing.T) {
	a := newClaimsCluster(t, "a", entry.StreamID{0xa}, 1e15)
	c := newClaimsCluster(t, "c", entry.StreamID{0xc}, 1e15+300)
	b := newClaimsCluster(t, "b", entry.StreamID{0xb}, 1e15+600)
	a.put("k", "a's, lost")
	c.put("k", "c's, wins")
	a.ship(c, false)
	recs := a.log()["k"]
	if len(recs) != 1 || string(recs[0].LoserValue) != "a's, lost" {
		t.Fatalf("before: %+v", recs)
	}
	loser := recs[0].Loser
	// b's write, its context forged: it claims a's lost write, and not
	// c's winner.
	b.put("k", "b's, claiming")
	forged := &b.out[len(b.out)-1]
	forged.Ctx = entry.Context{{Origin: "a", HLC: loser.HLC}, {Origin: "b", HLC: forged.LWW().HLC}}
	a.ship(b, false)
	recs = a.log()["k"]
	kept := false
	for _, r := range recs {
		if r.Loser == loser {
			kept = string(r.LoserValue) == "a's, lost"
		}
	}
	if !kept {
		t.Fatalf("another origin's claim erased the record of a's lost write: %+v", recs)
	}

	// The loser's own line moving on does retire it: a writes again,
	// having seen only its own lost version, and e learns of it after c's
	// winner; a's new write loses too, and is the one recorded.
	a2 := newClaimsCluster(t, "a", entry.StreamID{0xa}, 1e15)
	c2 := newClaimsCluster(t, "c", entry.StreamID{0xc}, 1e15+5000)
	e := newClaimsCluster(t, "e", entry.StreamID{0xe}, 1e15+9000)
	a2.put("k", "a's, lost")
	a2.put("k", "a's again")
	c2.put("k", "c's, wins")
	all := a2.out
	a2.out = all[:1]
	e.ship(a2, false)
	e.ship(c2, false)
	if recs := e.log()["k"]; len(recs) != 1 || string(recs[0].LoserValue) != "a's, lost" {
		t.Fatalf("e logged %+v, want a's write lost to c's", recs)
	}
	a2.out = all
	e.ship(a2, false)
	recs = e.log()["k"]
	if len(recs) != 1 || string(recs[0].LoserValue) != "a's again" {
		t.Fatalf("after a's own line moved on, e logged %+v, want only a's newer write as lost", recs)
	}
}

// newClaimsCluster is a conflict cluster at FormatConflictClaims.
func newClaimsCluster(t *testing.T, name string, stream entry.StreamID, wall int64) *conflictCluster {
	c := newConflictCluster(t, name, stream, wall)
	c.apply(&Command{Format: &FormatCmd{Version: FormatConflictClaims}})
	return c
}

package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

func openTest(t testing.TB) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func st(wall int64, logical uint32, origin string) entry.Stamp {
	return entry.Stamp{HLC: hlc.Timestamp{Wall: wall, Logical: logical}, Origin: origin}
}

func TestMergeOutcomes(t *testing.T) {
	s := openTest(t)
	steps := []struct {
		name string
		w    Write
		want entry.Outcome
		// expected state after the step
		value     string
		tombstone bool
		stamp     entry.Stamp
	}{
		{"first write", Write{Key: "k", Value: []byte("v1"), Stamp: st(10, 0, "a")}, entry.Applied, "v1", false, st(10, 0, "a")},
		{"equal stamp is a duplicate", Write{Key: "k", Value: []byte("v1"), Stamp: st(10, 0, "a")}, entry.Duplicate, "v1", false, st(10, 0, "a")},
		{"lower stamp is stale", Write{Key: "k", Value: []byte("old"), Stamp: st(9, 5, "z")}, entry.Stale, "v1", false, st(10, 0, "a")},
		{"origin breaks a tie", Write{Key: "k", Value: []byte("fromB"), Stamp: st(10, 0, "b")}, entry.Applied, "fromB", false, st(10, 0, "b")},
		{"older tombstone loses", Write{Key: "k", Tombstone: true, Stamp: st(10, 0, "a")}, entry.Stale, "fromB", false, st(10, 0, "b")},
		{"newer tombstone wins", Write{Key: "k", Tombstone: true, Stamp: st(11, 0, "a")}, entry.Applied, "", true, st(11, 0, "a")},
		{"duplicate tombstone", Write{Key: "k", Tombstone: true, Stamp: st(11, 0, "a")}, entry.Duplicate, "", true, st(11, 0, "a")},
		{"older value stays deleted", Write{Key: "k", Value: []byte("zombie"), Stamp: st(10, 9, "c")}, entry.Stale, "", true, st(11, 0, "a")},
		{"newer value after tombstone", Write{Key: "k", Value: []byte("v2"), Stamp: st(11, 1, "a")}, entry.Applied, "v2", false, st(11, 1, "a")},
		{"tombstone for a key never stored", Write{Key: "never", Tombstone: true, Stamp: st(5, 0, "a")}, entry.Applied, "", true, st(5, 0, "a")},
	}
	for _, step := range steps {
		got, err := s.Merge(step.w)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got != step.want {
			t.Fatalf("%s: outcome %s, want %s", step.name, got, step.want)
		}
		r, err := s.Get(step.w.Key)
		if err != nil {
			t.Fatalf("%s: get: %v", step.name, err)
		}
		if string(r.Value) != step.value || r.Tombstone != step.tombstone || r.Stamp != step.stamp {
			t.Fatalf("%s: stored %q tombstone=%v %s, want %q tombstone=%v %s",
				step.name, r.Value, r.Tombstone, r.Stamp, step.value, step.tombstone, step.stamp)
		}
	}
	if _, err := s.Get("absent"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent key: %v", err)
	}
}

// TestMergeOrderIndependence applies the same writes in many orders, some
// delivered twice, and demands one digest: the property that makes clusters
// converge however replication interleaves.
func TestMergeOrderIndependence(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	origins := []string{"a", "b", "c"}
	var writes []Write
	for i := 0; i < 300; i++ {
		w := Write{
			Key:   fmt.Sprintf("k%02d", r.IntN(20)),
			Stamp: st(int64(r.IntN(50)), uint32(r.IntN(3)), origins[r.IntN(3)]),
		}
		if r.IntN(4) == 0 {
			w.Tombstone = true
		} else {
			w.Value = []byte(fmt.Sprintf("v%d", i))
		}
		writes = append(writes, w)
	}
	// Equal stamps are the same write by contract; drop later ones that reuse
	// a stamp on the same key with other content.
	seen := map[string]bool{}
	uniq := writes[:0]
	for _, w := range writes {
		id := w.Key + "/" + w.Stamp.String()
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, w)
		}
	}
	writes = uniq

	var want Digest
	for round := 0; round < 6; round++ {
		s := openTest(t)
		order := r.Perm(len(writes))
		b := s.NewBatch()
		for n, i := range order {
			if _, err := b.Merge(writes[i]); err != nil {
				t.Fatal(err)
			}
			if n%7 == 0 { // duplicate delivery
				if out, err := b.Merge(writes[i]); err != nil || out == entry.Applied {
					t.Fatalf("re-merge of the same write: %s %v", out, err)
				}
			}
			if n%50 == 49 { // commit in several batches, reading across them
				if err := b.Commit(false); err != nil {
					t.Fatal(err)
				}
				b.Close()
				b = s.NewBatch()
			}
		}
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
		b.Close()
		d, err := s.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			want = d
			if d.Keys == 0 {
				t.Fatal("no live keys: the test would prove nothing")
			}
			continue
		}
		if d.Hash != want.Hash || d.Keys != want.Keys || d.Tombstones != want.Tombstones {
			t.Fatalf("seed %d round %d: digest %+v, want %+v", seed, round, d, want)
		}
	}
}

func TestDigestDistinguishesState(t *testing.T) {
	mk := func(ws ...Write) Digest {
		s := openTest(t)
		for _, w := range ws {
			if _, err := s.Merge(w); err != nil {
				t.Fatal(err)
			}
		}
		d, err := s.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := mk(Write{Key: "a", Value: []byte("1"), Stamp: st(1, 0, "a")})
	for name, d := range map[string]Digest{
		"other value":        mk(Write{Key: "a", Value: []byte("2"), Stamp: st(1, 0, "a")}),
		"other stamp":        mk(Write{Key: "a", Value: []byte("1"), Stamp: st(2, 0, "a")}),
		"other origin":       mk(Write{Key: "a", Value: []byte("1"), Stamp: st(1, 0, "b")}),
		"other key":          mk(Write{Key: "b", Value: []byte("1"), Stamp: st(1, 0, "a")}),
		"key/value boundary": mk(Write{Key: "a1", Value: []byte(""), Stamp: st(1, 0, "a")}),
	} {
		if d.Hash == base.Hash {
			t.Errorf("%s: same digest as the base state", name)
		}
	}
	withTomb := mk(Write{Key: "a", Value: []byte("1"), Stamp: st(1, 0, "a")}, Write{Key: "z", Tombstone: true, Stamp: st(3, 0, "a")})
	if withTomb.Hash != base.Hash || withTomb.Tombstones != 1 || withTomb.Keys != 1 {
		t.Errorf("tombstones must stay out of the hash but be counted: %+v vs %+v", withTomb, base)
	}
}

// TestDigestOfSeveralStores: keys spread over three stores (a cluster's
// raft groups) digest as one store holding them all does, tombstones
// counted and out of the hash; keys spread otherwise digest the same.
func TestDigestOfSeveralStores(t *testing.T) {
	one := openTest(t)
	parts := []*Store{openTest(t), openTest(t), openTest(t)}
	for i := 0; i < 50; i++ {
		w := Write{Key: fmt.Sprintf("k%02d", i), Value: []byte{byte(i)}, Stamp: st(int64(i+1), 0, "a"), Tombstone: i%7 == 0}
		for _, s := range []*Store{one, parts[(i*7)%3]} {
			if _, err := s.Merge(w); err != nil {
				t.Fatal(err)
			}
		}
	}
	want, err := one.Digest()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DigestOf(parts, nil)
	if err != nil || got != want {
		t.Fatalf("three stores digest as %+v (%v), one holding their keys as %+v", got, err, want)
	}
	if got, _ := DigestOf(parts, []string{"k1"}); got.Keys != 9 {
		t.Fatalf("under k1: %+v, want 9 live keys", got)
	}
	other, _ := DigestOf(parts[:2], nil)
	if other.Hash == want.Hash {
		t.Fatal("two of the three stores digest as all three")
	}
}

func TestScan(t *testing.T) {
	s := openTest(t)
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("p/%02d", i)
		if _, err := s.Set(k, []byte(k), st(int64(i+1), 0, "a")); err != nil {
			t.Fatal(err)
		}
	}
	s.Set("q/x", []byte("x"), st(100, 0, "a"))
	s.Set("o", []byte("o"), st(100, 0, "a"))
	s.Delete("p/05", st(200, 0, "a"))
	keys := func(items []Item) []string {
		var ks []string
		for _, it := range items {
			ks = append(ks, it.Key)
		}
		return ks
	}
	tests := []struct {
		name  string
		o     ScanOptions
		first string
		n     int
		next  string
	}{
		{"prefix skips tombstones", ScanOptions{Prefix: "p/", Limit: 1000}, "p/00", 29, ""},
		{"range", ScanOptions{Start: "p/10", End: "p/20"}, "p/10", 10, ""},
		{"limit gives next", ScanOptions{Prefix: "p/", Limit: 4}, "p/00", 4, "p/03"},
		{"after resumes", ScanOptions{Prefix: "p/", After: "p/03", Limit: 2}, "p/04", 2, "p/06"},
		{"everything", ScanOptions{Limit: 1000}, "o", 31, ""},
		{"empty range", ScanOptions{Start: "z", End: "a"}, "", 0, ""},
	}
	for _, tc := range tests {
		items, next, err := s.Scan(tc.o)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		ks := keys(items)
		if len(ks) != tc.n || (tc.n > 0 && ks[0] != tc.first) || next != tc.next {
			t.Fatalf("%s: got %v next %q; want %d keys from %q, next %q", tc.name, ks, next, tc.n, tc.first, tc.next)
		}
	}
	// Paging through with After visits every live key exactly once.
	var all []string
	after := ""
	for {
		items, next, err := s.Scan(ScanOptions{After: after, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, keys(items)...)
		if next == "" {
			break
		}
		after = next
	}
	if len(all) != 31 {
		t.Fatalf("paged scan saw %d keys, want 31", len(all))
	}
}

func TestCollectTombstones(t *testing.T) {
	s := openTest(t)
	s.Delete("old", st(10, 0, "a"))
	s.Delete("young", st(100, 0, "a"))
	s.Delete("revived", st(20, 0, "a"))
	s.Set("revived", []byte("back"), st(30, 0, "b"))
	n, err := s.CollectTombstones(hlc.Timestamp{Wall: 50}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("collected %d, want 1 (only \"old\")", n)
	}
	if _, err := s.Get("old"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old tombstone still there: %v", err)
	}
	if r, err := s.Get("young"); err != nil || !r.Tombstone {
		t.Fatalf("young tombstone collected early: %+v %v", r, err)
	}
	if r, err := s.Get("revived"); err != nil || string(r.Value) != "back" {
		t.Fatalf("revived key damaged: %+v %v", r, err)
	}
	d, _ := s.Digest()
	if d.Tombstones != 1 || d.Keys != 1 {
		t.Fatalf("after collection: %+v", d)
	}
	// Once collected, an old write may come back: that is why the caller
	// only collects below the frontier no older write can still arrive from.
	if out, _ := s.Set("old", []byte("zombie"), st(5, 0, "c")); out != entry.Applied {
		t.Fatalf("write after collection: %s", out)
	}
}

func TestBookkeepingCommitsWithData(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	stream := [16]byte{1, 2, 3}
	b := s.NewBatch()
	b.Merge(Write{Key: "k", Value: []byte("v"), Stamp: st(7, 0, "a")})
	b.SetLocalApplied(AppliedIndex{Stream: stream, Index: 42, Commit: hlc.Timestamp{Wall: 6, Logical: 1}})
	b.RaiseHLC(hlc.Timestamp{Wall: 7})
	if err := b.Commit(false); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, err := s.LocalApplied()
	if err != nil || a.Stream != stream || a.Index != 42 || a.Commit != (hlc.Timestamp{Wall: 6, Logical: 1}) {
		t.Fatalf("applied: %+v %v", a, err)
	}
	hw, err := s.HLCHighWater()
	if err != nil || hw != (hlc.Timestamp{Wall: 7}) {
		t.Fatalf("hlc: %s %v", hw, err)
	}
	if r, err := s.Get("k"); err != nil || string(r.Value) != "v" {
		t.Fatalf("data: %+v %v", r, err)
	}
}

// TestExpiredVersions: a version's expiry is stored with it; a scan with
// a time leaves out what expired by then (and lists it without one); the
// expired version still wins against an older write and loses to a newer
// one; the convergence digest covers the expiry.
func TestExpiredVersions(t *testing.T) {
	s := openTest(t)
	merge := func(w Write) entry.Outcome {
		t.Helper()
		out, err := s.Merge(w)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	merge(Write{Key: "e", Value: []byte("v"), Stamp: st(10, 0, "a"), Expires: 100})
	merge(Write{Key: "f", Value: []byte("v"), Stamp: st(10, 0, "a")})
	r, err := s.Get("e")
	if err != nil || r.Expires != 100 || !r.Live(99) || r.Live(100) {
		t.Fatalf("e: %+v %v", r, err)
	}
	list := func(now int64) string {
		items, _, err := s.Scan(ScanOptions{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, it := range items {
			ks = append(ks, it.Key)
		}
		return fmt.Sprint(ks)
	}
	if got := list(99); got != "[e f]" {
		t.Fatalf("before the expiry: %s", got)
	}
	if got := list(100); got != "[f]" {
		t.Fatalf("at the expiry: %s", got)
	}
	if got := list(0); got != "[e f]" {
		t.Fatalf("without a time: %s", got)
	}
	if out := merge(Write{Key: "e", Value: []byte("older"), Stamp: st(9, 0, "b")}); out != entry.Stale {
		t.Fatalf("an older write over an expired version: %v", out)
	}
	d1, _ := s.Digest()
	merge(Write{Key: "e", Value: []byte("v"), Stamp: st(10, 0, "a"), Expires: 100}) // the same version again
	if d2, _ := s.Digest(); d1 != d2 {
		t.Fatal("the same version changed the digest")
	}
	other := openTest(t)
	other.Merge(Write{Key: "e", Value: []byte("v"), Stamp: st(10, 0, "a"), Expires: 101})
	other.Merge(Write{Key: "f", Value: []byte("v"), Stamp: st(10, 0, "a")})
	if d3, _ := other.Digest(); d3 == d1 {
		t.Fatal("the digest does not cover the expiry")
	}
	if out := merge(Write{Key: "e", Value: []byte("newer"), Stamp: st(11, 0, "b")}); out != entry.Applied {
		t.Fatalf("a newer write over an expired version: %v", out)
	}
	if r, _ := s.Get("e"); r.Expires != 0 || string(r.Value) != "newer" {
		t.Fatalf("the newer version keeps its own (no) expiry: %+v", r)
	}
}

// TestCollectExpired: a collection drops the versions that expired by its
// cutoff's wall time and are stamped below it, with their leaf and their
// count among live keys; it leaves a version stamped at or above the
// cutoff (an older write may still arrive, which it must beat), one that
// expires later, and a key written again since (its stale index entry
// goes); a keeper keeps one as it keeps tombstones.
func TestCollectExpired(t *testing.T) {
	s := openTest(t)
	put := func(key string, stamp, expires int64) {
		t.Helper()
		if _, err := s.Merge(Write{Key: key, Value: []byte(key), Stamp: st(stamp, 0, "a"), Expires: expires}); err != nil {
			t.Fatal(err)
		}
	}
	put("gone", 10, 100)
	put("young", 200, 100) // stamped above the cutoff, expired before it
	put("later", 10, 500)
	put("rewritten", 10, 100)
	put("rewritten", 20, 0)
	put("plain", 10, 0)
	put("kept", 10, 100)
	if live := s.Live(); live != 6 {
		t.Fatalf("%d live keys before, want 6", live)
	}
	b := s.NewBatch()
	n, err := b.CollectTombstonesKeeping(hlc.Timestamp{Wall: 150}, 0, keepOnly("kept"))
	if err == nil {
		err = b.Commit(true)
	}
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("collected %d, want 1 (gone)", n)
	}
	if _, err := s.Get("gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("gone: %v", err)
	}
	for _, k := range []string{"young", "later", "rewritten", "plain", "kept"} {
		if _, err := s.Get(k); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if live := s.Live(); live != 5 {
		t.Fatalf("%d live keys after, want 5", live)
	}
	if differ, err := s.CheckLeaves(func(int) bool { return true }, false); err != nil || len(differ) != 0 {
		t.Fatalf("the kept leaves differ from the tree's after the collection: %v %v", differ, err)
	}
	// The stale index entry of rewritten went; young's, later's and kept's stay.
	var idx []string
	it, _ := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixExpiry}, UpperBound: []byte{prefixExpiry + 1}})
	for v := it.First(); v; v = it.Next() {
		idx = append(idx, string(it.Key()[9:]))
	}
	it.Close()
	if fmt.Sprint(idx) != "[kept young later]" {
		t.Fatalf("expiry index after: %v", idx)
	}
}

// keepOnly keeps the one key named.
type keepOnly string

func (k keepOnly) Keep(start, _, _ string, _ bool) bool { return start == string(k) }
func (keepOnly) Kept(string, string, string, bool, int) {}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{Stamp: st(1, 2, "a"), Value: []byte("hello")},
		{Stamp: st(1<<62, 0, "east-1"), Value: nil},
		{Stamp: st(3, 0, "b"), Tombstone: true},
		{Stamp: st(3, 0, "b"), Kind: KindCounter, Value: []byte{1, 2}},
		{Stamp: st(4, 0, "a"), Value: []byte("ttl"), Expires: 1 << 60},
		{Stamp: st(4, 0, "a"), Value: []byte("ttl"), Expires: 5, Ctx: entry.Context{{Origin: "a", HLC: hlc.Timestamp{Wall: 4}}}},
	} {
		enc := AppendRecord(nil, &r)
		got, err := DecodeRecord(enc)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if got.Stamp != r.Stamp || got.Tombstone != r.Tombstone || got.Kind != r.Kind || !bytes.Equal(got.Value, r.Value) ||
			got.Expires != r.Expires || !reflect.DeepEqual(got.Ctx, r.Ctx) {
			t.Fatalf("round trip: %+v -> %+v", r, got)
		}
	}
	for _, bad := range [][]byte{nil, {1}, {2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'a'}, {1, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'a'}, {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 'a'}} {
		if _, err := DecodeRecord(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("DecodeRecord(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, &Record{Stamp: st(1, 2, "a"), Value: []byte("hello")}))
	f.Add(AppendRecord(nil, &Record{Stamp: st(3, 0, "b"), Tombstone: true}))
	f.Add(AppendRecord(nil, &Record{Stamp: st(3, 0, "b"), Value: []byte("v"), Expires: 9e17}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not of the corrupt class: %v", err)
			}
			return
		}
		// What decodes must re-encode to the same bytes.
		if enc := AppendRecord(nil, &r); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding differs: %x vs %x", enc, b)
		}
		if _, _, err := decodeStampOnly(b); err != nil {
			t.Fatalf("stamp-only decode refused what DecodeRecord took: %v", err)
		}
	})
}

func TestCounterMerge(t *testing.T) {
	s := openTest(t)
	merge := func(cluster string, p, n uint64, wall int64) entry.Outcome {
		b := s.NewBatch()
		defer b.Close()
		out, err := b.MergeCounter("hits", cluster, entry.PN{P: p, N: n}, st(wall, 0, cluster))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if merge("a", 3, 0, 10) != entry.Applied || merge("b", 5, 1, 11) != entry.Applied {
		t.Fatal("first merges")
	}
	if out := merge("a", 3, 0, 10); out != entry.Duplicate {
		t.Fatalf("re-applied delta: %s", out)
	}
	if out := merge("a", 2, 0, 9); out != entry.Duplicate {
		t.Fatalf("older totals of a: %s", out)
	}
	merge("a", 4, 2, 12)
	c, err := s.Counter("hits")
	if err != nil || c.Value() != (4-2)+(5-1) || c.Stamp != st(12, 0, "a") {
		t.Fatalf("counter %+v value %d %v", c, c.Value(), err)
	}
	if _, err := s.Get("hits"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a counter shows in the plain key space: %v", err)
	}
	// order independence: the same deltas in reverse give the same digest
	s2 := openTest(t)
	for _, d := range []struct {
		c    string
		p, n uint64
		w    int64
	}{{"a", 4, 2, 12}, {"a", 3, 0, 10}, {"b", 5, 1, 11}} {
		b := s2.NewBatch()
		b.MergeCounter("hits", d.c, entry.PN{P: d.p, N: d.n}, st(d.w, 0, d.c))
		b.Commit(true)
		b.Close()
	}
	d1, _ := s.Digest()
	d2, _ := s2.Digest()
	if d1.Hash != d2.Hash || d1.Counters != 1 {
		t.Fatalf("digests %+v %+v", d1, d2)
	}
}

func TestRangeTombstone(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"r/1", "r/2", "r/3", "s/1"} {
		s.Set(k, []byte("v"), st(int64(10+i), 0, "a"))
	}
	s.Set("r/4", []byte("newer"), st(100, 0, "b"))
	b := s.NewBatch()
	out, deleted, err := b.MergeRange(RangeTombstone{Start: "r/", End: "r0", Stamp: st(50, 0, "c")})
	if err != nil || out != entry.Applied || deleted != 3 {
		t.Fatalf("range delete: %s %d %v", out, deleted, err)
	}
	b.Commit(true)
	b.Close()
	for k, live := range map[string]bool{"r/1": false, "r/2": false, "r/3": false, "r/4": true, "s/1": true} {
		r, err := s.Get(k)
		if got := err == nil && !r.Tombstone; got != live {
			t.Fatalf("%s live=%v, want %v", k, got, live)
		}
	}
	// an older write arriving later stays deleted; a newer one lands; a key
	// of the range never written before too
	if out, _ := s.Set("r/2", []byte("late"), st(40, 0, "d")); out != entry.Stale {
		t.Fatalf("older write after the range delete: %s", out)
	}
	if out, _ := s.Set("r/9", []byte("late"), st(40, 0, "d")); out != entry.Stale {
		t.Fatalf("older write to a new key of the range: %s", out)
	}
	if out, _ := s.Set("r/2", []byte("new"), st(60, 0, "d")); out != entry.Applied {
		t.Fatalf("newer write after the range delete: %s", out)
	}
	b = s.NewBatch()
	if out, _, _ := b.MergeRange(RangeTombstone{Start: "r/", End: "r0", Stamp: st(50, 0, "c")}); out != entry.Duplicate {
		t.Fatalf("the same range delete again: %s", out)
	}
	b.Close()
	s.Close()
	s, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if out, _ := s.Set("r/3", []byte("late"), st(45, 0, "d")); out != entry.Stale {
		t.Fatalf("range tombstone lost across a reopen: %s", out)
	}
	if n, _ := s.CollectTombstones(hlc.Timestamp{Wall: 55}, 0); n == 0 || len(s.RangeTombstones()) != 0 {
		t.Fatalf("collection: %d, ranges left %v", n, s.RangeTombstones())
	}
}

func FuzzDecodeCounter(f *testing.F) {
	f.Add(appendCounter(nil, &Counter{Totals: map[string]entry.PN{"a": {P: 3, N: 1}, "b": {P: 0, N: 7}}, Stamp: st(5, 0, "a")}))
	f.Add([]byte{1})
	f.Add(appendCounter(nil, &Counter{Totals: map[string]entry.PN{"a": {P: 3, N: 1}}, Floors: map[string]entry.PN{"a": {P: 3}, "b": {N: 2}}, Stamp: st(5, 0, "a")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCounter(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error outside the corrupt class: %v", err)
			}
			return
		}
		if enc := appendCounter(nil, &c); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// TestPersistedHLCOnlyGrows (operator event 8): a local group stamped at h1
// that commits after an inbound batch recorded h2 > h1 must not write h1 over
// h2, or a node restarted with its clock set back stamps below a value it
// holds.
func TestPersistedHLCOnlyGrows(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	h1, h2 := hlc.Timestamp{Wall: 100}, hlc.Timestamp{Wall: 200, Logical: 3}
	commit := func(ts hlc.Timestamp) {
		b := s.NewBatch()
		defer b.Close()
		b.Merge(Write{Key: "k" + ts.String(), Value: []byte("v"), Stamp: entry.Stamp{HLC: ts, Origin: "a"}})
		if err := errors.Join(b.RaiseHLC(ts), b.Commit(false)); err != nil {
			t.Fatal(err)
		}
	}
	commit(h2) // the inbound batch
	commit(h1) // the local group, stamped before it, committed after
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if hw, err := s.HLCHighWater(); err != nil || hw != h2 {
		t.Fatalf("persisted high-water %s (%v), want %s", hw, err, h2)
	}
}

// TestHWMsOfExcept: every stream of the origin but the one left out, in key
// order, whatever its neighbours; other origins never leak in.
func TestHWMsOfExcept(t *testing.T) {
	s := openTest(t)
	set := func(origin string, stream byte, index uint64) {
		b := s.NewBatch()
		defer b.Close()
		if err := b.SetHWM(entry.HWM{Origin: origin, Stream: [16]byte{stream}, Index: index, Commit: hlc.Timestamp{Wall: int64(index)}}); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []byte{1, 5, 9} {
		set("b", st, uint64(st))
	}
	set("bb", 5, 50) // an origin whose name extends b's
	set("a", 5, 7)
	for i := 0; i < 100; i++ {
		set("b", 5, uint64(100+i)) // the hot stream, many versions
	}
	b := s.NewBatch()
	defer b.Close()
	for _, tc := range []struct {
		except byte
		want   []byte
	}{{5, []byte{1, 9}}, {1, []byte{5, 9}}, {9, []byte{1, 5}}, {7, []byte{1, 5, 9}}} {
		hs, err := b.HWMsOfExcept("b", [16]byte{tc.except})
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		for _, h := range hs {
			if h.Origin != "b" {
				t.Fatalf("except %d: a mark of %q", tc.except, h.Origin)
			}
			got = append(got, h.Stream[0])
		}
		if string(got) != string(tc.want) {
			t.Fatalf("except %d: streams %v, want %v", tc.except, got, tc.want)
		}
	}
	all, err := b.HWMsOf("b")
	if err != nil || len(all) != 3 || all[1].Index != 199 {
		t.Fatalf("HWMsOf: %v %+v", err, all)
	}
}

// BenchmarkHWMsOfHotStream: listing an origin's other streams while one
// stream's mark has 20,000 unflushed versions (a receiver between memtable
// flushes). With the hot key inside the bounds the iterator steps over every
// version.
//
//	go test ./store -run '^$' -bench HWMsOfHotStream
func BenchmarkHWMsOfHotStream(b *testing.B) {
	s := openTest(b)
	for i := 0; i < 20000; i++ {
		bt := s.NewBatch()
		stream := [16]byte{5}
		if i%1000 == 0 {
			stream = [16]byte{byte(1 + i/1000)}
		}
		bt.SetHWM(entry.HWM{Origin: "b", Stream: stream, Index: uint64(i + 1), Commit: hlc.Timestamp{Wall: int64(i + 1)}})
		if err := bt.Commit(false); err != nil {
			b.Fatal(err)
		}
		bt.Close()
	}
	bt := s.NewBatch()
	defer bt.Close()
	b.Run("all", func(b *testing.B) {
		for b.Loop() {
			bt.HWMsOf("b")
		}
	})
	b.Run("except-hot", func(b *testing.B) {
		for b.Loop() {
			bt.HWMsOfExcept("b", [16]byte{5})
		}
	})
}

// TestMarksMatchPebble: the marks batches read from memory are the ones
// Pebble holds, through sets, deletes, a batch closed without committing
// and a reopen.
func TestMarksMatchPebble(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	check := func(s *Store, when string) {
		t.Helper()
		stored, err := s.HWMs()
		if err != nil {
			t.Fatal(err)
		}
		b := s.NewBatch()
		defer b.Close()
		var mem []entry.HWM
		for _, o := range []string{"a", "b", "bb"} {
			hs, _ := b.HWMsOf(o)
			mem = append(mem, hs...)
			for _, h := range hs {
				if one, _ := b.HWM(o, h.Stream); one != h {
					t.Fatalf("%s: HWM(%s, %x) = %+v, listed %+v", when, o, h.Stream[0], one, h)
				}
			}
		}
		if !reflect.DeepEqual(stored, mem) && !(len(stored) == 0 && len(mem) == 0) {
			t.Fatalf("%s: Pebble holds %+v, memory %+v", when, stored, mem)
		}
	}
	mark := func(o string, st byte, i uint64) entry.HWM {
		return entry.HWM{Origin: o, Stream: [16]byte{st}, Index: i, Commit: hlc.Timestamp{Wall: int64(i) * 10, Logical: 3}, Merged: i - 1, DeadLettered: 1, Seeded: 0}
	}
	b := s.NewBatch()
	for _, h := range []entry.HWM{mark("b", 5, 7), mark("b", 1, 3), mark("bb", 5, 9), mark("a", 2, 4)} {
		if err := b.SetHWM(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.Close()
	check(s, "after sets")
	b = s.NewBatch()
	b.SetHWM(mark("b", 5, 70))
	b.DeleteHWM("a", [16]byte{2})
	b.Close() // not committed: nothing changes
	check(s, "after an uncommitted batch")
	b = s.NewBatch()
	b.SetHWM(mark("b", 5, 70))
	b.DeleteHWM("a", [16]byte{2})
	b.SetHWM(mark("a", 3, 1))
	if err := b.Commit(false); err != nil {
		t.Fatal(err)
	}
	b.Close()
	check(s, "after set and delete")
	b = s.NewBatch()
	if h, _ := b.HWM("b", [16]byte{5}); h.Index != 70 {
		t.Fatalf("b/5 at %d, want 70", h.Index)
	}
	b.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check(s, "after reopen")
}

// ReplaceFrom makes a tree hold exactly another's (a snapshot installed):
// its keys, tombstones, range tombstones and marks, and nothing it held
// before, with what the store keeps in memory read again.
func TestReplaceFromCheckpoint(t *testing.T) {
	src := openTest(t)
	b := src.NewBatch()
	for i := 0; i < 1000; i++ {
		if _, err := b.Merge(Write{Key: fmt.Sprintf("k%04d", i), Value: bytes.Repeat([]byte("v"), 100), Stamp: st(int64(100+i), 0, "a")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Merge(Write{Key: "gone", Tombstone: true, Stamp: st(5000, 0, "b")}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.MergeRange(RangeTombstone{Start: "r", End: "s", Stamp: st(6000, 0, "a")}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetHWM(entry.HWM{Origin: "b", Stream: [16]byte{1}, Index: 7, Commit: hlc.Timestamp{Wall: 5000}, Merged: 7}); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(b.Commit(false)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	dir := t.TempDir() + "/checkpoint"
	if err := src.Checkpoint(dir); err != nil {
		t.Fatal(err)
	}
	dst := openTest(t)
	if _, err := dst.Set("stale", []byte("x"), st(99999, 0, "c")); err != nil {
		t.Fatal(err)
	}
	if err := dst.ReplaceFrom(dir); err != nil {
		t.Fatal(err)
	}
	want, _ := src.Digest()
	got, err := dst.Digest()
	if err != nil || got != want {
		t.Fatalf("digest %+v, want %+v (%v)", got, want, err)
	}
	if _, err := dst.Get("stale"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key the replaced tree held survived: %v", err)
	}
	if h, err := dst.HWMs(); err != nil || len(h) != 1 || h[0].Index != 7 {
		t.Fatalf("marks %+v %v", h, err)
	}
	// What the store keeps in memory is the new tree's: the max stamp (a
	// write below the old tree's max but above the new one's applies
	// without a read), the range tombstones.
	if dst.maxStamp != src.maxStamp || len(dst.ranges) != 1 {
		t.Fatalf("max stamp %v (want %v), ranges %v", dst.maxStamp, src.maxStamp, dst.ranges)
	}
}

func FuzzDecodeIdem(f *testing.F) {
	f.Add(appendIdem(nil, &IdemRecord{Key: "k", Fingerprint: []byte("fp"), Status: 200, Body: []byte(`{"ok":1}`),
		Stamp: st(5, 1, "a"), Expires: 99}))
	f.Add(appendIdem(nil, &IdemRecord{Key: "k", Stamp: st(1, 0, "b")}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeIdem("k", b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error outside the corrupt class: %v", err)
			}
			return
		}
		again, err := DecodeIdem("k", appendIdem(nil, &r))
		if err != nil || again.Stamp != r.Stamp || again.Expires != r.Expires || again.Status != r.Status ||
			!bytes.Equal(again.Fingerprint, r.Fingerprint) || !bytes.Equal(again.Body, r.Body) {
			t.Fatalf("re-encoding changed the record: %+v -> %+v (%v)", r, again, err)
		}
	})
}

// TestRangePieceNeverShrinksTheRange: one range delete kept whole and a
// piece of it that begins where it does (a filtered link carried one part,
// a backfill another) share one record: the piece is a duplicate, and the
// range still covers its whole span, after a reopen too (before, the piece
// was written over the record and shrank it, letting an older write back
// into the rest); a longer piece grows it.
func TestRangePieceNeverShrinksTheRange(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	merge := func(start, end string) entry.Outcome {
		t.Helper()
		b := s.NewBatch()
		defer b.Close()
		out, _, err := b.MergeRange(RangeTombstone{Start: start, End: end, Stamp: st(50, 0, "c")})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(when, end string) {
		t.Helper()
		rs := s.RangeTombstones()
		if len(rs) != 1 || rs[0].Start != "k/19" || rs[0].End != end {
			t.Fatalf("%s: ranges %+v, want [k/19, %s)", when, rs, end)
		}
		if out, _ := s.Set("k/21", []byte("late"), st(40, 0, "d")); out != entry.Stale {
			t.Fatalf("%s: an older write into the range: %s", when, out)
		}
	}
	if out := merge("k/19", "k/22"); out != entry.Applied {
		t.Fatal(out)
	}
	if out := merge("k/19", "k/2"); out != entry.Duplicate {
		t.Fatalf("a piece of the range: %s", out)
	}
	check("after the piece", "k/22")
	if out := merge("k/19", "k/25"); out != entry.Applied {
		t.Fatalf("a longer piece: %s", out)
	}
	check("after a longer piece", "k/25")
	s.Close()
	if s, err = Open(dir, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check("after a reopen", "k/25")
}

// TestDeletedCounterCollected: a counter whose floors remove every
// increment (a delete) reads absent, counts in no digest or live count,
// and goes with its key's tombstone once both are below the cutoff; a
// counter that counts beyond its floors stays; the tree then hashes as
// one that never held the deleted counter.
func TestDeletedCounterCollected(t *testing.T) {
	s, other := openTest(t), openTest(t)
	apply := func(s *Store, es ...entry.Entry) {
		t.Helper()
		b := s.NewBatch()
		defer b.Close()
		for i := range es {
			if _, err := b.ApplyEntry(&es[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(true); err != nil {
			t.Fatal(err)
		}
	}
	ctr := func(key string, p uint64, wall int64) entry.Entry {
		return entry.Entry{Op: entry.OpCounter, Key: key, Ctr: &entry.PN{P: p}, CtrComp: "a", Stamp: hlc.Timestamp{Wall: wall}, Commit: hlc.Timestamp{Wall: wall}, Origin: "a"}
	}
	del := func(key string, floor uint64, wall int64) entry.Entry {
		return entry.Entry{Op: entry.OpDelete, Key: key, Floors: map[string]entry.PN{"a": {P: floor}}, Stamp: hlc.Timestamp{Wall: wall}, Commit: hlc.Timestamp{Wall: wall}, Origin: "b"}
	}
	apply(s, ctr("gone", 3, 10), ctr("counts", 3, 10), ctr("kept", 1, 10))
	apply(s, del("gone", 3, 20), del("counts", 2, 20))
	apply(other, ctr("counts", 3, 10), ctr("kept", 1, 10))
	apply(other, del("counts", 2, 20))
	if v, _, _, err := s.Read("gone", 0); err != nil || v.Present {
		t.Fatalf("a deleted counter reads %+v %v", v, err)
	}
	if v, _, _, err := s.Read("counts", 0); err != nil || string(v.Value) != "1" {
		t.Fatalf("a counter deleted at 2 of its 3 reads %+v %v", v, err)
	}
	if s.Live() != 2 {
		t.Fatalf("%d live keys, want 2 (counts, kept)", s.Live())
	}
	same := func(when string) {
		t.Helper()
		da, _ := s.Digest()
		db, _ := other.Digest()
		if da.Hash != db.Hash || da.Counters != 2 {
			t.Fatalf("%s: digests %+v and %+v, want equal with 2 counters", when, da, db)
		}
	}
	same("before the collection")
	if n, err := s.CollectTombstones(hlc.Timestamp{Wall: 30}, 0); err != nil || n != 2 {
		t.Fatalf("collected %d %v, want the two tombstones", n, err)
	}
	if _, err := s.Counter("gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the deleted counter after the collection: %v", err)
	}
	if c, err := s.Counter("counts"); err != nil || c.Value() != 1 {
		t.Fatalf("the counter that counts after the collection: %+v %v", c, err)
	}
	same("after the collection")
	if bad, err := s.CheckLeaves(func(int) bool { return true }, false); err != nil || len(bad) != 0 {
		t.Fatalf("kept leaves disagree with the tree: %v %v", bad, err)
	}
}

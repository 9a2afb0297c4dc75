package transport

import (
	"fmt"
	"sort"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// memSnapshot is a Snapshot of sorted keys in memory.
type memSnapshot struct {
	keys []string
	pos  int
	// origin, when set, says which cluster wrote each key's version.
	origin func(key string) string
	marks  []entry.HWM
}

func (m *memSnapshot) Count() (int, error)                         { return len(m.keys), nil }
func (m *memSnapshot) LocalApplied() entry.AppliedIndex            { return entry.AppliedIndex{} }
func (m *memSnapshot) Ranges() ([]entry.RangeTombstone, error)     { return nil, nil }
func (m *memSnapshot) Counters() (map[string]entry.Counter, error) { return nil, nil }
func (m *memSnapshot) Marks() ([]entry.HWM, error)                 { return m.marks, nil }
func (m *memSnapshot) CollectedBelow() (hlc.Timestamp, error)      { return hlc.Timestamp{}, nil }
func (m *memSnapshot) SeekGE(key string)                           { m.pos = sort.SearchStrings(m.keys, key) }
func (m *memSnapshot) Close()                                      {}
func (m *memSnapshot) Next() (string, entry.Record, bool, error) {
	if m.pos >= len(m.keys) {
		return "", entry.Record{}, false, nil
	}
	m.pos++
	k := m.keys[m.pos-1]
	rec := entry.Record{Value: []byte("v"), Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: 5}}}
	if m.origin != nil {
		rec.Stamp.Origin = m.origin(k)
	}
	return k, rec, true, nil
}

// TestFeedTrailerRidesWithTheLastEntries: a snapshot's batches carry every
// key its scope lets through once, in order, and the batch that ends it
// holds the last entries (a trailer never goes alone, so a resent trailer
// is told by its entries), except for a snapshot with nothing in it.
func TestFeedTrailerRidesWithTheLastEntries(t *testing.T) {
	for _, tc := range []struct {
		keys, batch int
		filter      entry.Filter
		want        int
	}{
		{keys: 12, batch: 4, want: 12}, // a multiple of the batch size
		{keys: 13, batch: 4, want: 13},
		{keys: 0, batch: 4, want: 0},
		{keys: 40, batch: 5, filter: entry.Filter{Include: []string{"k1"}}, want: 10},
		{keys: 40, batch: 5, filter: entry.Filter{Include: []string{"k0"}, Exclude: []string{"k00"}}, want: 9}, // k01..k09
	} {
		name := fmt.Sprintf("%d keys by %d, %s", tc.keys, tc.batch, tc.filter)
		snap := &memSnapshot{}
		for i := 0; i < tc.keys; i++ {
			snap.keys = append(snap.keys, fmt.Sprintf("k%02d", i))
		}
		f, err := newScopedFeed(snap, "a", 1, tc.filter, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		got, batches := 0, 0
		for done := false; !done; {
			var ents [][]byte
			if ents, done, err = f.batch(tc.batch, 1<<20); err != nil {
				t.Fatal(err)
			}
			batches++
			got += len(ents)
			if done && len(ents) == 0 && tc.want > 0 {
				t.Errorf("%s: the trailer went alone in batch %d", name, batches)
			}
			if batches > tc.keys+2 {
				t.Fatalf("%s: no end", name)
			}
		}
		if got != tc.want || f.index != uint64(tc.want) {
			t.Errorf("%s: %d entries sent, last index %d, want %d", name, got, f.index, tc.want)
		}
	}
}

// TestFeedReturnsThePeersOwnWrites: a re-seed the peer asked for (it lost
// data) carries what the filter lets through and, outside it, exactly the
// versions the peer itself wrote.
func TestFeedReturnsThePeersOwnWrites(t *testing.T) {
	snap := &memSnapshot{origin: func(k string) string {
		if k[len(k)-1]%2 == 0 {
			return "b"
		}
		return "c"
	}}
	for i := 0; i < 40; i++ {
		snap.keys = append(snap.keys, fmt.Sprintf("k%02d", i))
	}
	f, err := newScopedFeed(snap, "a", 1, entry.Filter{Include: []string{"k1"}}, "b", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		e, ok, err := f.next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, e.Key)
	}
	var want []string
	for _, k := range snap.keys {
		if k[:2] == "k1" || snap.origin(k) == "b" {
			want = append(want, k)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %q\nwant %q", got, want)
	}
}

// TestSnapshotWithholdsClippedRelays (issue 48): a re-seed relays a third
// cluster's writes only when this cluster holds that cluster's streams
// whole (the trailer claims them): not those of a cluster whose filter
// toward here kept some of a stream home (a filtered mark, or a stream
// the link records as partial), and none when the link's own filter keeps
// keys home. Such a relay would hand the peer a transaction clipped,
// shown in part until its author's stream brought the rest. A re-seed the
// peer asked for (it lost data) relays everything; a backfill relays
// nothing but this cluster's writes.
func TestSnapshotWithholdsClippedRelays(t *testing.T) {
	authors := []string{"a", "b", "c", "d", "e"} // a: here; b: the peer
	snap := func() *memSnapshot {
		m := &memSnapshot{origin: func(k string) string { return k[len(k)-1:] }, marks: []entry.HWM{
			{Origin: "c", Stream: entry.StreamID{0xc}, Index: 9, Filtered: 2},
			{Origin: "d", Stream: entry.StreamID{0xd}, Index: 9},
			{Origin: "e", Stream: entry.StreamID{0xe}, Index: 9},
		}}
		for i := 0; i < 4; i++ {
			for _, a := range authors {
				m.keys = append(m.keys, fmt.Sprintf("k%d/%s", i, a))
			}
		}
		sort.Strings(m.keys)
		return m
	}
	s := &Shipper{opts: Options{Partial: func(origin string, _ entry.StreamID) bool { return origin == "e" }}}
	sent := func(f *snapshotFeed) map[string]int {
		out := map[string]int{}
		for {
			e, ok, err := f.next()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return out
			}
			out[e.Key[len(e.Key)-1:]]++
		}
	}
	for _, tc := range []struct {
		name      string
		filter    entry.Filter
		requested bool
		backfill  bool
		want      string
	}{
		{name: "every key", want: "map[a:4 b:4 d:4]"},
		{name: "a filtered link", filter: entry.Filter{Exclude: []string{"k3/"}}, want: "map[a:3]"},
		{name: "the peer lost data", requested: true, want: "map[a:4 b:4 c:4 d:4 e:4]"},
		{name: "a backfill", backfill: true, want: "map[a:4]"},
	} {
		sn := snap()
		var withhold func(string) bool
		returning := ""
		switch {
		case tc.backfill:
			withhold = func(string) bool { return true }
		case tc.requested:
			returning = "b"
		default:
			var err error
			if withhold, err = s.clippedAuthors(sn, tc.filter); err != nil {
				t.Fatal(err)
			}
		}
		f, err := newScopedFeed(sn, "a", 1, tc.filter, returning, withhold)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(sent(f)); got != tc.want {
			t.Errorf("%s: sent by author %s, want %s", tc.name, got, tc.want)
		}
	}
}

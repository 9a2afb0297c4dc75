package machine

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// TestVersionCacheChangesNothing runs one history of three clusters twice,
// with the store's version cache (a small one, so that it turns over) and
// without: local writes, deletes and expiring writes of a few keys at each,
// streams delivered between them in random pieces (writes that descend from
// what the receiver holds, and writes concurrent with it, which the conflict
// log records), redeliveries, tombstone collection and truncation. Every
// cluster must end byte for byte the same both ways: each key's record
// (stamp, context, value, flags), the conflict log, the digest, the live
// count and every outbound entry (the contexts shipped to peers). The cached
// run must have answered merges from the cache, or the test proves nothing.
func TestVersionCacheChangesNothing(t *testing.T) {
	seeds := uint64(2)
	if raceOn {
		seeds = 1
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			cached, hits := versionHistory(t, seed, 16)
			plain, _ := versionHistory(t, seed, -1)
			if hits == 0 {
				t.Fatal("the cached run answered no merge from the cache")
			}
			for name := range plain {
				if !reflect.DeepEqual(cached[name], plain[name]) {
					for i := range plain[name] {
						if i < len(cached[name]) && cached[name][i] != plain[name][i] {
							t.Errorf("cluster %s: with the cache %s\nwithout %s", name, cached[name][i], plain[name][i])
							break
						}
					}
					t.Fatalf("cluster %s differs with the version cache (%d lines against %d)", name, len(cached[name]), len(plain[name]))
				}
			}
			n := 0
			for _, lines := range plain {
				for _, l := range lines {
					if len(l) > 8 && l[:8] == "conflict" {
						n++
					}
				}
			}
			if n == 0 {
				t.Fatal("the history logged no conflict: the judge's side of the cache is untried")
			}
			t.Logf("seed %d: %d merges answered by the cache, %d conflict records", seed, hits, n)
		})
	}
}

// versionHistory plays the seeded history with the given version cache
// bound and returns each cluster's state, one line per fact, and the
// cache's hits over all clusters.
func versionHistory(t *testing.T, seed uint64, cacheKeys int) (map[string][]string, uint64) {
	rng := rand.New(rand.NewPCG(seed, 50))
	names := []string{"a", "b", "c"}
	cl := map[string]*conflictCluster{}
	for i, n := range names {
		c := newConflictClusterOn(t, n, entry.StreamID{byte(0xa + i)}, 1e15, &store.Options{VersionCacheKeys: cacheKeys})
		c.apply(&Command{Format: &FormatCmd{Version: ReadsFormat}})
		cl[n] = c
	}
	// delivered[to][from]: how much of from's stream to has applied.
	key := func() string { return fmt.Sprintf("k%02d", rng.IntN(40)) }
	steps := 1000
	if raceOn {
		steps = 300
	}
	for step := 0; step < steps; step++ {
		c := cl[names[rng.IntN(3)]]
		switch r := rng.IntN(20); {
		case r < 10: // a group of local writes
			var props []Proposal
			for range 1 + rng.IntN(6) {
				p := c.stamps.put(key(), fmt.Sprintf("%s-%d", c.name, step))
				switch rng.IntN(6) {
				case 0:
					p.Entry.Op, p.Entry.Value = entry.OpDelete, nil
				case 1:
					p.Entry.Expires = p.Entry.Commit.Wall + int64(rng.IntN(3))*1e6
				}
				props = append(props, p)
			}
			res := c.apply(&Command{Local: props})
			for _, w := range res.Writes {
				if w.Err == nil && w.Entry.Index > 0 {
					c.out = append(c.out, w.Entry)
				}
			}
		case r < 17: // a piece of another cluster's stream
			from := cl[names[rng.IntN(3)]]
			if from == c {
				continue
			}
			shipPiece(c, from, rng.IntN(8)+1, rng.IntN(10) == 0)
		case r < 18: // collection below a cutoff every cluster passed
			cut := hlc.Timestamp{Wall: c.stamps.wall - 20_000}
			if _, err := c.st.CollectTombstones(cut, 0); err != nil {
				t.Fatal(err)
			}
		default: // the stream's acknowledged head goes
			if n := uint64(len(c.out)); n > 4 {
				c.apply(&Command{Truncate: &TruncateCmd{Stream: c.m.Stream(), First: n - 3}})
			}
		}
	}
	out := map[string][]string{}
	var hits uint64
	for _, n := range names {
		out[n] = dumpMachine(t, cl[n])
		hits += cl[n].st.VersionCacheStats().Hits
	}
	return out, hits
}

// shipPiece applies the next up to n entries of from's stream at c, or
// (again) re-sends the last ones c applied with them.
func shipPiece(c, from *conflictCluster, n int, again bool) {
	c.t.Helper()
	start := c.hwm[from.name]
	if again && start > 2 {
		start -= 2
	}
	var ents []entry.Entry
	for _, e := range from.out {
		if e.Index > start && len(ents) < n {
			ents = append(ents, e)
			c.stamps.wall = max(c.stamps.wall, e.Commit.Wall)
		}
	}
	if len(ents) == 0 {
		return
	}
	bt := &wire.Batch{Header: wire.Header{Sender: from.name, Stream: from.m.Stream()}, Entries: ents}
	res := c.apply(&Command{Inbound: &Inbound{Sender: from.name, Batch: bt, At: 1, HLC: c.stamps.next(), MaxStreams: 16}})
	if res.Inbound.Err != nil {
		c.t.Fatal(res.Inbound.Err)
	}
	c.hwm[from.name] = max(c.hwm[from.name], res.Inbound.HWM)
}

func dumpMachine(t *testing.T, c *conflictCluster) []string {
	t.Helper()
	var lines []string
	for i := range 40 {
		k := fmt.Sprintf("k%02d", i)
		r, err := c.st.Get(k)
		if err != nil {
			lines = append(lines, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		lines = append(lines, fmt.Sprintf("%s: %+v", k, r))
	}
	confl, _, err := c.st.Conflicts(store.ConflictQuery{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range confl {
		lines = append(lines, fmt.Sprintf("conflict %+v", r))
	}
	d, err := c.st.Digest()
	if err != nil {
		t.Fatal(err)
	}
	leaves := sha256.New()
	for _, l := range c.st.Leaves() {
		leaves.Write(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, l.A), l.B))
	}
	lines = append(lines, fmt.Sprintf("digest %+v live %d leaves %x", d, c.st.Live(), leaves.Sum(nil)))
	err = c.st.EachOutbound(c.m.Stream(), func(i uint64, _ int) error {
		raw, err := c.st.Outbound(c.m.Stream(), i)
		lines = append(lines, fmt.Sprintf("outbound %d %x", i, raw))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

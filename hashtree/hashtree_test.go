package hashtree

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// TestProtocolPinned: the leaf of a key and the digest of a version are
// part of the protocol (Version): a change here would make every pair of
// clusters on two builds disagree everywhere. These values must not move
// without a new Version.
func TestProtocolPinned(t *testing.T) {
	var d Digester
	st := entry.Stamp{HLC: hlc.Timestamp{Wall: 1_700_000_000_000_000_000, Logical: 3}, Origin: "a"}
	got := fmt.Sprintf("%d %d %s %x", Leaf("user/42"), Leaf(""), d.Digest("user/42", st, 0, ValueHash([]byte("v"))), ValueHash([]byte("v")))
	const want = "952818 980077 f7a4c052ff6500f1b8dd9112c99c1da4 a293d43641f17ec1"
	if got != want {
		t.Fatalf("protocol values moved:\n got  %s\n want %s", got, want)
	}
}

// TestSumIsAMultiset: a leaf kept by adding and subtracting version digests
// in any order equals one summed afresh from the live versions.
func TestSumIsAMultiset(t *testing.T) {
	var d Digester
	r := rand.New(rand.NewPCG(1, 2))
	live := map[string]entry.Stamp{}
	var kept Sum
	for i := 0; i < 10000; i++ {
		k := fmt.Sprintf("k%d", r.IntN(300))
		st := entry.Stamp{HLC: hlc.Timestamp{Wall: int64(i + 1)}, Origin: []string{"a", "b"}[r.IntN(2)]}
		if old, ok := live[k]; ok {
			kept = kept.Sub(d.Digest(k, old, 0, 7))
		}
		if r.IntN(5) == 0 {
			delete(live, k) // a delete: tombstones stay out of the hashes
			continue
		}
		live[k] = st
		kept = kept.Add(d.Digest(k, st, 0, 7))
	}
	var fresh Sum
	for k, st := range live {
		fresh = fresh.Add(d.Digest(k, st, 0, 7))
	}
	if kept != fresh || kept.IsZero() {
		t.Fatalf("kept %s, summed afresh %s", kept, fresh)
	}
	// Any one field of a version changes its digest.
	base := entry.Stamp{HLC: hlc.Timestamp{Wall: 5}, Origin: "a"}
	ref := d.Digest("k", base, 0, 1)
	for name, other := range map[string]Sum{
		"key":    d.Digest("k2", base, 0, 1),
		"wall":   d.Digest("k", entry.Stamp{HLC: hlc.Timestamp{Wall: 6}, Origin: "a"}, 0, 1),
		"origin": d.Digest("k", entry.Stamp{HLC: hlc.Timestamp{Wall: 5}, Origin: "b"}, 0, 1),
		"kind":   d.Digest("k", base, 1, 1),
		"value":  d.Digest("k", base, 0, 2),
	} {
		if other == ref {
			t.Fatalf("a version differing in its %s has the same digest", name)
		}
	}
}

// TestLevels: each interior node is the sum of its children, the root the
// sum of every leaf; a change in one leaf shows on its path only.
func TestLevels(t *testing.T) {
	leaves := make([]Sum, Leaves)
	var d Digester
	for i := 0; i < 5000; i++ {
		k := fmt.Sprint("key-", i)
		leaves[Leaf(k)] = leaves[Leaf(k)].Add(d.Digest(k, entry.Stamp{HLC: hlc.Timestamp{Wall: 1}, Origin: "a"}, 0, 0))
	}
	lv, err := Levels(leaves)
	if err != nil {
		t.Fatal(err)
	}
	var all Sum
	for _, s := range leaves {
		all = all.Add(s)
	}
	if len(lv[0]) != 1 || lv[0][0] != all || len(lv[Depth]) != Leaves {
		t.Fatalf("root %v, want %v; %d leaves", lv[0], all, len(lv[Depth]))
	}
	changed := append([]Sum(nil), leaves...)
	leaf := Leaf("key-17")
	changed[leaf] = changed[leaf].Add(Sum{A: 1})
	lv2, _ := Levels(changed)
	for l := 0; l <= Depth; l++ {
		diff := 0
		for i := range lv[l] {
			if lv[l][i] != lv2[l][i] {
				diff++
				if want := leaf >> (FanoutBits * (Depth - l)); i != want {
					t.Fatalf("level %d: node %d differs, want only %d", l, i, want)
				}
			}
		}
		if diff != 1 {
			t.Fatalf("level %d: %d nodes differ, want 1", l, diff)
		}
	}
	if _, err := Levels(leaves[:10]); err == nil {
		t.Fatal("ten leaves made a tree")
	}
	if s, err := DecodeSum(all.AppendTo(nil)); err != nil || s != all {
		t.Fatalf("round trip %v %v", s, err)
	}
}

// BenchmarkDigest is what keeping the hashes adds per version hashed (a
// write hashes its new version and, over a stored one, the old).
func BenchmarkDigest(b *testing.B) {
	var d Digester
	v := make([]byte, 100)
	st := entry.Stamp{HLC: hlc.Timestamp{Wall: 1_700_000_000_000_000_000}, Origin: "a"}
	for i := 0; b.Loop(); i++ {
		_ = d.Digest("key-000000012345", st, 0, ValueHash(v))
	}
}

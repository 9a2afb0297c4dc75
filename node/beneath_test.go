package node

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
)

// This test stays inside the package on purpose: the kept hashes live in a
// running node's memory (a node rebuilds them from its tree when it opens),
// so a change beneath them can only be made from within.

// TestRebuildFindsAChangeBeneathTheHashes: a record changed in Pebble
// beneath the kept hashes (bit rot, a hand edit) is invisible to a
// comparison, whose sums still agree; POST /admin/tree/rebuild on that node
// finds its leaf and corrects it, and a comparison then finds the key (the
// same stamp with another value: unknown, never copied). The node keeps
// serving and counts the leaf in replicator_leaf_check_mismatches_total.
func TestRebuildFindsAChangeBeneathTheHashes(t *testing.T) {
	m := newTestMesh(t, hlc.SystemClock{}, func(o *Options) { o.AntiEntropyInterval = -1 }, "a", "b")
	a, b := m.nodes["a"], m.nodes["b"]
	ctx := context.Background()
	putN(t, a, "k", 100)
	m.converged(20 * time.Second)
	rec, err := b.store.Get("k006")
	if err != nil {
		t.Fatal(err)
	}
	rec.Value = []byte("rotten")
	if err := b.store.WriteBeneath("k006", &rec); err != nil {
		t.Fatal(err)
	}
	if rep, err := a.ae.Diff(ctx, "b", false); err != nil || !rep.Equal {
		t.Fatalf("before the rebuild the kept hashes still agree: %v %+v", err, rep)
	}
	rebuild := func() client.TreeRebuild {
		t.Helper()
		resp, body := do(t, http.MethodPost, b.URL()+"/admin/tree/rebuild", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("rebuild: %d %s", resp.StatusCode, body)
		}
		var r client.TreeRebuild
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := rebuild()
	if r.Leaves != hashtree.Leaves || r.Corrected != 1 || len(r.First) != 1 || r.First[0] != hashtree.Leaf("k006") {
		t.Fatalf("rebuild: %+v, want leaf %d corrected", r, hashtree.Leaf("k006"))
	}
	if again := rebuild(); again.Corrected != 0 {
		t.Fatalf("a second rebuild corrected %d leaves", again.Corrected)
	}
	rep, err := a.ae.Diff(ctx, "b", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Divergent) != 1 || rep.Divergent[0].Key != "k006" || rep.Divergent[0].Lacks != client.LacksUnknown || rep.Repaired != 0 {
		t.Fatalf("after the rebuild: %+v", rep.Divergent)
	}
	_, metrics := do(t, http.MethodGet, b.URL()+"/metrics", nil)
	if !strings.Contains(string(metrics), "replicator_leaf_check_mismatches_total{cluster=\"b\"} 1\n") {
		t.Fatalf("the corrected leaf is not counted:\n%s", grepLines(metrics, "leaf_check"))
	}
	if _, err := b.Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func grepLines(b []byte, words ...string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

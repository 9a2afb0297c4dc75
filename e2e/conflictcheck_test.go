package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/replicator/replicator/client"
)

// checkConflicts judges the clusters' conflict logs against the history:
//
//   - no record is invented: its loser is a version (or, for a write whose
//     answer was lost, a value) that a possibly-applied write of its key
//     made, and it lost to a newer version of another cluster;
//   - no record is a false conflict: a winner written by a cas on a version
//     held it, and so held every version that one descends from through
//     other cas writes; such a loser is never logged against it.
//
// Which concurrent pairs are logged exactly is checked where the order of
// delivery is the test's (machine TestConflictThreeClusters, e2e
// TestConflictLog): here wipes, restores and re-seeds let clusters skip
// versions. It returns the violations and a summary of what was logged.
func (h *history) checkConflicts(logs map[string][]client.Conflict) ([]string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	versions := map[string]map[string]*callRecord{} // key -> version -> op
	values := map[string]map[string]bool{}          // key -> values possibly written
	deletes := map[string]bool{}                    // keys a delete of unknown version may have hit
	add := func(k string, op *callRecord) {
		if op.Version != "" {
			if versions[k] == nil {
				versions[k] = map[string]*callRecord{}
			}
			versions[k][op.Version] = op
		}
	}
	val := func(k, v string) {
		if values[k] == nil {
			values[k] = map[string]bool{}
		}
		values[k][v] = true
	}
	var ranges []*callRecord
	for i := range h.ops {
		op := &h.ops[i]
		if op.Outcome == outFailed {
			continue
		}
		switch op.Kind {
		case "put", "cas":
			add(op.Key, op)
			val(op.Key, op.Value)
		case "del":
			add(op.Key, op)
			deletes[op.Key] = true
		case "range":
			ranges = append(ranges, op)
		case "batch":
			for _, s := range op.Sets {
				add(s.K, op)
				val(s.K, s.V)
			}
			for _, k := range op.Dels {
				add(k, op)
				deletes[k] = true
			}
		}
	}
	// heldBy reports whether the author of version w of key k held version
	// l: through a chain of cas writes, each naming the one before.
	heldBy := func(k, w, l string) bool {
		for i := 0; i < 1000 && w != ""; i++ {
			op := versions[k][w]
			if op == nil || op.Kind != "cas" {
				return false
			}
			if op.Prev == l {
				return true
			}
			w = op.Prev
		}
		return false
	}
	var bad []string
	total, possible, restored := 0, 0, 0
	names := make([]string, 0, len(logs))
	for n := range logs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, c := range logs[n] {
			total++
			if c.Possible {
				possible++
			}
			if c.Restored != "" {
				restored++
			}
			lo, lok := stampOf(c.Loser.Version)
			wi, wok := stampOf(c.Winner.Version)
			switch {
			case !lok || !wok:
				bad = append(bad, fmt.Sprintf("%s logged a conflict of %s with unreadable versions: %+v", n, c.Key, c))
				continue
			case lo.Origin == wi.Origin || lo.Compare(wi) >= 0:
				bad = append(bad, fmt.Sprintf("%s logged %s lost to %s on %s: not a newer version of another cluster", n, c.Loser.Version, c.Winner.Version, c.Key))
			case heldBy(c.Key, c.Winner.Version, c.Loser.Version):
				bad = append(bad, fmt.Sprintf("%s logged a false conflict on %s: the winner %s was a cas on the loser %s (or on a version that was)", n, c.Key, c.Winner.Version, c.Loser.Version))
			}
			if versions[c.Key][c.Loser.Version] != nil {
				continue
			}
			known := false
			switch {
			case c.Loser.Deleted:
				known = deletes[c.Key]
				for _, r := range ranges {
					known = known || (c.Key >= r.Key && (r.End == "" || c.Key < r.End))
				}
			case c.Loser.ValueOmitted:
				known = true // not kept: the version check above is all there is
			default:
				known = values[c.Key][string(c.Loser.Value)]
			}
			if !known {
				bad = append(bad, fmt.Sprintf("%s logged a loser no write of %s made: %s %q", n, c.Key, c.Loser.Version, c.Loser.Value))
			}
		}
	}
	per := make([]string, 0, len(names))
	for _, n := range names {
		per = append(per, fmt.Sprintf("%s=%d", n, len(logs[n])))
	}
	return bad, fmt.Sprintf("%d conflicts logged (%s; %d possible, %d restored)", total, strings.Join(per, " "), possible, restored)
}

// TestConflictCheckerCatches: the conflict checker flags a record whose
// winner was a cas on its loser, a loser no write made, and a loser newer
// than its winner; it passes a record of two blind writes.
func TestConflictCheckerCatches(t *testing.T) {
	h := &history{}
	h.add(callRecord{Kind: "put", Cluster: "a", Key: "k", Value: "a-1", Outcome: outOK, Version: "100.0@a"})
	h.add(callRecord{Kind: "cas", Cluster: "b", Key: "k", Value: "b-1", Outcome: outOK, Version: "200.0@b", Prev: "100.0@a"})
	h.add(callRecord{Kind: "put", Cluster: "c", Key: "k", Value: "c-1", Outcome: outOK, Version: "150.0@c"})
	h.add(callRecord{Kind: "put", Cluster: "a", Key: "j", Value: "a-2", Outcome: outUnknown})
	rec := func(key, loser, lv, winner string) client.Conflict {
		return client.Conflict{Key: key, Loser: client.ConflictVersion{Version: loser, Value: []byte(lv)}, Winner: client.ConflictVersion{Version: winner}}
	}
	good := []client.Conflict{rec("k", "150.0@c", "c-1", "200.0@b"), rec("j", "90.0@a", "a-2", "95.0@b")}
	if bad, _ := h.checkConflicts(map[string][]client.Conflict{"x": good}); len(bad) != 0 {
		t.Fatalf("flagged a true conflict: %v", bad)
	}
	for _, c := range []client.Conflict{
		rec("k", "100.0@a", "a-1", "200.0@b"), // b's cas held a's version
		rec("k", "120.0@a", "nobody", "200.0@b"),
		rec("k", "200.0@b", "b-1", "150.0@c"),
	} {
		if bad, _ := h.checkConflicts(map[string][]client.Conflict{"x": {c}}); len(bad) != 1 {
			t.Fatalf("%+v: %v", c, bad)
		}
	}
}

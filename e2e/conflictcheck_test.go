package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
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
// That the logs are complete is checkConflictsComplete's, in runs without
// snapshots (here wipes, restores and re-seeds let clusters skip versions),
// and exactly where the order of delivery is the test's (machine
// TestConflictThreeClusters, e2e TestConflictLog). It returns the
// violations and a summary of what was logged.
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
		if op.Kind == "range" {
			ranges = append(ranges, op)
		}
		for _, w := range op.writes() {
			add(w.key, op)
			if w.del {
				deletes[w.key] = true
			} else {
				val(w.key, w.value)
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
					known = known || r.covers(c.Key)
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

// checkConflictsComplete asks the logs to be complete where the history
// says exactly what must be there. Take a key that only two clusters wrote
// (and no range delete reached), its final version f written by cluster F,
// and the acknowledged values the other cluster L wrote that f does not
// descend from (f's causal context, the scan's descends). Then F's log names
// L's line as lost to f: a record with f as winner and, as loser, L's last
// such value or a later version of L (one whose answer was lost). Why, when
// every entry reaches F once through L's stream, in L's order: a version l
// of L that reached F after F wrote f lost to what F held then, f or F's
// later versions, none of which had seen l, so F logged it; one that reached
// F before was held by F, or lost on arrival to a version of F that had not
// seen it (logged), or to one that had: every write of F after it descends
// from what F held, so f would have seen l. Each later version of L
// descends from l and not from f, so it takes l's record over (docs/
// DATAMODEL.md "When a line moves on"), and the record names f once f is
// the key's version. Other clusters' logs are not judged: a third cluster
// that held a version of F's line other than f sees the two lines meet
// differently. A run with snapshots (re-seeds, wipes, restores, backfills)
// or dead letters replayed out of order may skip versions: the completeness
// run has none (deliveryFaults).
func (h *history) checkConflictsComplete(final map[string]client.Item, logs map[string][]client.Conflict) ([]string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	writers := map[string]map[string]bool{} // key -> clusters that may have written it
	acked := map[string][]ackedValue{}      // key -> acknowledged values written
	var ranges []*callRecord
	for i := range h.ops {
		op := &h.ops[i]
		if op.Outcome == outFailed {
			continue
		}
		if op.Kind == "range" {
			ranges = append(ranges, op)
		}
		for _, w := range op.writes() {
			if writers[w.key] == nil {
				writers[w.key] = map[string]bool{}
			}
			writers[w.key][op.Cluster] = true
			if st, ok := stampOf(op.Version); ok && op.Outcome == outOK && !w.del {
				acked[w.key] = append(acked[w.key], ackedValue{st, op.Cluster, w.value})
			}
		}
	}
	ranged := func(k string) bool {
		for _, r := range ranges {
			if r.covers(k) {
				return true
			}
		}
		return false
	}
	var bad []string
	keys, judged := 0, 0
	for k, f := range final {
		if len(writers[k]) != 2 || ranged(k) {
			continue
		}
		fs, ok := stampOf(f.Version)
		if !ok || !writers[k][fs.Origin] {
			continue
		}
		seen := map[string]entry.Stamp{}
		for _, d := range f.Descends {
			if ds, ok := stampOf(d); ok {
				seen[ds.Origin] = ds
			}
		}
		if len(seen) == 0 {
			bad = append(bad, fmt.Sprintf("%s's final version %s says nothing of what it descends from", k, f.Version))
			continue
		}
		keys++
		var last entry.Stamp // L's newest acknowledged value f had not seen
		for _, v := range acked[k] {
			l := v.st
			if v.cluster == fs.Origin || l.Compare(fs) >= 0 || v.value == string(f.Value) {
				continue // the final writer's own; or newer than the final one, which the history check flags
			}
			if d, ok := seen[l.Origin]; ok && l.HLC.Compare(d.HLC) <= 0 {
				continue // f's author had seen it
			}
			if last.Compare(l) < 0 {
				last = l
			}
		}
		if last.Origin == "" {
			continue
		}
		judged++
		found := false
		for _, c := range logs[fs.Origin] {
			lo, ok := stampOf(c.Loser.Version)
			found = found || (c.Key == k && c.Winner.Version == f.Version && ok && lo.Origin == last.Origin && lo.Compare(last) >= 0)
		}
		if !found {
			bad = append(bad, fmt.Sprintf("%s's log lacks %s's line lost to %s on %s: %s (or a later version of %s) was not seen by %s's author (descends from %v)",
				fs.Origin, last.Origin, f.Version, k, last, last.Origin, f.Version, f.Descends))
		}
	}
	if judged == 0 {
		bad = append(bad, fmt.Sprintf("completeness: no version to judge among %d keys written by two clusters: the check said nothing", keys))
	}
	return bad, fmt.Sprintf("completeness: %d of %d keys written by two clusters lost a line to their final version, %d missing from its writer's log", judged, keys, len(bad))
}

// opWrite is one key an op writes: a value, or a delete.
type opWrite struct {
	key, value string
	del        bool
}

// writes are the keys op writes, by key (none for counters and range
// deletes).
func (op *callRecord) writes() []opWrite {
	switch op.Kind {
	case "put", "cas":
		return []opWrite{{key: op.Key, value: op.Value}}
	case "del":
		return []opWrite{{key: op.Key, del: true}}
	case "batch":
		out := make([]opWrite, 0, len(op.Sets)+len(op.Dels))
		for _, s := range op.Sets {
			out = append(out, opWrite{key: s.K, value: s.V})
		}
		for _, k := range op.Dels {
			out = append(out, opWrite{key: k, del: true})
		}
		return out
	}
	return nil
}

// covers reports whether op is a range delete over k.
func (op *callRecord) covers(k string) bool {
	return op.Kind == "range" && k >= op.Key && (op.End == "" || k < op.End)
}

// ackedValue is a value an acknowledged write gave a key.
type ackedValue struct {
	st      entry.Stamp
	cluster string
	value   string
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

// TestCompletenessCheckerCatches: a key written by a and b, b's version
// final: a's value that b's had not seen must be in b's log; one it had
// seen must not be asked for.
func TestCompletenessCheckerCatches(t *testing.T) {
	h := &history{}
	h.add(callRecord{Kind: "put", Cluster: "a", Key: "p/ab/0", Value: "a-1", Outcome: outOK, Version: "100.0@a"})
	h.add(callRecord{Kind: "put", Cluster: "a", Key: "p/ab/0", Value: "a-2", Outcome: outOK, Version: "110.0@a"})
	h.add(callRecord{Kind: "put", Cluster: "b", Key: "p/ab/0", Value: "b-1", Outcome: outOK, Version: "200.0@b"})
	final := map[string]client.Item{"p/ab/0": {Key: "p/ab/0", Value: []byte("b-1"), Version: "200.0@b", Descends: []string{"100.0@a", "200.0@b"}}}
	rec := func(loser, winner string) client.Conflict {
		return client.Conflict{Key: "p/ab/0", Loser: client.ConflictVersion{Version: loser}, Winner: client.ConflictVersion{Version: winner}}
	}
	lost := rec("110.0@a", "200.0@b")
	for _, logs := range []map[string][]client.Conflict{
		{"b": {lost}},
		{"b": {rec("120.0@a", "200.0@b")}}, // a later version of a, its answer lost
	} {
		if bad, _ := h.checkConflictsComplete(final, logs); len(bad) != 0 {
			t.Fatalf("flagged a complete log %v: %v", logs, bad)
		}
	}
	for _, logs := range []map[string][]client.Conflict{
		{"a": {lost}},                      // not at b
		{"b": {rec("100.0@a", "200.0@b")}}, // an older version of a's line
		{"b": {rec("110.0@a", "150.0@b")}}, // not against the final version
	} {
		if bad, _ := h.checkConflictsComplete(final, logs); len(bad) != 1 {
			t.Fatalf("%v: %v", logs, bad)
		}
	}
	final["p/ab/0"] = client.Item{Key: "p/ab/0", Value: []byte("b-1"), Version: "200.0@b", Descends: []string{"110.0@a", "200.0@b"}}
	if bad, _ := h.checkConflictsComplete(final, map[string][]client.Conflict{"b": {lost}}); len(bad) != 1 || !strings.Contains(bad[0], "no version to judge") {
		t.Fatalf("a final version that had seen every other: %v", bad)
	}
}

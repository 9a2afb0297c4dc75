package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
)

// Outcomes of a recorded call.
const (
	outOK      = "ok"      // acknowledged
	outFailed  = "failed"  // definitely refused (4xx): no effect
	outUnknown = "unknown" // may or may not have taken effect
)

// callRecord is one client call as the client saw it.
type callRecord struct {
	Client  string   `json:"client"`
	Cluster string   `json:"cluster"`
	Kind    string   `json:"kind"` // put, del, cas, incr, range, batch
	Key     string   `json:"key,omitempty"`
	End     string   `json:"end,omitempty"`
	Value   string   `json:"value,omitempty"`
	Sets    []kv     `json:"sets,omitempty"` // batch
	Dels    []string `json:"dels,omitempty"` // batch
	Delta   int64    `json:"delta,omitempty"`
	IdemKey string   `json:"idem,omitempty"`
	// Prev is the version a cas's If-Match named: its author held it.
	Prev    string    `json:"prev,omitempty"`
	Outcome string    `json:"outcome"`
	Version string    `json:"version,omitempty"`
	Err     string    `json:"err,omitempty"`
	Start   time.Time `json:"start"`
	End2    time.Time `json:"end_time"`
}

type kv struct {
	K string `json:"k"`
	V string `json:"v"`
}

// outcomeOf classifies a call's final error.
func outcomeOf(err error) string {
	if err == nil {
		return outOK
	}
	var ce *client.Error
	if errors.As(err, &ce) && ce.Status >= 400 && ce.Status < 500 {
		return outFailed
	}
	return outUnknown
}

type history struct {
	mu  sync.Mutex
	ops []callRecord
}

func (h *history) add(op callRecord) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

func (h *history) write(path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, op := range h.ops {
		enc.Encode(op)
	}
	return nil
}

func (h *history) counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := map[string]int{}
	for _, op := range h.ops {
		c[op.Kind+"/"+op.Outcome]++
	}
	return c
}

func stampOf(v string) (entry.Stamp, bool) {
	st, err := entry.ParseStamp(v)
	return st, err == nil
}

// effect is what an acknowledged op did to one key, with its stamp.
type effect struct {
	st    entry.Stamp
	value string // "" for a delete
	op    *callRecord
}

// excuse applies the one exception to the checker's rules: a wipe or a
// restore destroys what existed only on the lost directory. A write its
// node acknowledged before the kill, stamped above what every peer held of
// the node's stream then (and, for a restore, above every write the node
// acknowledged before the backup), may be lost: it becomes an unknown
// outcome. Writes of the node's next life are stamped after the restart (a
// second after the kill, by clocks at most 0.3 s apart) and never excused.
// It returns how many acknowledged writes it excused.
func (h *history) excuse(ex []excuse) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range ex {
		// What the backup held: every write acknowledged before it.
		var inBackup entry.Stamp
		if !e.BackupStop.IsZero() {
			for i := range h.ops {
				op := &h.ops[i]
				if st, ok := stampOf(op.Version); ok && op.Cluster == e.Cluster && op.Outcome == outOK &&
					op.End2.Before(e.BackupStop) && inBackup.Compare(st) < 0 {
					inBackup = st
				}
			}
		}
		maxStamp := func(a, b entry.Stamp) entry.Stamp {
			if a.Compare(b) < 0 {
				return b
			}
			return a
		}
		for i := range h.ops {
			op := &h.ops[i]
			st, ok := stampOf(op.Version)
			if !ok || op.Cluster != e.Cluster || op.Outcome != outOK || !op.Start.Before(e.Before) ||
				st.HLC.Wall >= e.Before.Add(500*time.Millisecond).UnixNano() {
				continue
			}
			above := e.Above
			for _, pa := range e.Prefixes {
				if op.touches([]string{pa.Prefix}) && pa.Above.Compare(above) < 0 {
					above = pa.Above
				}
			}
			if st.Compare(maxStamp(above, inBackup)) <= 0 {
				continue
			}
			op.Outcome = outUnknown
			op.Err = "excused: " + e.Why
			n++
		}
	}
	return n
}

// touches reports whether the call wrote a key under one of prefixes.
func (op *callRecord) touches(prefixes []string) bool {
	under := func(k string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				return true
			}
		}
		return false
	}
	if op.Kind == "range" {
		for _, p := range prefixes {
			// [Key, End) meets the prefix's range.
			if (op.End == "" || p < op.End) && (op.Key < p || under(op.Key)) {
				return true
			}
		}
		return false
	}
	if op.Key != "" && under(op.Key) {
		return true
	}
	for _, s := range op.Sets {
		if under(s.K) {
			return true
		}
	}
	for _, k := range op.Dels {
		if under(k) {
			return true
		}
	}
	return false
}

// check judges the history against the final state (equal on every
// cluster, checked by digest before this runs). It returns every violation.
func (h *history) check(final map[string]client.Item, counters map[string]int64, keySpace []string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var bad []string
	acked := map[string][]effect{}          // key -> acknowledged effects
	written := map[string]map[string]bool{} // key -> values any possibly-applied op wrote
	maybeDeleted := map[string]bool{}       // a delete of unknown outcome may cover it
	note := func(k, v string) {
		if written[k] == nil {
			written[k] = map[string]bool{}
		}
		written[k][v] = true
	}
	var ackedInc = map[string]int64{}
	var unknownInc = map[string]int64{}
	byCluster := map[string]map[string]int64{} // counter -> cluster -> acknowledged
	for i := range h.ops {
		op := &h.ops[i]
		if op.Outcome == outFailed {
			continue
		}
		st, hasStamp := stampOf(op.Version)
		ok := op.Outcome == outOK && hasStamp
		switch op.Kind {
		case "put", "cas":
			note(op.Key, op.Value)
			if ok {
				acked[op.Key] = append(acked[op.Key], effect{st, op.Value, op})
			}
		case "del":
			if ok {
				acked[op.Key] = append(acked[op.Key], effect{st, "", op})
			} else {
				maybeDeleted[op.Key] = true
			}
		case "range":
			for _, k := range keySpace {
				if k >= op.Key && (op.End == "" || k < op.End) {
					if ok {
						acked[k] = append(acked[k], effect{st, "", op})
					} else {
						maybeDeleted[k] = true
					}
				}
			}
		case "batch":
			for _, s := range op.Sets {
				note(s.K, s.V)
				if ok {
					acked[s.K] = append(acked[s.K], effect{st, s.V, op})
				}
			}
			for _, k := range op.Dels {
				if ok {
					acked[k] = append(acked[k], effect{st, "", op})
				} else {
					maybeDeleted[k] = true
				}
			}
		case "incr":
			if op.Outcome == outOK {
				ackedInc[op.Key] += op.Delta
				if byCluster[op.Key] == nil {
					byCluster[op.Key] = map[string]int64{}
				}
				byCluster[op.Key][op.Cluster] += op.Delta
			} else {
				unknownInc[op.Key] += op.Delta
			}
		}
	}
	// Every value held was written by some client (a counter reads as its
	// value too: judged below; the keys of the combined schedule's own
	// workloads are judged by them).
	for k, it := range final {
		_, inc := ackedInc[k]
		_, maybe := unknownInc[k]
		_, ctr := counters[k]
		if inc || maybe || ctr || ownWorkload(k) {
			continue
		}
		if !written[k][string(it.Value)] {
			bad = append(bad, fmt.Sprintf("key %s holds %q, which no client wrote", k, it.Value))
		}
	}
	// Every acknowledged write is there unless a higher stamp superseded it.
	for k, effs := range acked {
		sort.Slice(effs, func(i, j int) bool { return effs[i].st.Compare(effs[j].st) > 0 })
		top := effs[0]
		it, present := final[k]
		switch {
		case present:
			fst, ok := stampOf(it.Version)
			if !ok {
				bad = append(bad, fmt.Sprintf("key %s holds unparsable version %q", k, it.Version))
				continue
			}
			c := fst.Compare(top.st)
			if c < 0 {
				bad = append(bad, fmt.Sprintf("key %s holds version %s, older than acknowledged %s %s (%s)", k, it.Version, top.op.Kind, top.st, top.op.Client))
			}
			if c == 0 && (top.value == "" || string(it.Value) != top.value) {
				bad = append(bad, fmt.Sprintf("key %s holds %q at the version of an acknowledged %s that wrote %q", k, it.Value, top.op.Kind, top.value))
			}
		case top.value != "" && !maybeDeleted[k]:
			// Gone, though the newest acknowledged effect is a set: only a
			// newer delete may explain it, and none was acknowledged.
			bad = append(bad, fmt.Sprintf("acknowledged %s of %s = %q (%s) is lost: the key is absent and no newer delete was made", top.op.Kind, k, top.value, top.st))
		}
	}
	// Counters: the acknowledged increments plus a subset of the unknown ones.
	for k, v := range counters {
		lo, hi := ackedInc[k], ackedInc[k]+unknownInc[k]
		if v < lo || v > hi {
			bad = append(bad, fmt.Sprintf("counter %s = %d, outside [%d acknowledged, %d with every unknown increment]; acknowledged by cluster %v",
				k, v, lo, hi, byCluster[k]))
		}
	}
	for k, v := range ackedInc {
		if _, ok := counters[k]; !ok && v > 0 {
			bad = append(bad, fmt.Sprintf("counter %s missing, %d acknowledged", k, v))
		}
	}
	return bad
}

// ownWorkload reports a key of a workload with a checker of its own
// (the combined schedule's transactions, WATCH loops and counter deletes).
func ownWorkload(k string) bool {
	for _, p := range []string{"tx/", "tw/", "cd/", comboThird + "tx-"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

func shorten(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// TestCheckerCatchesViolations feeds the checker histories that break each
// rule: a checker that cannot fail proves nothing.
func TestCheckerCatchesViolations(t *testing.T) {
	v := func(wall int64, origin string) string { return fmt.Sprintf("%d.0@%s", wall, origin) }
	h := &history{ops: []callRecord{
		{Kind: "put", Key: "k/01", Value: "x", Outcome: outOK, Version: v(10, "a")},
		{Kind: "put", Key: "k/02", Value: "y", Outcome: outOK, Version: v(20, "a")},
		{Kind: "put", Key: "k/03", Value: "z", Outcome: outFailed},
		{Kind: "incr", Key: "ctr/0", Delta: 1, Outcome: outOK},
		{Kind: "incr", Key: "ctr/0", Delta: 1, Outcome: outUnknown},
		{Kind: "put", Key: "k/05", Value: "w", Outcome: outOK, Version: v(30, "a")},
		{Kind: "del", Key: "k/05", Outcome: outOK, Version: v(40, "b")},
	}}
	final := map[string]client.Item{
		// k/01 lost (absent, no delete)
		"k/02": {Key: "k/02", Value: []byte("y"), Version: v(15, "a")}, // older than acknowledged
		"k/03": {Key: "k/03", Value: []byte("z"), Version: v(50, "a")}, // written by a refused call
		"k/04": {Key: "k/04", Value: []byte("ghost"), Version: v(5, "c")},
		"k/05": {Key: "k/05", Value: []byte("w"), Version: v(30, "a")}, // resurrected over a newer delete
	}
	bad := h.check(final, map[string]int64{"ctr/0": 3}, []string{"k/01", "k/02", "k/03", "k/04", "k/05"})
	for _, want := range []string{"k/01", "k/02 holds version", "k/03 holds \"z\"", "k/04 holds \"ghost\"", "k/05 holds version", "counter ctr/0 = 3"} {
		found := false
		for _, b := range bad {
			if strings.Contains(b, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("the checker missed %q; it said: %q", want, bad)
		}
	}
	// and the same history with a state that honours it passes
	ok := map[string]client.Item{
		"k/01": {Key: "k/01", Value: []byte("x"), Version: v(10, "a")},
		"k/02": {Key: "k/02", Value: []byte("y"), Version: v(20, "a")},
	}
	if bad := h.check(ok, map[string]int64{"ctr/0": 2}, nil); len(bad) != 0 {
		t.Fatalf("a valid state judged bad: %q", bad)
	}
}

// TestExcuseIsExact: the wipe/restore exception excuses exactly the writes
// the lost node acknowledged above what its peers held (and above its
// backup), before the kill; nothing of other nodes, nothing the peers had,
// nothing of its next life.
func TestExcuseIsExact(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	v := func(ms int, origin string) string { return fmt.Sprintf("%d.0@%s", at(ms).UnixNano(), origin) }
	h := &history{ops: []callRecord{
		{Cluster: "a", Kind: "put", Key: "k/01", Value: "in-backup", Outcome: outOK, Version: v(100, "a"), Start: at(90), End2: at(110)},
		{Cluster: "a", Kind: "put", Key: "k/02", Value: "peers-had", Outcome: outOK, Version: v(300, "a"), Start: at(290), End2: at(310)},
		{Cluster: "a", Kind: "put", Key: "k/03", Value: "lost", Outcome: outOK, Version: v(600, "a"), Start: at(590), End2: at(610)},
		{Cluster: "a", Kind: "incr", Key: "ctr/0", Delta: 1, Outcome: outOK, Version: v(610, "a"), Start: at(605), End2: at(615)},
		{Cluster: "b", Kind: "put", Key: "k/04", Value: "other", Outcome: outOK, Version: v(700, "b"), Start: at(690), End2: at(710)},
		{Cluster: "a", Kind: "put", Key: "k/05", Value: "next-life", Outcome: outOK, Version: v(2000, "a"), Start: at(1900), End2: at(2010)},
	}}
	above, _ := entry.ParseStamp(v(400, "a")) // peers held up to 400
	n := h.excuse([]excuse{{Cluster: "a", Above: above, Before: at(800), BackupStop: at(200), Why: "restore"}})
	if n != 2 {
		t.Fatalf("excused %d writes, want 2 (k/03 and the increment)", n)
	}
	want := map[string]string{"k/01": outOK, "k/02": outOK, "k/03": outUnknown, "ctr/0": outUnknown, "k/04": outOK, "k/05": outOK}
	for _, op := range h.ops {
		if op.Outcome != want[op.Key] {
			t.Errorf("%s: %s, want %s", op.Key, op.Outcome, want[op.Key])
		}
	}
	// The lost write may be absent now; the others may not.
	final := map[string]client.Item{
		"k/02": {Key: "k/02", Value: []byte("peers-had"), Version: v(300, "a")},
		"k/04": {Key: "k/04", Value: []byte("other"), Version: v(700, "b")},
		"k/05": {Key: "k/05", Value: []byte("next-life"), Version: v(2000, "a")},
	}
	bad := h.check(final, map[string]int64{"ctr/0": 0}, nil)
	if len(bad) != 1 || !strings.Contains(bad[0], "k/01") {
		t.Fatalf("violations %q, want exactly the write the backup held (k/01)", bad)
	}
}

// TestExcuseUnderAPrefixKeptHome: writes under a prefix some link kept
// home are excused above what the peers held of it (a filtered marker
// counts in a frontier), the others above the frontier as ever; writes in
// the backup never.
func TestExcuseUnderAPrefixKeptHome(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	v := func(ms int, origin string) string { return fmt.Sprintf("%d.0@%s", at(ms).UnixNano(), origin) }
	h := &history{ops: []callRecord{
		{Cluster: "c", Kind: "incr", Key: "ctr/1", Delta: 1, Outcome: outOK, Version: v(100, "c"), Start: at(90), End2: at(110)},
		{Cluster: "c", Kind: "incr", Key: "ctr/1", Delta: 1, Outcome: outOK, Version: v(3000, "c"), Start: at(2990), End2: at(3010)},
		{Cluster: "c", Kind: "incr", Key: "ctr/1", Delta: 1, Outcome: outOK, Version: v(5000, "c"), Start: at(4990), End2: at(5010)},
		{Cluster: "c", Kind: "put", Key: "k/2", Value: "crossed", Outcome: outOK, Version: v(5000, "c"), Start: at(4990), End2: at(5010)},
		{Cluster: "c", Kind: "batch", Sets: []kv{{K: "k/2"}, {K: "w/1x"}}, Outcome: outOK, Version: v(5100, "c"), Start: at(5090), End2: at(5110)},
		{Cluster: "c", Kind: "range", Key: "a/", End: "l/", Outcome: outOK, Version: v(5200, "c"), Start: at(5190), End2: at(5210)},
		{Cluster: "a", Kind: "incr", Key: "ctr/1", Delta: 1, Outcome: outOK, Version: v(5000, "a"), Start: at(4990), End2: at(5010)},
		{Cluster: "c", Kind: "put", Key: "k/3", Value: "lost", Outcome: outOK, Version: v(6500, "c"), Start: at(6490), End2: at(6510)},
	}}
	above, _ := entry.ParseStamp(v(6000, "c")) // the frontier
	pa, _ := entry.ParseStamp(v(1500, "c"))    // under ctr/1, k/1 and w/1
	n := h.excuse([]excuse{{Cluster: "c", Above: above, Before: at(7000), BackupStop: at(4000), Why: "restore",
		Prefixes: []prefixAbove{{Prefix: "ctr/1", Above: pa}, {Prefix: "k/1", Above: pa}, {Prefix: "w/1", Above: pa}}}})
	want := []string{outOK, outOK, outUnknown, outOK, outUnknown, outUnknown, outOK, outUnknown}
	for i, op := range h.ops {
		if op.Outcome != want[i] {
			t.Errorf("call %d (%s %s at %s): %s, want %s", i, op.Kind, op.Key, op.Cluster, op.Outcome, want[i])
		}
	}
	if n != 4 {
		t.Fatalf("excused %d, want 4", n)
	}
}

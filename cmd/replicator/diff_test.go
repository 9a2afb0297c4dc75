package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
)

// passes plays a node whose divergence takes several repair passes: each
// answer is the next of reps (the last one again once they run out).
func passes(t *testing.T, reps ...api.DiffReport) (*client.Client, func() int) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/admin/peers/b/diff" || r.URL.Query().Get("repair") != "true" {
			t.Errorf("asked %s %s", r.Method, r.URL)
		}
		mu.Lock()
		rep := reps[min(n, len(reps)-1)]
		n++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	}))
	t.Cleanup(srv.Close)
	return client.New(srv.URL, nil), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// TestRepairGoesOnUntilNothingRepairableRemains (issue 49, 6): a pass
// compares at most 65,536 differing leaves; `replicator repair` used to
// exit 0 after the first, a third of the work. It now repairs pass after
// pass, a line of progress each, until a pass that compared every
// differing leaf repaired nothing (what it still lists no repair may
// copy), and says what it repaired in all; --max-passes bounds it, and a
// run stopped by it is not a success.
func TestRepairGoesOnUntilNothingRepairableRemains(t *testing.T) {
	maybe := []api.Divergence{{Key: "k", Lacks: api.LacksMaybeDeleted}}
	reps := []api.DiffReport{
		{Peer: "b", LeavesDiffering: 180000, LeavesCompared: 65536, Truncated: true, Repaired: 65000},
		{Peer: "b", LeavesDiffering: 115000, LeavesCompared: 65536, Truncated: true, Repaired: 65100},
		{Peer: "b", LeavesDiffering: 50000, LeavesCompared: 50000, Repaired: 49900, Divergent: maybe},
		{Peer: "b", LeavesDiffering: 1, LeavesCompared: 1, Repaired: 0, Divergent: maybe},
	}
	c, asked := passes(t, reps...)
	var progress bytes.Buffer
	rep, n, done, err := repairAll(context.Background(), c, "b", 100, &progress)
	if err != nil || n != 4 || asked() != 4 || rep.Repaired != 65000+65100+49900 || !done || len(rep.Divergent) != 1 {
		t.Fatalf("repairAll: %d passes (%d asked), %+v, %v", n, asked(), rep, err)
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "the first 65536 of 180000 differing leaves compared") || !strings.Contains(lines[3], "(180000 in all)") {
		t.Fatalf("progress:\n%s", progress.String())
	}
	var table bytes.Buffer
	diffTable(&table, &reps[0], 10)
	if !strings.Contains(table.String(), "partial: the first 65536 of 180000 differing leaves compared; run it again") {
		t.Fatalf("a partial pass's table does not say so:\n%s", table.String())
	}

	// Bounded: two passes, and more remains.
	c, asked = passes(t, reps...)
	rep, n, done, err = repairAll(context.Background(), c, "b", 2, &progress)
	if err != nil || n != 2 || asked() != 2 || rep.Repaired != 65000+65100 || done {
		t.Fatalf("bounded: %d passes, %+v, %v", n, rep, err)
	}
	// A divergence one pass mends says nothing on stderr.
	progress.Reset()
	c, _ = passes(t, api.DiffReport{Peer: "b", Equal: true})
	if rep, n, done, err := repairAll(context.Background(), c, "b", 100, &progress); err != nil || n != 1 || !done || rep.Repaired != 0 || progress.Len() != 0 {
		t.Fatalf("an equal pair: %d passes, %+v, %v, progress %q", n, rep, err, progress.String())
	}
}

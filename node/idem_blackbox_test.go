package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/policy"
)

// TestScopedRetryTies: library writes under one scope are stamped with its
// pinned HLC, so a retry is an LWW tie: the stored stamp does not advance and
// the retry reports a duplicate.
func TestScopedRetryTies(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	o := opts(t.TempDir())
	o.Clock = pc
	n := nodetest.Open(t, o)
	defer n.Close()
	ctx, key := policy.NewScope(context.Background())
	key.HLC = hlc.Timestamp{Wall: pc.Now() - int64(time.Minute)}
	ctx = policy.WithKey(ctx, key)
	r1, err := n.Put(ctx, "orders/42", []byte("v"))
	if err != nil || r1.Outcome != entry.Applied {
		t.Fatalf("first attempt: %+v %v", r1, err)
	}
	pc.Advance(time.Second)
	r2, err := n.Put(ctx, "orders/42", []byte("v"))
	if err != nil || r2.Outcome != entry.Duplicate || r2.Version != r1.Version {
		t.Fatalf("retry: %+v %v (first %+v)", r2, err, r1)
	}
	rec, _ := n.Get("orders/42")
	if rec.Stamp.HLC != key.HLC || rec.Stamp.String() != r1.Version {
		t.Fatalf("stored stamp %s, want the pinned %s", rec.Stamp, key.HLC)
	}
	// A write outside the scope is stamped fresh and wins.
	r3, _ := n.Put(context.Background(), "orders/42", []byte("w"))
	if r3.Outcome != entry.Applied || r3.Version == r1.Version {
		t.Fatalf("unscoped write: %+v", r3)
	}
}

func TestPinOutOfWindowRefused(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	o := opts(t.TempDir())
	o.Clock = pc
	o.PinWindow = time.Hour
	n := nodetest.Open(t, o)
	defer n.Close()
	for name, pin := range map[string]hlc.Timestamp{
		"older than the pin window":         {Wall: pc.Now() - int64(time.Hour) - int64(time.Second)},
		"further ahead than the max offset": {Wall: pc.Now() + int64(time.Second)},
	} {
		ctx := policy.WithKey(context.Background(), policy.Key{ID: "k", HLC: pin})
		_, err := n.Put(ctx, "k", []byte("v"))
		if !errors.Is(err, api.ErrPinOutOfWindow) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if n.WALReport().Last != 0 {
		t.Fatalf("refused pinned writes reached the WAL (%d entries)", n.WALReport().Last)
	}
	if _, err := n.Get("k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("refused pinned write stored: %v", err)
	}
}

func keyedPut(t *testing.T, url, key, idem, value string) (int, map[string]any, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("PUT", url+"/v1/kv/"+key, strings.NewReader(value))
	req.Header.Set("Idempotency-Key", idem)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, resp.Header
}

// TestConcurrentFirstAttempts: many attempts of one keyed request at once
// write once; every other attempt replays the same answer.
func TestConcurrentFirstAttempts(t *testing.T) {
	n := nodetest.Start(t, opts(t.TempDir()))
	var wg sync.WaitGroup
	var mu sync.Mutex
	versions := map[string]int{}
	replayed := 0
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, out, h := keyedPut(t, n.URL(), "k", "same-key", "v")
			if st != 200 {
				t.Errorf("status %d %v", st, out)
				return
			}
			mu.Lock()
			versions[out["version"].(string)]++
			if h.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(versions) != 1 || replayed != 23 || n.WALReport().Last != 1 {
		t.Fatalf("versions %v, replayed %d, WAL entries %d; want one version, 23 replays, 1 entry", versions, replayed, n.WALReport().Last)
	}
	st, out, _ := keyedPut(t, n.URL(), "k", "same-key", "other value")
	if st != 422 || !strings.Contains(out["error"].(map[string]any)["code"].(string), "idempotency") {
		t.Fatalf("same key, other request: %d %v", st, out)
	}
	if n.WALReport().Last != 1 {
		t.Fatal("refused reuse wrote")
	}
	rep, err := n.Idempotency("same-key")
	if err != nil || rep.Status != 200 || !bytes.Contains(rep.Body, []byte(`"version"`)) {
		t.Fatalf("record: %+v %v", rep, err)
	}
	if _, err := n.Idempotency("never-used"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
}

func getRecord(t *testing.T, n *node.Node, key string) api.IdemReport {
	t.Helper()
	r, err := n.Idempotency(key)
	if err != nil {
		t.Fatalf("%s: %v", n.ClusterID(), err)
	}
	return r
}

// TestRetryAtPeerAfterReplication: the record rides in the WAL entry, so a
// retry sent to the other cluster replays and writes nothing anywhere.
func TestRetryAtPeerAfterReplication(t *testing.T) {
	m := nodetest.NewMesh(t, nil, nil, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	st, first, _ := keyedPut(t, "http://"+m.Addrs["a"], "orders/42", "K1", "hello")
	if st != 200 {
		t.Fatalf("%d %v", st, first)
	}
	m.Settle()
	la, lb := a.WALReport().Last, b.WALReport().Last
	st, again, h := keyedPut(t, "http://"+m.Addrs["b"], "orders/42", "K1", "hello")
	if st != 200 || h.Get("Idempotent-Replayed") != "true" || again["version"] != first["version"] {
		t.Fatalf("retry at b: %d %v %v (first %v)", st, again, h, first)
	}
	m.Settle()
	if a.WALReport().Last != la || b.WALReport().Last != lb {
		t.Fatalf("the replayed retry wrote: a %d->%d, b %d->%d", la, a.WALReport().Last, lb, b.WALReport().Last)
	}
	if ra, rb := getRecord(t, a, "K1"), getRecord(t, b, "K1"); ra.Version != rb.Version || !bytes.Equal(ra.Body, rb.Body) {
		t.Fatal("records differ")
	}
}

// TestRetryAtPeerBeforeReplication: the retry reaches b before a's write
// does, so b writes too. Both clusters converge to one value and stamp, and
// both records resolve to the same answer: the winning write's.
func TestRetryAtPeerBeforeReplication(t *testing.T) {
	m := nodetest.NewMesh(t, nil, nil, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	m.Cut("a", "b", true)
	m.Cut("b", "a", true)
	st1, r1, _ := keyedPut(t, "http://"+m.Addrs["a"], "orders/7", "K7", "pay 10")
	st2, r2, h2 := keyedPut(t, "http://"+m.Addrs["b"], "orders/7", "K7", "pay 10")
	if st1 != 200 || st2 != 200 || h2.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("attempts: %d %v / %d %v", st1, r1, st2, r2)
	}
	m.Cut("a", "b", false)
	m.Cut("b", "a", false)
	m.Settle()
	ra, _ := a.Get("orders/7")
	rb, _ := b.Get("orders/7")
	if ra.Stamp != rb.Stamp || string(ra.Value) != "pay 10" || string(rb.Value) != "pay 10" {
		t.Fatalf("not converged: a %s %q, b %s %q", ra.Stamp, ra.Value, rb.Stamp, rb.Value)
	}
	recA, recB := getRecord(t, a, "K7"), getRecord(t, b, "K7")
	if recA.Version != recB.Version || !bytes.Equal(recA.Body, recB.Body) || recA.Version != ra.Stamp.String() {
		t.Fatalf("records: a %+v, b %+v; the key holds %s", recA, recB, ra.Stamp)
	}
	// A further retry anywhere now replays the winner.
	_, r3, h3 := keyedPut(t, "http://"+m.Addrs["a"], "orders/7", "K7", "pay 10")
	if h3.Get("Idempotent-Replayed") != "true" || r3["version"] != recA.Version {
		t.Fatalf("retry after convergence: %v %v", r3, h3)
	}
}

package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/policy"
)

// TestLostResponseRetriedUnderKey: the answer to a keyed write is lost after
// the node wrote it; the client's retry under the same key is answered as a
// replay, and the WAL holds one entry.
func TestLostResponseRetriedUnderKey(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, false, "a", "b")
	m.start()
	a := m.nodes["a"]
	px := newFaultProxy(t, a.url, s)
	px.loseNextAcks(1)
	c := client.New(px.url(), &client.Options{Retry: policy.MustNew(policy.Options{InitialDelay: 10 * time.Millisecond})})
	ctx := policy.WithKey(context.Background(), policy.Key{ID: "order-42"})
	res, err := c.Put(ctx, "orders/42", []byte("paid"))
	if err != nil || !res.Replayed {
		t.Fatalf("retried write: %+v %v", res, err)
	}
	if px.lostAcks.Load() != 1 || px.forwarded.Load() != 2 {
		t.Fatalf("proxy forwarded %d, lost %d", px.forwarded.Load(), px.lostAcks.Load())
	}
	if w := walLast(t, a); w.Last != 1 {
		t.Fatalf("a's WAL holds %d entries for one keyed write", w.Last)
	}
	m.converge(30 * time.Second)
	v, err := m.nodes["b"].client().Get(bg(), "orders/42")
	if err != nil || v.Version != res.Version {
		t.Fatalf("b: %+v %v, want version %s", v, err, res.Version)
	}
}

// TestKeyedRetriesThroughLossyProxy: 1,000 keyed writes through a proxy that
// loses 30% of the answers, retried under their keys: every key is written
// exactly once (one WAL entry each) and both clusters hold them all.
func TestKeyedRetriesThroughLossyProxy(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, false, "a", "b")
	m.start()
	a, b := m.nodes["a"], m.nodes["b"]
	px := newFaultProxy(t, a.url, s)
	px.setLoseAck(0.3)
	c := client.New(px.url(), &client.Options{Retry: policy.MustNew(policy.Options{
		MaxAttempts: 12, InitialDelay: 5 * time.Millisecond, MaxDelay: 100 * time.Millisecond})})
	const total = 1000
	var replayed atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < total; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			ctx := policy.WithKey(context.Background(), policy.Key{ID: fmt.Sprintf("req-%04d", i)})
			res, err := c.Put(ctx, fmt.Sprintf("k/%04d", i), []byte(fmt.Sprint("value-", i)))
			if err != nil {
				t.Errorf("key %d: %v", i, err)
				return
			}
			if res.Replayed {
				replayed.Add(1)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if w := walLast(t, a); w.Last != total {
		t.Fatalf("a's WAL holds %d entries for %d keyed writes", w.Last, total)
	}
	m.converge(60 * time.Second)
	items, err := b.client().ScanAll(bg(), client.ScanOptions{Prefix: "k/"})
	if err != nil || len(items) != total {
		t.Fatalf("b holds %d of %d keys (%v)", len(items), total, err)
	}
	for _, it := range items {
		var i int
		fmt.Sscanf(it.Key, "k/%d", &i)
		if string(it.Value) != fmt.Sprint("value-", i) {
			t.Fatalf("%s = %q", it.Key, it.Value)
		}
	}
	checkAppliedOnce(t, b, a)
	if px.lostAcks.Load() == 0 || replayed.Load() == 0 {
		t.Fatalf("lost %d answers, %d replays: the faults did not happen", px.lostAcks.Load(), replayed.Load())
	}
	t.Logf("proxy lost %d answers; %d writes answered as replays; %d WAL entries", px.lostAcks.Load(), replayed.Load(), total)
}

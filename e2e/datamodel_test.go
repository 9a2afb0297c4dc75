package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/policy"
)

// TestDataModelConvergence runs a seeded random mix of every operation at
// two and three clusters at once, then demands equal digests, equal reads of
// every key, and counters equal to the sum of the acknowledged deltas.
func TestDataModelConvergence(t *testing.T) {
	for _, names := range [][]string{{"a", "b"}, {"a", "b", "c"}} {
		t.Run(fmt.Sprint(len(names), "clusters"), func(t *testing.T) {
			s := seed(t)
			m := newMesh(t, s, false, names...)
			m.start()
			var mu sync.Mutex
			sums := map[string]int64{}
			var wg sync.WaitGroup
			for ni, name := range names {
				for w := 0; w < 3; w++ {
					wg.Add(1)
					r := newRand(s + uint64(ni*7+w))
					c := m.nodes[name].client()
					go func() {
						defer wg.Done()
						for i := 0; i < 150; i++ {
							key := fmt.Sprintf("k/%02d", r.IntN(40))
							var err error
							switch op := r.IntN(100); {
							case op < 35:
								_, err = c.Put(bg(), key, []byte(fmt.Sprintf("%s-%d-%d", name, w, i)))
							case op < 45:
								_, err = c.Delete(bg(), key)
							case op < 55:
								// conditional write on what this cluster sees now
								v, gerr := c.Get(bg(), key)
								if gerr == nil {
									_, err = c.PutWith(bg(), key, []byte("cas-"+name), client.WriteOptions{IfMatch: v.Version})
								} else {
									_, err = c.PutWith(bg(), key, []byte("gos-"+name), client.WriteOptions{IfNoneMatch: true})
								}
								var ce *client.Error
								if errors.As(err, &ce) && ce.Status == 412 {
									err = nil // lost the race: a local, definite refusal
								}
							case op < 75:
								ck := fmt.Sprintf("ctr/%d", r.IntN(5))
								d := int64(r.IntN(9) - 3)
								if d == 0 {
									d = 1
								}
								_, err = c.Increment(bg(), ck, d)
								if err == nil {
									mu.Lock()
									sums[ck] += d
									mu.Unlock()
								}
							case op < 80:
								lo := r.IntN(40)
								_, err = c.DeleteRange(bg(), fmt.Sprintf("k/%02d", lo), fmt.Sprintf("k/%02d", lo+1+r.IntN(5)))
							default:
								ops := []client.BatchOp{}
								for j := 0; j < 1+r.IntN(4); j++ {
									k := fmt.Sprintf("k/%02d", r.IntN(40))
									if r.IntN(4) == 0 {
										ops = append(ops, client.DeleteOp(k))
									} else {
										ops = append(ops, client.SetOp(k, []byte(fmt.Sprintf("batch-%s-%d", name, i))))
									}
								}
								_, err = c.Batch(bg(), ops, "")
							}
							if err != nil {
								t.Errorf("%s: %v", name, err)
								return
							}
						}
					}()
				}
			}
			wg.Wait()
			m.converge(60 * time.Second)
			var first []client.Item
			for i, n := range names {
				items, err := m.nodes[n].client().ScanAll(bg(), client.ScanOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					first = items
					continue
				}
				if fmt.Sprint(items) != fmt.Sprint(first) {
					t.Fatalf("seed %d: %s reads differently from %s", s, n, names[0])
				}
			}
			for ck, want := range sums {
				for _, n := range names {
					v, err := m.nodes[n].client().Counter(bg(), ck)
					if err != nil || v.Value != want {
						t.Fatalf("seed %d: %s at %s = %d (%v), acknowledged deltas sum to %d", s, ck, n, v.Value, err, want)
					}
				}
			}
		})
	}
}

// TestCountersExactUnderFaults: increments under idempotency keys, through
// links that lose acks and duplicate batches, while either cluster is
// SIGKILLed and restarted; every increment is retried under its key until
// acknowledged, and the converged value is the sum of the deltas exactly.
func TestCountersExactUnderFaults(t *testing.T) {
	s := seed(t)
	r := newRand(s)
	m := newMesh(t, s, true, "a", "b")
	for _, px := range m.proxies {
		px.setLoseAck(0.2)
		px.setDup(0.2)
	}
	m.start()
	retry := policy.MustNew(policy.Options{MaxAttempts: 50, InitialDelay: 20 * time.Millisecond, MaxDelay: 300 * time.Millisecond})
	var want int64
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range m.names {
		for w := 0; w < 3; w++ {
			wg.Add(1)
			c := client.New(m.nodes[name].url, &client.Options{Retry: retry})
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					d := int64(1 + i%3)
					key := policy.Key{ID: fmt.Sprintf("inc-%s-%d-%d", name, w, i)}
					// Retried under the same key until acknowledged: across
					// kills, a retry of an applied increment replays it.
					for {
						_, err := c.Increment(policy.WithKey(context.Background(), key), "hits", d)
						if err == nil {
							mu.Lock()
							want += d
							mu.Unlock()
							break
						}
						time.Sleep(50 * time.Millisecond)
					}
				}
			}()
		}
	}
	for round := 0; round < 4; round++ {
		time.Sleep(time.Duration(200+r.IntN(300)) * time.Millisecond)
		victim := m.nodes[m.names[r.IntN(2)]]
		victim.kill()
		time.Sleep(time.Duration(50+r.IntN(200)) * time.Millisecond)
		victim.startReady()
	}
	cancel()
	wg.Wait()
	for _, px := range m.proxies {
		px.setLoseAck(0)
		px.setDup(0)
	}
	m.converge(60 * time.Second)
	for _, n := range m.names {
		v, err := m.nodes[n].client().Counter(bg(), "hits")
		if err != nil || v.Value != want {
			t.Fatalf("seed %d: counter at %s = %d (%v), the acknowledged increments sum to %d", s, n, v.Value, err, want)
		}
	}
	if want < 50 {
		t.Fatalf("only %d counted: the test did not run", want)
	}
	t.Logf("counter exact at %d on both clusters after 4 kills, lost acks and duplicated batches", want)
}

// TestRangeDeleteRacingWrites: c's older writes of keys in a range are held
// back while b deletes the range and a writes newer keys into it. After the
// link heals, exactly the older writes are gone everywhere.
func TestRangeDeleteRacingWrites(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, true, "a", "b", "c")
	m.start()
	a, b, c := m.nodes["a"], m.nodes["b"], m.nodes["c"]
	m.proxies["c->a"].setDown(true)
	m.proxies["c->b"].setDown(true)
	for i := 0; i < 20; i++ {
		if _, err := c.client().Put(bg(), fmt.Sprintf("r/old-%02d", i), []byte("old")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := b.client().DeleteRange(bg(), "r/", "r0"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	for i := 0; i < 20; i++ {
		if _, err := a.client().Put(bg(), fmt.Sprintf("r/new-%02d", i), []byte("new")); err != nil {
			t.Fatal(err)
		}
	}
	m.proxies["c->a"].setDown(false)
	m.proxies["c->b"].setDown(false)
	m.converge(60 * time.Second)
	for _, n := range m.names {
		items, err := m.nodes[n].client().ScanAll(bg(), client.ScanOptions{Prefix: "r/"})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) != 20 {
			t.Fatalf("%s holds %d keys in the range, want the 20 newer ones", n, len(items))
		}
		for _, it := range items {
			if string(it.Value) != "new" {
				t.Fatalf("%s: %s = %q survived the range delete", n, it.Key, it.Value)
			}
		}
	}
}

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
)

// keyHistory records the operations one writer sent to one key, in order,
// with what the writer learned of each.
type keyHistory struct {
	ops []histOp
}

type histOp struct {
	value []byte // nil for a delete
	acked bool   // false: failed call, outcome unknown
}

// allowed returns the states the key may be in: the effect of the last
// acknowledged op, or of any later op whose outcome is unknown. A nil
// element means "absent".
func (h *keyHistory) allowed() [][]byte {
	last := -1
	for i, op := range h.ops {
		if op.acked {
			last = i
		}
	}
	var out [][]byte
	if last < 0 {
		out = append(out, nil) // never acknowledged: absent is fine
	} else {
		out = append(out, h.ops[last].value)
	}
	for _, op := range h.ops[last+1:] {
		out = append(out, op.value)
	}
	return out
}

// TestCrashSafety drives concurrent writes (puts and deletes) at a real node,
// SIGKILLs it at random moments, restarts it, and checks after every restart
// that each key holds what its acknowledged history says it must.
func TestCrashSafety(t *testing.T) {
	s := seed(t)
	r := newRand(s)
	rounds := 20
	p := newProc(t, "a", "a")
	p.startReady()

	const writers, keysPerWriter = 8, 40
	var mu sync.Mutex
	hist := map[string]*keyHistory{}
	totalAcked := 0
	httpc := client.New(p.url, nil)

	for round := 0; round < rounds; round++ {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wg.Add(1)
			wr := newRand(s + uint64(round*100+w))
			go func(w int) {
				defer wg.Done()
				for seq := 0; ctx.Err() == nil; seq++ {
					key := fmt.Sprintf("w%d/k%02d", w, wr.IntN(keysPerWriter))
					var value []byte
					if wr.IntN(5) > 0 {
						value = []byte(fmt.Sprintf("r%d-w%d-s%d", round, w, seq))
					}
					mu.Lock()
					h := hist[key]
					if h == nil {
						h = &keyHistory{}
						hist[key] = h
					}
					h.ops = append(h.ops, histOp{value: value})
					idx := len(h.ops) - 1
					mu.Unlock()
					var err error
					if value != nil {
						_, err = httpc.Put(ctx, key, value)
					} else {
						_, err = httpc.Delete(ctx, key)
					}
					if err == nil {
						mu.Lock()
						h.ops[idx].acked = true
						totalAcked++
						mu.Unlock()
					}
				}
			}(w)
		}
		time.Sleep(time.Duration(30+r.IntN(400)) * time.Millisecond)
		p.kill()
		cancel()
		wg.Wait()
		p.startReady()
		checkHistories(t, s, round, httpc, hist)
	}
	if totalAcked < 1000 {
		t.Fatalf("only %d writes acknowledged over %d rounds: too few to mean anything", totalAcked, rounds)
	}
	t.Logf("%d rounds, %d acknowledged writes, none lost", rounds, totalAcked)
}

func checkHistories(t *testing.T, seed uint64, round int, c *client.Client, hist map[string]*keyHistory) {
	t.Helper()
	items, err := c.ScanAll(bg(), client.ScanOptions{})
	if err != nil {
		t.Fatalf("round %d: scan: %v", round, err)
	}
	state := map[string][]byte{}
	for _, it := range items {
		state[it.Key] = it.Value
	}
	for key, h := range hist {
		got, present := state[key]
		ok := false
		for _, a := range h.allowed() {
			if (a == nil && !present) || (a != nil && present && bytes.Equal(a, got)) {
				ok = true
				break
			}
		}
		if !ok {
			t.Fatalf("seed %d round %d: key %s holds %q (present=%v); allowed %q", seed, round, key, got, present, h.allowed())
		}
	}
	for key := range state {
		if hist[key] == nil {
			t.Fatalf("seed %d round %d: key %s was never written", seed, round, key)
		}
	}
}

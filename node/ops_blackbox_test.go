package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/nodetest"
)

func TestConditionalWrites(t *testing.T) {
	n := nodetest.Start(t, opts(t.TempDir()))
	ctx := context.Background()
	var pe *api.PreconditionError
	if _, err := n.PutIf(ctx, "cas", []byte("x"), api.Condition{IfMatch: "1.0@a"}); !errors.As(err, &pe) || pe.Current != "" {
		t.Fatalf("If-Match on an absent key: %v", err)
	}
	r1, err := n.PutIf(ctx, "cas", []byte("one"), api.Condition{IfNoneMatch: true})
	if err != nil {
		t.Fatalf("get-or-set on an absent key: %v", err)
	}
	if _, err := n.PutIf(ctx, "cas", []byte("two"), api.Condition{IfNoneMatch: true}); !errors.As(err, &pe) || pe.Current != r1.Version {
		t.Fatalf("get-or-set on an existing key: %v", err)
	}
	if _, err := n.PutIf(ctx, "cas", []byte("two"), api.Condition{IfMatch: "9.9@z"}); !errors.As(err, &pe) || pe.Current != r1.Version {
		t.Fatalf("set-if-version mismatch: %v", err)
	}
	r2, err := n.PutIf(ctx, "cas", []byte("two"), api.Condition{IfMatch: r1.Version})
	if err != nil {
		t.Fatalf("set-if-version match: %v", err)
	}
	if _, err := n.DeleteIf(ctx, "cas", api.Condition{IfMatch: r1.Version}); !errors.Is(err, api.ErrPrecondition) {
		t.Fatalf("delete-if-version with a stale version: %v", err)
	}
	if _, err := n.DeleteIf(ctx, "cas", api.Condition{IfMatch: r2.Version}); err != nil {
		t.Fatalf("delete-if-version: %v", err)
	}
	// Two conditional writes racing on one version: exactly one wins.
	r3, _ := n.Put(ctx, "race", []byte("base"))
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, err := n.PutIf(ctx, "race", []byte(fmt.Sprint(i)), api.Condition{IfMatch: r3.Version}); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if !errors.Is(err, api.ErrPrecondition) {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d conditional writes on one version won", wins)
	}
	// over HTTP: 412 carries the current version
	resp, b := nodetest.Do(t, "PUT", n.URL()+"/v1/kv/race", strings.NewReader("x"), "If-Match", `"nope"`)
	if resp.StatusCode != 412 || !strings.Contains(string(b), `"version":"`) || resp.Header.Get("ETag") == "" {
		t.Fatalf("HTTP 412: %d %s", resp.StatusCode, b)
	}
	resp, _ = nodetest.Do(t, "PUT", n.URL()+"/v1/kv/race", strings.NewReader("x"), "If-None-Match", `"v"`)
	if resp.StatusCode != 400 {
		t.Fatalf("If-None-Match other than *: %d", resp.StatusCode)
	}
}

func TestCountersAndKinds(t *testing.T) {
	n := nodetest.Start(t, opts(t.TempDir()))
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				d := int64(1)
				if i%5 == 0 {
					d = -2
				}
				if _, err := n.Increment(ctx, "hits", d); err != nil {
					t.Error(err)
				}
			}
		}(w)
	}
	wg.Wait()
	c, err := n.Counter("hits")
	want := int64(8 * (40*1 - 10*2))
	if err != nil || c.Value != want || c.Totals["a"].P != 8*40 || c.Totals["a"].N != 8*10*2 {
		t.Fatalf("counter %+v %v, want value %d", c, err, want)
	}
	n.Put(ctx, "plain", []byte("x"))
	if _, err := n.Increment(ctx, "plain", 1); !errors.Is(err, api.ErrNotInteger) {
		t.Fatalf("increment of a value that is not an integer: %v", err)
	}
	n.Put(ctx, "int", []byte("41"))
	if c, err := n.Increment(ctx, "int", 1); err != nil || c.Value != 42 {
		t.Fatalf("increment of an integer string: %+v %v", c, err)
	}
	// over HTTP
	resp, b := nodetest.Do(t, "POST", n.URL()+"/v1/counters/hits", strings.NewReader(`{"delta": 5}`))
	if resp.StatusCode != 200 || !strings.Contains(string(b), fmt.Sprintf(`"value":%d`, want+5)) {
		t.Fatalf("POST counter: %d %s", resp.StatusCode, b)
	}
	resp, b = nodetest.Do(t, "GET", n.URL()+"/v1/counters/hits", nil)
	var got api.CounterResult
	json.Unmarshal(b, &got)
	if resp.StatusCode != 200 || got.Value != want+5 {
		t.Fatalf("GET counter: %d %s", resp.StatusCode, b)
	}
	for body, status := range map[string]int{`{"delta": 0}`: 400, `{"delta": 1.5}`: 400, `{}`: 400, `{"delta":1,"x":2}`: 400, `nope`: 400} {
		resp, b := nodetest.Do(t, "POST", n.URL()+"/v1/counters/hits", strings.NewReader(body))
		if resp.StatusCode != status {
			t.Errorf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
	// Refused with the class's code, and a message without the product's
	// package prefixes (issue 48).
	if resp, b := nodetest.Do(t, "POST", n.URL()+"/v1/counters/plain", strings.NewReader(`{"delta":1}`)); resp.StatusCode != 409 ||
		!strings.Contains(string(b), `"code":"not_integer"`) || strings.Contains(string(b), "machine:") {
		t.Fatalf("HTTP increment of a value that is not an integer: %d %s", resp.StatusCode, b)
	}
	if resp, _ := nodetest.Do(t, "GET", n.URL()+"/v1/counters/none", nil); resp.StatusCode != 404 {
		t.Fatalf("absent counter: %d", resp.StatusCode)
	}
	// a keyed increment retried is counted once
	for i := 0; i < 3; i++ {
		nodetest.Do(t, "POST", n.URL()+"/v1/counters/keyed", strings.NewReader(`{"delta":7}`), "Idempotency-Key", "inc-1")
	}
	if c, _ := n.Counter("keyed"); c.Value != 7 {
		t.Fatalf("keyed increment retried: %d", c.Value)
	}
	// DELETE /v1/counters/{key} deletes the counter (and /v1/kv the same);
	// an increment after it counts from zero; a delete of nothing writes
	// nothing.
	if resp, b := nodetest.Do(t, "DELETE", n.URL()+"/v1/counters/keyed", nil); resp.StatusCode != 200 || !strings.Contains(string(b), `"version"`) {
		t.Fatalf("DELETE of a counter: %d %s", resp.StatusCode, b)
	}
	if resp, _ := nodetest.Do(t, "GET", n.URL()+"/v1/counters/keyed", nil); resp.StatusCode != 404 {
		t.Fatalf("a deleted counter reads %d", resp.StatusCode)
	}
	if resp, _ := nodetest.Do(t, "GET", n.URL()+"/v1/kv/hits", nil); resp.StatusCode != 200 {
		t.Fatalf("a counter through /v1/kv: %d", resp.StatusCode)
	}
	if _, err := n.Delete(ctx, "hits"); err != nil {
		t.Fatal(err)
	}
	last := n.WALReport().Last
	if res, err := n.Delete(ctx, "hits"); err != nil || res.Version != "" || n.WALReport().Last != last {
		t.Fatalf("a delete of a deleted counter: %+v %v (WAL %d -> %d)", res, err, last, n.WALReport().Last)
	}
	if c, err := n.Increment(ctx, "hits", 3); err != nil || c.Value != 3 {
		t.Fatalf("an increment after the delete: %+v %v", c, err)
	}
}

func TestAtomicBatchAndRangeDelete(t *testing.T) {
	n := nodetest.Start(t, opts(t.TempDir()))
	body := `{"ops":[{"op":"set","key":"t/1","value":"x"},{"op":"set","key":"t/2","value_b64":"AAE="},{"op":"delete","key":"t/3"}],"operation_id":"op-1"}`
	resp, b := nodetest.Do(t, "POST", n.URL()+"/v1/batch", strings.NewReader(body))
	if resp.StatusCode != 200 || n.WALReport().Last != 1 {
		t.Fatalf("batch: %d %s (WAL %d)", resp.StatusCode, b, n.WALReport().Last)
	}
	r1, _ := n.Get("t/1")
	r2, _ := n.Get("t/2")
	if string(r1.Value) != "x" || string(r2.Value) != "\x00\x01" || r1.Stamp != r2.Stamp {
		t.Fatalf("batch applied: %+v %+v", r1, r2)
	}
	resp, _ = nodetest.Do(t, "POST", n.URL()+"/v1/batch", strings.NewReader(body))
	if resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || n.WALReport().Last != 1 {
		t.Fatalf("same operation_id again: %d %v", resp.StatusCode, resp.Header)
	}
	other := strings.Replace(body, `"value":"x"`, `"value":"y"`, 1)
	if resp, _ = nodetest.Do(t, "POST", n.URL()+"/v1/batch", strings.NewReader(other)); resp.StatusCode != 422 {
		t.Fatalf("operation_id reused for other ops: %d", resp.StatusCode)
	}
	for _, bad := range []string{`{"ops":[]}`, `{"ops":[{"op":"upsert","key":"k"}]}`, `{"ops":[{"op":"delete","key":"k","value":"v"}]}`,
		`{"ops":[{"op":"set","key":""}]}`, `{"ops":[{"op":"set","key":"k","value":"a","value_b64":"YQ=="}]}`, `[1]`} {
		if resp, _ := nodetest.Do(t, "POST", n.URL()+"/v1/batch", strings.NewReader(bad)); resp.StatusCode != 400 && resp.StatusCode != 413 {
			t.Errorf("%s: %d", bad, resp.StatusCode)
		}
	}
	if n.WALReport().Last != 1 {
		t.Fatalf("refused batches wrote: %d", n.WALReport().Last)
	}
	// the same key twice in one batch: the last op wins
	if _, err := n.Batch(context.Background(), []api.BatchOp{{Key: "dup", Value: []byte("first")}, {Key: "dup", Delete: true}, {Key: "dup", Value: []byte("last")}}); err != nil {
		t.Fatal(err)
	}
	if r, _ := n.Get("dup"); string(r.Value) != "last" {
		t.Fatalf("a key twice in a batch: %q", r.Value)
	}
	// range delete
	for i := 0; i < 10; i++ {
		n.Put(context.Background(), fmt.Sprintf("r/%d", i), []byte("v"))
	}
	resp, b = nodetest.Do(t, "DELETE", n.URL()+"/v1/kv?start=r/3&end=r/7", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("range delete: %d %s", resp.StatusCode, b)
	}
	items, _, _ := n.Scan(storeScan("r/"))
	if len(items) != 6 {
		t.Fatalf("after deleting r/3..r/6: %d keys left", len(items))
	}
	if resp, _ = nodetest.Do(t, "DELETE", n.URL()+"/v1/kv?prefix=r/", nil); resp.StatusCode != 200 {
		t.Fatalf("prefix delete: %d", resp.StatusCode)
	}
	if items, _, _ := n.Scan(storeScan("r/")); len(items) != 0 {
		t.Fatalf("after the prefix delete: %d keys", len(items))
	}
	if resp, _ = nodetest.Do(t, "DELETE", n.URL()+"/v1/kv?start=z&end=a", nil); resp.StatusCode != 400 {
		t.Fatalf("empty range: %d", resp.StatusCode)
	}
}

func TestBulkLoad(t *testing.T) {
	n := nodetest.Start(t, opts(t.TempDir()))
	var sb strings.Builder
	for i := 0; i < 2500; i++ {
		fmt.Fprintf(&sb, `{"key":"bulk/%05d","value":"v%d"}`+"\n", i, i)
	}
	resp, b := nodetest.Do(t, "POST", n.URL()+"/v1/bulk", strings.NewReader(sb.String()), "Content-Type", "application/x-ndjson")
	var res api.BulkResult
	json.Unmarshal(b, &res)
	if resp.StatusCode != 200 || res.Loaded != 2500 || res.Batches != 3 {
		t.Fatalf("bulk: %d %s", resp.StatusCode, b)
	}
	if items, _, _ := n.Scan(storeScanLimit("bulk/", 10000)); len(items) != 2500 {
		t.Fatalf("bulk loaded %d keys", len(items))
	}
	resp, b = nodetest.Do(t, "POST", n.URL()+"/v1/bulk", strings.NewReader("k1,v1\nk2,\"v,2\"\n"), "Content-Type", "text/csv")
	if resp.StatusCode != 200 {
		t.Fatalf("csv: %d %s", resp.StatusCode, b)
	}
	if r, _ := n.Get("k2"); string(r.Value) != "v,2" {
		t.Fatalf("csv value %q", r.Value)
	}
	resp, b = nodetest.Do(t, "POST", n.URL()+"/v1/bulk", strings.NewReader(`{"key":"ok","value":"1"}`+"\n"+`{"key":"bad"`+"\n"), "Content-Type", "application/x-ndjson")
	if resp.StatusCode != 400 || !strings.Contains(string(b), "line 2") || !strings.Contains(string(b), "1 records were loaded") {
		t.Fatalf("malformed line: %d %s", resp.StatusCode, b)
	}
}

// TestBatchNeverPartlyVisible polls a peer while atomic batches replicate:
// every read sees all of a batch's keys at one version, or none.
func TestBatchNeverPartlyVisible(t *testing.T) {
	m := nodetest.NewMesh(t, nil, nil, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	stop := make(chan struct{})
	var violations []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			items, _, err := b.Scan(storeScanLimit("g/", 10000))
			if err != nil {
				continue
			}
			versions := map[string]int{}
			for _, it := range items {
				versions[it.Stamp.String()]++
			}
			for v, c := range versions {
				if c != 20 {
					violations = append(violations, fmt.Sprintf("version %s on %d of 20 keys", v, c))
				}
			}
		}
	}()
	for i := 0; i < 100; i++ {
		ops := make([]api.BatchOp, 20)
		for j := range ops {
			ops[j] = api.BatchOp{Key: fmt.Sprintf("g/%02d", j), Value: []byte(fmt.Sprint(i))}
		}
		if _, err := a.Batch(context.Background(), ops); err != nil {
			t.Fatal(err)
		}
	}
	m.Settle()
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(violations) > 0 {
		t.Fatalf("a reader saw part of a batch: %v", violations[:min(5, len(violations))])
	}
}

func storeScan(prefix string) api.ScanOptions {
	return api.ScanOptions{Prefix: prefix, Limit: 1000}
}

func storeScanLimit(prefix string, limit int) api.ScanOptions {
	return api.ScanOptions{Prefix: prefix, Limit: limit}
}

package node_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
)

// TestHTTPExpiry: a PUT's expiry over HTTP and the Go client, at a node
// whose clock the test moves: X-Replicator-TTL counts from the node's clock,
// X-Replicator-Expires is absolute, a GET answers the version's expiry, an
// expired key answers 404 and leaves scans; bad expiries are 400 with
// nothing written; an Idempotency-Key's fingerprint covers the TTL asked.
func TestHTTPExpiry(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	pc := hlc.NewManualClock(t0.UnixNano())
	o := opts(t.TempDir())
	o.Clock = pc
	n := nodetest.Start(t, o)
	ctx := context.Background()
	c := client.New(n.URL(), nil)

	if _, err := c.PutWith(ctx, "ttl", []byte("v"), client.WriteOptions{TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx, "ttl")
	if err != nil || !v.Expires.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("GET after a put with a TTL of 10 s: expires %v (%v), want %v", v.Expires, err, t0.Add(10*time.Second))
	}
	at := t0.Add(time.Hour)
	if _, err := c.PutWith(ctx, "at", []byte("v"), client.WriteOptions{ExpiresAt: at}); err != nil {
		t.Fatal(err)
	}
	resp, _ := nodetest.Do(t, http.MethodGet, n.URL()+"/v1/kv/at", nil)
	if got := resp.Header.Get("X-Replicator-Expires"); got != at.UTC().Format(time.RFC3339Nano) {
		t.Fatalf("X-Replicator-Expires %q, want %s", got, at.UTC().Format(time.RFC3339Nano))
	}
	if _, err := c.Put(ctx, "plain", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Get(ctx, "plain"); !v.Expires.IsZero() {
		t.Fatalf("a put without an expiry answers one: %v", v.Expires)
	}

	for name, hdr := range map[string][]string{
		"negative TTL":   {"X-Replicator-TTL", "-5s"},
		"not a TTL":      {"X-Replicator-TTL", "soon"},
		"both":           {"X-Replicator-TTL", "5s", "X-Replicator-Expires", at.Format(time.RFC3339)},
		"not RFC 3339":   {"X-Replicator-Expires", "tomorrow"},
		"before 1970":    {"X-Replicator-Expires", "1969-01-01T00:00:00Z"},
		"past the range": {"X-Replicator-TTL", "2562047h"},
	} {
		resp, body := nodetest.Do(t, http.MethodPut, n.URL()+"/v1/kv/bad", strings.NewReader("v"), hdr...)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, body)
		}
	}
	if resp, body := nodetest.Do(t, http.MethodDelete, n.URL()+"/v1/kv/plain", nil, "X-Replicator-TTL", "5s"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a delete with a TTL: %d %s", resp.StatusCode, body)
	}
	if _, err := c.Get(ctx, "bad"); !client.IsNotFound(err) {
		t.Fatalf("a refused expiry wrote: %v", err)
	}

	// An Idempotency-Key: the same TTL replays, another is a conflict.
	put := func(ttl string) int {
		resp, _ := nodetest.Do(t, http.MethodPut, n.URL()+"/v1/kv/keyed", strings.NewReader("v"),
			"Idempotency-Key", "k-1", "X-Replicator-TTL", ttl)
		return resp.StatusCode
	}
	if a, b, c := put("30s"), put("30s"), put("60s"); a != 200 || b != 200 || c != http.StatusUnprocessableEntity {
		t.Fatalf("keyed puts with TTLs 30s, 30s, 60s: %d %d %d", a, b, c)
	}

	// A batch's ops take an expiry each: a TTL from the node's clock, or a
	// time; a keyed batch retried later replays (its fingerprint holds the
	// TTL asked, not the time it ends at).
	batch := []client.BatchOp{client.SetOp("b/ttl", []byte("v")).WithTTL(10 * time.Second),
		client.SetOp("b/at", []byte("v")).ExpiringAt(at), client.SetOp("b/plain", []byte("v"))}
	if _, err := c.Batch(ctx, batch, "op-ttl"); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]time.Time{"b/ttl": t0.Add(10 * time.Second), "b/at": at, "b/plain": {}} {
		if v, err := c.Get(ctx, key); err != nil || !v.Expires.Equal(want) {
			t.Fatalf("%s from a batch: expires %v (%v), want %v", key, v.Expires, err, want)
		}
	}
	pc.Advance(time.Second)
	if res, err := c.Batch(ctx, batch, "op-ttl"); err != nil || !res.Replayed {
		t.Fatalf("the same keyed batch a second later: %+v %v, want a replay", res, err)
	}
	for name, body := range map[string]string{
		"a TTL on a delete": `{"ops":[{"op":"delete","key":"k","ttl":"5s"}]}`,
		"both":              `{"ops":[{"op":"set","key":"k","value":"v","ttl":"5s","expires":"2030-01-01T00:00:00Z"}]}`,
		"not a TTL":         `{"ops":[{"op":"set","key":"k","value":"v","ttl":"soon"}]}`,
		"before 1970":       `{"ops":[{"op":"set","key":"k","value":"v","expires":"1969-01-01T00:00:00Z"}]}`,
	} {
		if resp, b := nodetest.Do(t, http.MethodPost, n.URL()+"/v1/batch", strings.NewReader(body)); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, b)
		}
	}

	pc.Advance(10 * time.Second)
	if _, err := c.Get(ctx, "ttl"); !client.IsNotFound(err) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("GET 11 s after a TTL of 10 s: %v", err)
	}
	items, err := c.ScanAll(ctx, client.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, it := range items {
		keys = append(keys, it.Key)
	}
	if strings.Join(keys, " ") != "at b/at b/plain keyed plain" {
		t.Fatalf("scan after ttl expired: %v", keys)
	}
}

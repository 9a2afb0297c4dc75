package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/replicator/replicator/client"
)

// expiryGrace is how long after a key's expiry every cluster must read it
// absent: the largest clock offset a run gives a node (300 ms) and the
// time a read takes to be answered.
const expiryGrace = 800 * time.Millisecond

// expiring is a key written once with an absolute expiry.
type expiring struct {
	key, value, cluster string
	expires             time.Time
}

// expirer writes keys under x/ at name's cluster, each once, with an
// absolute expiry 0.5 to 2.5 s ahead (X-Replicator-Expires), and checks
// that once a key's expiry plus expiryGrace passed, no cluster reads it
// present: not the one that took it, not one it replicated to, re-seeded
// or restored, nor one whose clock runs up to 300 ms behind (issue 48:
// "an expired key never reads present after its expiry plus the offset").
// A key written once has no other version that could be read instead.
// Each write and read goes to a running node of its cluster (any, in a
// cluster of several).
func expirer(h txnHost, name string, r *rand.Rand, until time.Time) {
	var pending []expiring
	for seq := 0; time.Now().Before(until) || len(pending) > 0; seq++ {
		if c := h.httpClient(name, r); c != nil && time.Now().Before(until) {
			e := expiring{key: fmt.Sprintf("x/%s-%d", name, seq), value: fmt.Sprintf("%s-x-%d", name, seq), cluster: name,
				expires: time.Now().Add(500*time.Millisecond + time.Duration(r.IntN(2000))*time.Millisecond)}
			ctx, cancel := bgTimeout(3 * time.Second)
			_, err := c.PutWith(ctx, e.key, []byte(e.value), client.WriteOptions{ExpiresAt: e.expires})
			cancel()
			// Written, refused or unknown: it may be there; it must expire.
			_ = err
			pending = append(pending, e)
		}
		kept := pending[:0]
		for _, e := range pending {
			if time.Now().Before(e.expires.Add(expiryGrace)) {
				kept = append(kept, e)
				continue
			}
			checkExpired(h, e, r)
		}
		pending = kept
		time.Sleep(time.Duration(50+r.IntN(100)) * time.Millisecond)
	}
}

func bgTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// checkExpired reads an expired key at every cluster of the run.
func checkExpired(h txnHost, e expiring, r *rand.Rand) {
	for _, n := range h.readable() {
		c := h.httpClient(n, r)
		if c == nil {
			continue
		}
		start := time.Now()
		ctx, cancel := bgTimeout(2 * time.Second)
		v, err := c.Get(ctx, e.key)
		cancel()
		var ce *client.Error
		switch {
		case err == nil:
			h.violation("expiry: %s (written at %s, expiring at %s) read present (%q, version %s, expires %s) at %s at %s, %s after its expiry",
				e.key, e.cluster, e.expires.Format(time.RFC3339Nano), v.Value, v.Version, v.Expires.Format(time.RFC3339Nano), n,
				start.Format(time.RFC3339Nano), start.Sub(e.expires).Round(time.Millisecond))
		case errors.As(err, &ce) && ce.Status == http.StatusNotFound:
			h.count("expiry-checks", 1)
		default:
			// Unreachable for its own event: not judged.
		}
	}
}

package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/node"
)

// prefixDigest is a node's digest of the keys under prefixes.
func prefixDigest(t *testing.T, p *proc, prefixes ...string) api.DigestReport {
	t.Helper()
	var d api.DigestReport
	if _, err := p.client().Do(bg(), http.MethodGet, "/admin/digest?"+url.Values{"prefix": prefixes}.Encode(), nil, nil, &d); err != nil {
		t.Fatalf("%s digest: %v", p.name, err)
	}
	return d
}

// idle waits until every link of every node has shipped everything and
// has no backfill running or pending.
func idle(t *testing.T, d time.Duration, nodes ...*proc) {
	t.Helper()
	eventually(t, d, func() (bool, string) {
		for _, p := range nodes {
			var r api.PeersReport
			if _, err := p.client().Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &r); err != nil {
				return false, err.Error()
			}
			for _, l := range r.Links {
				if l.EntriesBehind > 0 || l.NeedsReseed || l.Reseed.Running || l.Backfill.Running || len(l.Backfill.Pending) > 0 {
					return false, fmt.Sprintf("%s -> %s: %s, %d behind, backfill %+v (%s)", p.name, l.Peer, l.State, l.EntriesBehind, l.Backfill, l.LastError)
				}
			}
			if len(r.Rejoin.Phases) > 0 || len(r.Rejoin.Requests) > 0 {
				return false, fmt.Sprintf("%s rejoining: %+v", p.name, r.Rejoin)
			}
		}
		return true, ""
	})
}

// accountsFor checks, at the receiver, that every stream's indexes are
// accounted for exactly once (merged + dead_lettered + seeded + filtered =
// hwm) and, for the senders' current streams, that the mark is at the
// sender's last index; it returns the filtered count of those streams.
func accountsFor(t *testing.T, receiver *proc, senders ...*proc) uint64 {
	t.Helper()
	streams := streamsOf(t, receiver)
	for _, st := range streams {
		if st.Merged+st.DeadLettered+st.Seeded+st.Filtered != st.HWM {
			t.Fatalf("%s: %+v: merged + dead letters + seeded + filtered != hwm", receiver.name, st)
		}
	}
	var filtered uint64
	for _, snd := range senders {
		w := walLast(t, snd)
		if w.Last == 0 {
			continue // wrote nothing
		}
		st, ok := streams[snd.name+"/"+w.Stream]
		if !ok || st.HWM != w.Last {
			t.Fatalf("%s holds %+v of %s's stream %s (last %d)", receiver.name, st, snd.name, w.Stream, w.Last)
		}
		filtered += st.Filtered
	}
	return filtered
}

func keysOf(t *testing.T, p *proc, prefix string) []string {
	t.Helper()
	items, err := p.client().ScanAll(bg(), client.ScanOptions{Prefix: prefix})
	if err != nil {
		t.Fatalf("%s scan %q: %v", p.name, prefix, err)
	}
	var out []string
	for _, it := range items {
		out = append(out, it.Key+"="+string(it.Value)+"@"+it.Version)
	}
	return out
}

// ownKeysOf is keysOf of the keys whose version p's cluster wrote.
func ownKeysOf(t *testing.T, p *proc, prefix string) []string {
	t.Helper()
	return slices.DeleteFunc(keysOf(t, p, prefix), func(s string) bool { return !strings.HasSuffix(s, "@"+p.name) })
}

// TestThreeClustersFiltered: a and b replicate everything to each other, c
// gets only shared/ from both. Writes at a and b (deletes, a range delete
// across the boundary, a batch across it, counters under it): c holds
// exactly the shared/ part of a and b and nothing else, with every index
// accounted for, and again after c is wiped and re-seeded. Then a's filter
// to c widens to tenant1/ under writes (through the CLI): the backfill
// brings c exactly a's tenant1/ part (b's writes there stay home by b's
// own filter toward c, relayed or not); narrowed, then widened again after
// deletes: no stale key is left.
func TestThreeClustersFiltered(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, false, "a", "b", "c")
	a, b, c := m.nodes["a"], m.nodes["b"], m.nodes["c"]
	for _, p := range []*proc{a, b} {
		p.args = append(p.args, "--peer-include", "c=shared/", "--peer-compression", "c=zstd")
	}
	for _, p := range []*proc{a, b, c} {
		// Deletes collected within the test: kept 15 s, looked at
		// every second.
		p.args = append(p.args, "--tombstone-retention", "15s", "--pin-window", "1s", "--idempotency-window", "15s")
		p.env = append(p.env, node.TestingEnvPrefix+"GC_INTERVAL=1s", node.TestingEnvPrefix+"SHORT_RETENTION=1")
	}
	m.start()
	ctx := bg()
	rng := newRand(s)
	var wg sync.WaitGroup
	for _, p := range []*proc{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := p.client()
			for i := range 300 {
				prefix := []string{"shared/", "tenant1/", "other/"}[rng.IntN(3)]
				k := fmt.Sprintf("%s%s%03d", prefix, p.name, rng.IntN(120))
				var err error
				if i%7 == 6 {
					_, err = cl.Delete(ctx, k)
				} else {
					_, err = cl.Put(ctx, k, []byte(fmt.Sprintf("v%d-%s", i, p.name)))
				}
				if err != nil {
					t.Errorf("%s: %v", p.name, err)
					return
				}
				if i%50 == 25 {
					if _, err := cl.Increment(ctx, "shared/ctr", 1); err != nil {
						t.Errorf("%s incr: %v", p.name, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	// A range delete across the boundary, a batch across it.
	if _, err := a.client().DeleteRange(ctx, "other/b", "shared/b050"); err != nil {
		t.Fatal(err)
	}
	one := "1"
	if _, err := b.client().Batch(ctx, []client.BatchOp{{Op: "set", Key: "shared/batch", Value: &one}, {Op: "set", Key: "tenant1/batch", Value: &one}}, ""); err != nil {
		t.Fatal(err)
	}
	idle(t, 60*time.Second, a, b, c)
	// check waits until c holds exactly the shared/ part of a and b.
	check := func(when string) {
		t.Helper()
		idle(t, 60*time.Second, a, b, c)
		eventually(t, 60*time.Second, func() (bool, string) {
			da, db, dc := prefixDigest(t, a, "shared/"), prefixDigest(t, b, "shared/"), prefixDigest(t, c, "shared/")
			if da.Digest != db.Digest || da.Digest != dc.Digest || da.Keys == 0 {
				return false, fmt.Sprintf("%s: shared/ digests differ: a %+v b %+v c %+v", when, da, db, dc)
			}
			if all := prefixDigest(t, c); all.Keys != dc.Keys || all.Counters != dc.Counters {
				return false, fmt.Sprintf("%s: c holds %d keys and %d counters, %d and %d of them under shared/", when, all.Keys, all.Counters, dc.Keys, dc.Counters)
			}
			if fa, fb := prefixDigest(t, a), prefixDigest(t, b); fa.Digest != fb.Digest {
				return false, fmt.Sprintf("%s: a and b differ: %+v %+v", when, fa, fb)
			}
			return true, ""
		})
	}
	check("after the writes")
	if accountsFor(t, c, a, b) == 0 {
		t.Fatal("c counts no entry of a or b as filtered")
	}
	accountsFor(t, a, b, c)
	accountsFor(t, b, a, c)

	// c loses its data: its re-seeds from a and b bring shared/ only.
	c.kill()
	if err := os.RemoveAll(c.dataDir()); err != nil {
		t.Fatal(err)
	}
	c.startReady()
	time.Sleep(2 * time.Second) // the links learn that c lost its data
	check("after c's re-seed")
	accountsFor(t, c, a, b)

	// Widen a -> c to tenant1/ while a writes there.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			if _, err := a.client().Put(ctx, fmt.Sprintf("tenant1/live%03d", i), []byte("w")); err != nil {
				t.Errorf("live write: %v", err)
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	out, errOut, code := cli(t, nil, "filter", "c", "--include", "shared/", "--include", "tenant1/", "--addr", a.url)
	if code != 0 || !strings.Contains(out, "+shared/ +tenant1/") {
		t.Fatalf("replicator filter: exit %d\n%s%s", code, out, errOut)
	}
	<-done
	idle(t, 60*time.Second, a, b, c)
	// c gets what a holds of tenant1/ that a wrote: b's writes there stay
	// home by b's own filter toward c, relayed or not.
	if ka, kc := ownKeysOf(t, a, "tenant1/"), keysOf(t, c, "tenant1/"); !slices.Equal(ka, kc) || len(ka) == 0 {
		t.Fatalf("after the backfill c's tenant1/ differs from a's:\na %q\nc %q", ka, kc)
	}
	accountsFor(t, c, a, b)

	// Narrowed: c keeps what it has; a deletes there meanwhile. Past the
	// retention a keeps those deletes for c (issue 45: the link's filter
	// held them back, and only the widening's backfill can carry them),
	// and says so on the link. Widened again: the backfill carries them,
	// and no stale key is left.
	put := func(f string) {
		t.Helper()
		if _, err := a.client().Do(ctx, http.MethodPut, "/admin/peers/c/filter", []byte(f), http.Header{"Content-Type": {"application/json"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put(`{"include": ["shared/"]}`)
	for i := range 20 {
		if _, err := a.client().Delete(ctx, fmt.Sprintf("tenant1/live%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	idle(t, 60*time.Second, a, b, c)
	if got := keysOf(t, c, "tenant1/live000"); len(got) != 1 {
		t.Fatalf("narrowing removed what c had: %q", got)
	}
	// Past the retention, with every cluster writing past the deletes, a
	// collection keeps them for c.
	tick := 0
	eventually(t, 3*time.Minute, func() (bool, string) {
		tick++
		for _, p := range []*proc{a, b, c} {
			if _, err := p.client().Put(ctx, fmt.Sprintf("shared/tick-%s", p.name), []byte(fmt.Sprint(tick))); err != nil {
				return false, err.Error()
			}
		}
		k := linkOf(t, a, "c").KeptTombstones
		return k != nil && k.Tombstones >= 20, fmt.Sprintf("a's link to c keeps %+v", k)
	})
	if _, err := a.client().Get(ctx, "tenant1/live000"); err == nil || strings.Contains(err.Error(), "deletes were collected") {
		t.Fatalf("a's tenant1/live000 after the collection: %v, want its delete kept", err)
	}
	if got := keysOf(t, c, "tenant1/live000"); len(got) != 1 {
		t.Fatalf("c lost tenant1/live000 while the range did not cross: %q", got)
	}
	out, errOut, code = cli(t, nil, "filter", "c", "--addr", a.url)
	if code != 0 || !strings.Contains(out, "tombstones kept for a widening") {
		t.Fatalf("replicator filter c does not show the kept tombstones: exit %d\n%s%s", code, out, errOut)
	}
	put(`{"include": ["shared/", "tenant1/"]}`)
	idle(t, 60*time.Second, a, b, c)
	if ka, kc := ownKeysOf(t, a, "tenant1/"), keysOf(t, c, "tenant1/"); !slices.Equal(ka, kc) {
		t.Fatalf("after widening again c's tenant1/ differs from a's:\na %q\nc %q", ka, kc)
	}
	for i := range 20 {
		if got := keysOf(t, c, fmt.Sprintf("tenant1/live%03d", i)); len(got) != 0 {
			t.Fatalf("c keeps a key a deleted while the range did not cross: %q", got)
		}
	}
	accountsFor(t, c, a, b)
}

// TestBandwidthLimit: a link limited to 1 MiB/s never carries more than 10%
// over that in any 5-second window, as measured where the bodies arrive (a
// proxy in front of the receiver); the limit is the cluster's log's, so it
// survives a restart, and a change through the CLI holds at once.
func TestBandwidthLimit(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, true, "a", "b")
	a, b := m.nodes["a"], m.nodes["b"]
	a.args = append(a.args, "--peer-bandwidth", "b=1MiB")
	m.start()
	px := m.proxies["a->b"]
	rng := newRand(s)
	value := make([]byte, 4096)
	write := func(from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			for j := range value {
				value[j] = byte('a' + rng.IntN(26)) // incompressible enough
			}
			if _, err := a.client().Put(bg(), fmt.Sprintf("k%05d", i), value); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0, 1800) // about 7.5 MiB: 7 seconds or more at 1 MiB/s
	m.converge(120 * time.Second)
	const limit = 1 << 20
	most, total := px.maxWindow(5 * time.Second)
	t.Logf("1 MiB/s: %d bytes arrived, at most %d in a 5 s window (%.3f of the limit)", total, most, float64(most)/(5*limit))
	if total < 1800*4096 || float64(most) > 1.1*5*limit {
		t.Fatalf("%d bytes in all, %d in one 5 s window: over 1.1 x 5 MiB", total, most)
	}
	st := linkOf(t, a, "b")
	if st.BandwidthLimit != limit || st.ThrottledSeconds <= 0 {
		t.Fatalf("a -> b: limit %d, throttled %.1fs", st.BandwidthLimit, st.ThrottledSeconds)
	}
	// The limit is the log's: a restart with the flag removed keeps it.
	a.kill()
	a.args = slices.DeleteFunc(a.args, func(s string) bool { return s == "--peer-bandwidth" || s == "b=1MiB" })
	a.startReady()
	if st := linkOf(t, a, "b"); st.BandwidthLimit != limit {
		t.Fatalf("after a restart without the flag: limit %d", st.BandwidthLimit)
	}
	out, errOut, code := cli(t, nil, "bandwidth", "b", "4MiB", "--addr", a.url)
	if code != 0 || !strings.Contains(out, "4.0 MiB/s") {
		t.Fatalf("replicator bandwidth: exit %d\n%s%s", code, out, errOut)
	}
	if st := linkOf(t, a, "b"); st.BandwidthLimit != 4<<20 {
		t.Fatalf("after the change: limit %d", st.BandwidthLimit)
	}
	_ = b
}

func linkOf(t *testing.T, p *proc, peer string) client.LinkStatus {
	t.Helper()
	for _, l := range peersReport(t, p).Links {
		if l.Peer == peer {
			return l
		}
	}
	t.Fatalf("%s has no link to %s", p.name, peer)
	return client.LinkStatus{}
}

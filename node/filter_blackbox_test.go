package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/store"
)

// The link settings through the admin API, as an operator sets and reads
// them.
func adminOf(n *node.Node) *client.Client { return client.New(n.URL(), nil) }

func setFilter(n *node.Node, peer string, f entry.Filter) (api.FilterReport, error) {
	return adminOf(n).SetLinkFilter(context.Background(), peer, f)
}

func filterOf(n *node.Node, peer string) (api.FilterReport, error) {
	return adminOf(n).LinkFilter(context.Background(), peer)
}

func releaseFilter(n *node.Node, peer string) (api.FilterReport, error) {
	return adminOf(n).ReleaseLinkFilter(context.Background(), peer)
}

func setBandwidth(n *node.Node, peer string, bps int64) (api.BandwidthReport, error) {
	return adminOf(n).SetLinkBandwidth(context.Background(), peer, bps)
}

func bandwidthOf(n *node.Node, peer string) (api.BandwidthReport, error) {
	return adminOf(n).LinkBandwidth(context.Background(), peer)
}

// linkOf is n's filter report of its link to peer.
func linkOf(t *testing.T, n *node.Node, peer string) api.FilterReport {
	t.Helper()
	rep, err := filterOf(n, peer)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// keptOf is what n's last collection kept for its link to peer.
func keptOf(t *testing.T, n *node.Node, peer string) *api.KeptTombstones {
	t.Helper()
	return linkOf(t, n, peer).Kept
}

// isStatus reports whether err is the API's answer of status code.
func isStatus(err error, code int) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Status == code
}

// mustWrite returns a check that fails t on a write's error.
func mustWrite(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// liveUnder lists key=value@version of every live key under prefix that
// keep lets through.
func liveUnder(t *testing.T, n *node.Node, prefix string, keep func(string) bool) []string {
	t.Helper()
	var out []string
	after := ""
	for {
		items, next, err := n.Scan(store.ScanOptions{Prefix: prefix, After: after, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if keep == nil || keep(it.Key) {
				out = append(out, fmt.Sprintf("%s=%s@%s", it.Key, it.Value, it.Stamp))
			}
		}
		if next == "" {
			return out
		}
		after = next
	}
}

// streamsAccountFor checks that every stream n applied sums up:
// merged + dead_lettered + seeded + filtered = hwm; it returns the filtered
// count of origin's streams.
func streamsAccountFor(t *testing.T, n *node.Node, origin string) uint64 {
	t.Helper()
	var filtered uint64
	for _, st := range n.PeersReport().Streams {
		if st.Merged+st.DeadLettered+st.Seeded+st.Filtered != st.HWM {
			t.Fatalf("%+v: merged + dead letters + seeded + filtered != hwm", st)
		}
		if st.Origin == origin {
			filtered += st.Filtered
		}
	}
	return filtered
}

// TestLinkFilter: a and b replicate everything to each other, and only
// shared/ (but shared/tmp/) to c. c holds exactly that of a and b, the runs
// left out arrive as filtered markers that account for every index, a range
// delete across the boundary is clipped, a batch across it crosses in part
// and atomically, counters follow their key. Widening a's filter to
// tenant1/ backfills a's writes there while writes go on (b's stay home by
// b's own filter toward c); narrowing it and widening it again after a
// delete passed the retention leaves no stale key at c.
func TestLinkFilter(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
		if o.ClusterID == "c" {
			return
		}
		for i := range o.Peers {
			if o.Peers[i].Name == "c" {
				o.Peers[i].Include = []string{"shared/"}
				o.Peers[i].Exclude = []string{"shared/tmp/"}
			}
		}
	}, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()
	must := mustWrite(t)
	for i := range 20 {
		must(a.Put(ctx, fmt.Sprintf("shared/a%02d", i), []byte("x")))
		must(a.Put(ctx, fmt.Sprintf("tenant1/a%02d", i), []byte("x")))
		must(b.Put(ctx, fmt.Sprintf("shared/b%02d", i), []byte("y")))
		must(b.Put(ctx, fmt.Sprintf("tenant1/b%02d", i), []byte("y")))
		must(a.Put(ctx, fmt.Sprintf("shared/tmp/a%02d", i), []byte("t")))
	}
	must(a.Delete(ctx, "shared/a00"))
	must(a.Delete(ctx, "tenant1/a00"))
	// A range delete across the boundary (and across the exclude), a
	// batch across it, counters under and outside shared/.
	must(b.DeleteRange(ctx, "shared/b15", "tenant1/b05"))
	must(a.Batch(ctx, []api.BatchOp{{Key: "shared/batch", Value: []byte("1")}, {Key: "tenant1/batch", Value: []byte("1")}, {Key: "shared/tmp/batch", Value: []byte("1")}}))
	must(a.Increment(ctx, "shared/ctr", 5))
	must(b.Increment(ctx, "shared/ctr", 7))
	must(a.Increment(ctx, "tenant1/ctr", 3))
	must(c.Put(ctx, "shared/c", []byte("z")))
	m.Settle()

	shared := func(k string) bool { return strings.HasPrefix(k, "shared/") && !strings.HasPrefix(k, "shared/tmp/") }
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		ga, gc := liveUnder(t, a, "", shared), liveUnder(t, c, "", shared)
		return slices.Equal(ga, gc), fmt.Sprintf("a %q\nc %q", ga, gc)
	})
	if all, sh := liveUnder(t, c, "", nil), liveUnder(t, c, "", shared); !slices.Equal(all, sh) {
		t.Fatalf("c holds keys its links keep home: %q", all)
	}
	for _, k := range []string{"shared/b16", "shared/b19"} {
		if _, err := c.Get(k); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("c holds %s, which b's clipped range delete removed: %v", k, err)
		}
	}
	if _, err := c.Get("shared/batch"); err != nil {
		t.Fatalf("the batch's shared/ part did not cross: %v", err)
	}
	if ctr, err := c.Counter("shared/ctr"); err != nil || ctr.Value != 12 {
		t.Fatalf("c's shared/ctr = %+v (%v), want 12", ctr, err)
	}
	if _, err := c.Counter("tenant1/ctr"); err == nil {
		t.Fatal("tenant1/ctr crossed to c")
	}
	if fa, fb := streamsAccountFor(t, c, "a"), streamsAccountFor(t, c, "b"); fa == 0 || fb == 0 {
		t.Fatalf("c counts %d entries of a and %d of b as filtered: markers never arrived", fa, fb)
	}
	streamsAccountFor(t, b, "a")
	// a and b still hold each other's everything.
	if da, db := digestOf(t, a), digestOf(t, b); da != db {
		t.Fatalf("a and b differ: %s %s", da, db)
	}

	// Widen a's link to c to tenant1/ while a writes there.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			if _, err := a.Put(ctx, fmt.Sprintf("tenant1/live%02d", i), []byte("w")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	rep, err := setFilter(a, "c", entry.Filter{Include: []string{"shared/", "tenant1/"}, Exclude: []string{"shared/tmp/"}})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Recorded || len(rep.Epochs) == 0 || rep.Epochs[len(rep.Epochs)-1].Filter.String() != "+shared/ +tenant1/ -shared/tmp/" {
		t.Fatalf("filter report after the change: %+v", rep)
	}
	wg.Wait()
	tenant := func(k string) bool { return strings.HasPrefix(k, "tenant1/") }
	// c gets what a holds of tenant1/ that a wrote: b's writes there stay
	// home by b's own filter toward c, relayed or not (a relay keeps to its
	// author's filter, docs/DATAMODEL.md "Filters").
	backfilled := func() {
		t.Helper()
		nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
			ls := linkOf(t, a, "c")
			ga := slices.DeleteFunc(liveUnder(t, a, "tenant1/", nil), func(s string) bool { return !strings.HasSuffix(s, "@a") })
			gc := liveUnder(t, c, "tenant1/", nil)
			return len(ls.Backfill) == 0 && slices.Equal(ga, gc), fmt.Sprintf("pending %q\na %q\nc %q", ls.Backfill, ga, gc)
		})
	}
	backfilled()
	if ctr, err := c.Counter("tenant1/ctr"); err != nil || ctr.Value != 3 {
		t.Fatalf("c's tenant1/ctr after the backfill = %+v (%v)", ctr, err)
	}
	streamsAccountFor(t, c, "a")

	// Narrow it again; delete a tenant1 key at a, write one: past the
	// cutoff a keeps the delete for c, whose link's filter held it back
	// (issue 45), and the widening's backfill carries it.
	if _, err := setFilter(a, "c", entry.Filter{Include: []string{"shared/"}, Exclude: []string{"shared/tmp/"}}); err != nil {
		t.Fatal(err)
	}
	pc.Advance(time.Second)
	must(a.Delete(ctx, "tenant1/batch"))
	must(a.Put(ctx, "tenant1/after-narrow", []byte("n")))
	m.Settle()
	if _, err := c.Get("tenant1/batch"); err != nil {
		t.Fatalf("narrowing: c should keep what it has: %v", err)
	}
	everyoneWrites(t, m, pc, 20*time.Minute, "shared/tick-")
	if _, err := a.CollectTombstones(); err != nil {
		t.Fatal(err)
	}
	var nf *api.NotFoundError
	if _, gerr := a.Get("tenant1/batch"); !errors.As(gerr, &nf) || nf.Deleted == "" {
		t.Fatalf("a collected the delete of tenant1/batch, which c's link held back: %v", gerr)
	}
	if k := keptOf(t, a, "c"); k == nil || k.Tombstones < 1 {
		t.Fatalf("a's link to c reports %+v kept tombstones", k)
	}
	if _, err := setFilter(a, "c", entry.Filter{Include: []string{"shared/", "tenant1/"}, Exclude: []string{"shared/tmp/"}}); err != nil {
		t.Fatal(err)
	}
	backfilled()
	if _, err := c.Get("tenant1/batch"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("c kept tenant1/batch, whose delete a made while the range was excluded: %v", err)
	}
	// Carried: the next collection takes the delete.
	everyoneWrites(t, m, pc, time.Second, "shared/tock-")
	waitCollected(t, a, "tenant1/batch", nil)
	if all := liveUnder(t, c, "", func(k string) bool { return !shared(k) && !tenant(k) }); len(all) != 0 {
		t.Fatalf("c holds keys outside its filter: %q", all)
	}
	streamsAccountFor(t, c, "a")
	streamsAccountFor(t, c, "b")
}

func digestOf(t *testing.T, n *node.Node) string {
	t.Helper()
	d, err := n.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.Hash
}

// TestFilterWaitsForAReceiverThatTakesMarkers: a receiver whose log cannot
// take filtered markers yet (it plays a build that reads format 2) gets
// nothing from a filtering link, rather than every key: the link says why,
// and the keys it lets cross wait.
func TestFilterWaitsForAReceiverThatTakesMarkers(t *testing.T) {
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		if o.ClusterID == "a" {
			o.Peers[0].Include = []string{"shared/"}
		} else {
			o.Testing.ReadsFormat = 2
		}
	}, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	ctx := context.Background()
	for _, k := range []string{"home/1", "shared/1", "home/2"} {
		if _, err := a.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		st := a.PeerStatus()[0]
		return strings.Contains(st.LastError, "filtered markers"), fmt.Sprintf("%+v", st)
	})
	if got := liveUnder(t, b, "", nil); len(got) != 0 {
		t.Fatalf("b got %q from a filtering link it cannot take markers from", got)
	}
}

// TestLinkBandwidthThroughLog: a node's flags seed the link's limit in the
// log once; a change through the API holds at once and over a restart with
// the old flag (the log wins); a limit too small to carry a batch is
// refused.
func TestLinkBandwidthThroughLog(t *testing.T) {
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		if o.ClusterID == "a" {
			o.Peers[0].Bandwidth = 64 << 10
		}
	}, "a", "b")
	a := m.Nodes["a"]
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		rep, err := bandwidthOf(a, "b")
		return err == nil && rep.Recorded && rep.BytesPerSecond == 64<<10, fmt.Sprintf("%+v %v", rep, err)
	})
	if _, err := setBandwidth(a, "b", 500); !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("a limit of 500 bytes/s: %v", err)
	}
	if _, err := setBandwidth(a, "nobody", 1<<20); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("a limit of an unknown peer: %v", err)
	}
	rep, err := setBandwidth(a, "b", 1<<20)
	if err != nil || rep.BytesPerSecond != 1<<20 || !rep.Recorded {
		t.Fatalf("set: %+v %v", rep, err)
	}
	if st := a.PeerStatus()[0]; st.BandwidthLimit != 1<<20 {
		t.Fatalf("the link's status: limit %d", st.BandwidthLimit)
	}
	m.Restart("a", nil)
	a = m.Nodes["a"]
	time.Sleep(700 * time.Millisecond) // a seed tick: the flag must not win
	if rep, err := bandwidthOf(a, "b"); err != nil || rep.BytesPerSecond != 1<<20 {
		t.Fatalf("after a restart with the old flag: %+v %v", rep, err)
	}
}

// TestLinkCompressionThroughLog (issue 49): a link's compression is a
// setting of the cluster's log as its bandwidth is: the flag seeds it, the
// runtime command changes it at once (the link compresses, or stops), a
// restart with the old flag does not win, and the flag that now differs
// from the log is drift: in the link's status, as the metric, and WARNed.
func TestLinkCompressionThroughLog(t *testing.T) {
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		if o.ClusterID == "a" {
			o.Peers[0].Compression = "zstd"
		}
	}, "a", "b")
	a := m.Nodes["a"]
	ctx := context.Background()
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		rep, err := adminOf(a).LinkCompression(ctx, "b")
		return err == nil && rep.Recorded && rep.Compression == "zstd", fmt.Sprintf("%+v %v", rep, err)
	})
	if _, err := adminOf(a).SetLinkCompression(ctx, "b", "lz4"); !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("compression lz4: %v", err)
	}
	rep, err := adminOf(a).SetLinkCompression(ctx, "b", "none")
	if err != nil || rep.Compression != "none" || !rep.Recorded {
		t.Fatalf("set: %+v %v", rep, err)
	}
	// The link sends as the log says: what it sends now goes raw.
	before := a.PeerStatus()[0]
	for i := range 20 {
		mustWrite(t)(a.Put(ctx, fmt.Sprintf("c/%d", i), bytes.Repeat([]byte("x"), 4096)))
	}
	m.Converged(20 * time.Second)
	after := a.PeerStatus()[0]
	if after.Compression != "none" || after.BytesRaw-before.BytesRaw != after.BytesOnWire-before.BytesOnWire || after.BytesRaw == before.BytesRaw {
		t.Fatalf("after compression none: %s, raw +%d, wire +%d", after.Compression, after.BytesRaw-before.BytesRaw, after.BytesOnWire-before.BytesOnWire)
	}
	// The flag still says zstd: drift, the log's value in force.
	m.Restart("a", nil)
	a = m.Nodes["a"]
	time.Sleep(700 * time.Millisecond) // a seed tick: the flag must not win
	if rep, err := adminOf(a).LinkCompression(ctx, "b"); err != nil || rep.Compression != "none" {
		t.Fatalf("after a restart with the old flag: %+v %v", rep, err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		d := a.PeerStatus()[0].Drift
		return len(d) == 1 && d[0].Setting == "compression" && d[0].Declared == "zstd" && d[0].InForce == "none", fmt.Sprintf("drift %+v", d)
	})
	_, metrics := nodetest.Do(t, http.MethodGet, a.URL()+"/metrics", nil)
	if !bytes.Contains(metrics, []byte(`replicator_config_drift{cluster="a",peer="b",setting="compression"} 1`)) ||
		!bytes.Contains(metrics, []byte(`replicator_config_drift{cluster="a",peer="b",setting="filter"} 0`)) {
		t.Fatalf("no drift series:\n%s", nodetest.GrepLines(metrics, "config_drift"))
	}
}

// TestRejoinGetsItsOwnWritesBackAcrossAFilter: a's link to b keeps f/ home.
// b writes under f/ while its link to c is cut, so only a receives the last
// of them, and b is then wiped. b's rejoin asks a and c for re-seeds; a's
// carries b's own writes under f/ whatever the filter (a filter says what
// a's writes send), so b holds every write it acknowledged, and its rejoin
// re-seed brings c the ones c missed. Before, a left them out, and the
// backfill of a later widening could not bring them back (a backfill may
// not bring a cluster its own writes): b and c stayed behind a for good.
func TestRejoinGetsItsOwnWritesBackAcrossAFilter(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
		o.AntiEntropyInterval = -1
		if o.ClusterID != "a" {
			return
		}
		for i := range o.Peers {
			if o.Peers[i].Name == "b" {
				o.Peers[i].Exclude = []string{"f/"}
			}
		}
	}, "a", "b", "c")
	ctx := context.Background()
	b := m.Nodes["b"]
	must := mustWrite(t)
	for i := range 5 {
		must(b.Put(ctx, fmt.Sprintf("f/%02d", i), []byte("early")))
		must(b.Increment(ctx, "f/ctr", 1))
	}
	must(b.Put(ctx, "g/kept", []byte("y")))
	must(b.DeleteRange(ctx, "f/00", "f/01"))
	m.Converged(20 * time.Second)

	m.Cut("b", "c", true)
	for i := 5; i < 10; i++ {
		must(b.Put(ctx, fmt.Sprintf("f/%02d", i), []byte("late")))
		must(b.Increment(ctx, "f/ctr", 10))
	}
	must(b.DeleteRange(ctx, "f/01", "f/02"))
	m.Settle()
	if ctr, err := m.Nodes["a"].Counter("f/ctr"); err != nil || ctr.Value != 55 {
		t.Fatalf("a's f/ctr = %+v (%v), want 55", ctr, err)
	}
	old := b.OriginReport().Stream
	m.Restart("b", func(dir string) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		m.Cut("b", "c", false)
	})
	b = m.Nodes["b"]
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		if b.OriginReport().Stream == old {
			return false, "b did not notice its wipe"
		}
		return true, ""
	})
	m.Converged(30 * time.Second)
	for _, name := range []string{"a", "b", "c"} {
		n := m.Nodes[name]
		if ctr, err := n.Counter("f/ctr"); err != nil || ctr.Value != 55 {
			t.Errorf("%s's f/ctr = %+v (%v), want 55: b's increments behind a's filter were lost", name, ctr, err)
		}
		for i := 2; i < 10; i++ {
			k := fmt.Sprintf("f/%02d", i)
			if _, err := n.Get(k); err != nil {
				t.Errorf("%s lacks %s: %v", name, k, err)
			}
		}
		for _, k := range []string{"f/00", "f/01"} {
			if _, err := n.Get(k); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("%s holds %s, which b's range deletes removed: %v", name, k, err)
			}
		}
	}
	// a's own writes under f/ still stay home.
	must(m.Nodes["a"].Put(ctx, "f/from-a", []byte("a")))
	m.Settle()
	if _, err := b.Get("f/from-a"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a's write under f/ crossed its filter to b: %v", err)
	}
}

// TestNarrowedLinkKeepsDeletesOfOthersKeys (issue 45, case 1): a narrows
// its link to c; a deletes keys c and b wrote (and a's own, and a range);
// c acknowledges the filtered markers; past the retention a would collect
// the tombstones; a widens the link. Before, the backfill carried nothing
// for those keys and its end dropped only uncarried keys a wrote, so c
// kept the keys of b and c for good. Now a keeps the tombstones of the
// ranges the link's filter keeps home (and only those: a delete elsewhere
// is collected), reports them on the link, and the backfill carries them:
// c ends holding none of the deleted keys, and once carried they go.
func TestNarrowedLinkKeepsDeletesOfOthersKeys(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
	}, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()
	must := mustWrite(t)
	must(a.Put(ctx, "t/a1", []byte("a")))
	must(b.Put(ctx, "t/b1", []byte("b")))
	must(c.Put(ctx, "t/c1", []byte("c")))
	must(c.Put(ctx, "t/r/c2", []byte("c")))
	must(b.Put(ctx, "u/b1", []byte("b")))
	m.Settle()
	for _, k := range []string{"t/a1", "t/b1", "t/c1", "t/r/c2"} {
		if _, err := c.Get(k); err != nil {
			t.Fatalf("c lacks %s before the narrowing: %v", k, err)
		}
	}
	if _, err := setFilter(a, "c", entry.Filter{Exclude: []string{"t/"}}); err != nil {
		t.Fatal(err)
	}
	pc.Advance(time.Second)
	must(a.Delete(ctx, "t/a1"))
	must(a.Delete(ctx, "t/b1"))
	must(a.Delete(ctx, "t/c1"))
	must(a.DeleteRange(ctx, "t/r/", "t/r0"))
	must(a.Delete(ctx, "u/b1")) // crosses: c takes it, and it is collected as ever
	m.Settle()
	if _, err := c.Get("t/c1"); err != nil {
		t.Fatalf("c lost t/c1 while a's link kept t/ home: %v", err)
	}
	everyoneWrites(t, m, pc, 20*time.Minute, "tick/")
	waitCollected(t, a, "u/b1", nil)
	for _, k := range []string{"t/a1", "t/b1", "t/c1"} {
		var nf *api.NotFoundError
		if _, err := a.Get(k); !errors.As(err, &nf) || nf.Deleted == "" {
			t.Fatalf("a collected the delete of %s, which its link to c held back: %v", k, err)
		}
	}
	k := keptOf(t, a, "c")
	if k == nil || k.Tombstones != 4 || k.Ranges != 1 || k.Bytes <= 0 {
		t.Fatalf("a's link to c reports kept %+v, want 4 tombstones (3 deletes, the range's key) and 1 range", k)
	}
	if k := keptOf(t, a, "b"); k != nil {
		t.Fatalf("a's link to b keeps %+v: its filter holds nothing back", k)
	}
	if rep, err := filterOf(a, "c"); err != nil || rep.Kept == nil || len(rep.Keep) == 0 {
		t.Fatalf("the filter report does not show what is kept: %+v %v", rep, err)
	}

	if _, err := setFilter(a, "c", entry.Filter{}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		ls := linkOf(t, a, "c")
		var held []string
		for _, k := range []string{"t/a1", "t/b1", "t/c1", "t/r/c2"} {
			if _, err := c.Get(k); err == nil {
				held = append(held, k)
			}
		}
		return len(ls.Backfill) == 0 && len(held) == 0, fmt.Sprintf("pending %q; c still holds %q", ls.Backfill, held)
	})
	if da, dc := digestOf(t, a), digestOf(t, c); da != dc {
		t.Fatalf("a and c differ after the widening's backfill")
	}
	// Carried: the next collection takes them.
	everyoneWrites(t, m, pc, time.Second, "tock/")
	waitCollected(t, a, "t/c1", func() (bool, string) {
		k := keptOf(t, a, "c")
		return k == nil, fmt.Sprintf("kept %+v", k)
	})
}

// TestReleasedNarrowing: an operator who declares a link's narrowing
// permanent releases the tombstones kept for a widening: the next
// collection takes them. A later widening then backfills what the tree
// holds, and a key the peer held that this cluster deleted meanwhile stays
// there: a comparison lists it as a possible resurrection, never copied.
func TestReleasedNarrowing(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
	}, "a", "c")
	a, c := m.Nodes["a"], m.Nodes["c"]
	ctx := context.Background()
	must := mustWrite(t)
	must(c.Put(ctx, "t/c1", []byte("c")))
	m.Settle()
	if _, err := releaseFilter(a, "c"); !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("releasing an unfiltered link: %v", err)
	}
	if _, err := setFilter(a, "c", entry.Filter{Exclude: []string{"t/"}}); err != nil {
		t.Fatal(err)
	}
	pc.Advance(time.Second)
	must(a.Delete(ctx, "t/c1"))
	m.Settle()
	pc.Advance(20 * time.Minute)
	must(a.Put(ctx, "tick/a", []byte("t")))
	must(c.Put(ctx, "tick/c", []byte("t")))
	m.Settle()
	if _, err := a.CollectTombstones(); err != nil {
		t.Fatal(err)
	}
	var nf *api.NotFoundError
	if _, err := a.Get("t/c1"); !errors.As(err, &nf) || nf.Deleted == "" {
		t.Fatalf("a collected a delete its link held back: %v", err)
	}
	rep, err := releaseFilter(a, "c")
	if err != nil || len(rep.Released) != 1 || rep.Released[0].Start != "t/" || len(rep.Keep) != 0 {
		t.Fatalf("release: %+v %v", rep, err)
	}
	if _, err := a.CollectTombstones(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get("t/c1"); !errors.As(err, &nf) || nf.Deleted != "" {
		t.Fatalf("a kept the delete of t/c1 after the release: %v", err)
	}
	if k := keptOf(t, a, "c"); k != nil {
		t.Fatalf("kept after the release: %+v", k)
	}
	if _, err := setFilter(a, "c", entry.Filter{}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		ls := linkOf(t, a, "c")
		return len(ls.Backfill) == 0 && len(ls.Released) == 0, fmt.Sprintf("pending %q, released %q", ls.Backfill, ls.Released)
	})
	if _, err := c.Get("t/c1"); err != nil {
		t.Fatalf("c lost t/c1: the test expects the released delete never to reach it: %v", err)
	}
	diff, err := adminOf(a).Diff(ctx, "c", true)
	if err != nil {
		t.Fatal(err)
	}
	checkDivergent(t, "a's comparison with c after a released narrowing", diff, map[string]client.Lacks{"t/c1": client.LacksMaybeDeleted})
	if diff.Repaired != 0 {
		t.Fatalf("a repaired %d", diff.Repaired)
	}
}

// TestWipedClusterGetsBackTheDeletesItHeldBack (issue 45): c narrows its
// link to b after b took c's k1; c deletes k1, so b keeps k1 until a
// widening carries the delete; a takes the delete, and past the retention
// collects. c is then wiped. Before, a collected c's tombstone (nothing of
// a's links held it back): c's rejoin got k1 back from b's re-seed and no
// delete from anyone, and carried k1 to a: a write deleted for good, alive
// at every cluster. Now c's heartbeats tell a the ranges c keeps for its
// link to b, a keeps c's deletes there, and c gets them back by its rejoin.
func TestWipedClusterGetsBackTheDeletesItHeldBack(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.TombstoneRetention = 10 * time.Minute
		o.PinWindow = time.Minute
		o.AntiEntropyInterval = -1
	}, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()
	must := mustWrite(t)
	must(c.Put(ctx, "c-only/k1", []byte("c")))
	must(c.Put(ctx, "c-only/k2", []byte("c")))
	must(c.Put(ctx, "shared/k3", []byte("c")))
	m.Converged(20 * time.Second)

	if _, err := setFilter(c, "b", entry.Filter{Exclude: []string{"c-only/"}}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		on := linkOf(t, a, "c").PeerKeeps
		return len(on) == 1 && on[0].Target == "b" && len(on[0].Spans) == 1 && on[0].Spans[0].Start == "c-only/",
			fmt.Sprintf("a's record of what c keeps for other links: %+v", on)
	})
	if on := linkOf(t, b, "c").PeerKeeps; len(on) != 0 {
		t.Fatalf("b records %+v as kept by c for other links: c keeps nothing for a", on)
	}
	pc.Advance(time.Second)
	must(c.Delete(ctx, "c-only/k1"))
	must(a.Delete(ctx, "c-only/k2")) // a's delete: a keeps only c's
	must(c.Delete(ctx, "shared/k3")) // crosses to b: collected as ever
	m.Settle()
	if _, err := b.Get("c-only/k1"); err != nil {
		t.Fatalf("b lost c-only/k1 while c's link kept c-only/ home: %v", err)
	}

	everyoneWrites(t, m, pc, 20*time.Minute, "tick/")
	waitCollected(t, a, "shared/k3", nil)
	var nf *api.NotFoundError
	if _, err := a.Get("c-only/k1"); !errors.As(err, &nf) || nf.Deleted == "" {
		t.Fatalf("a collected c's delete of c-only/k1, which c holds back from b: %v", err)
	}
	if _, err := a.Get("c-only/k2"); !errors.As(err, &nf) || nf.Deleted != "" {
		t.Fatalf("a kept its own delete of c-only/k2 (only c's are kept for c): %v", err)
	}
	for _, l := range a.PeerStatus() {
		if k := l.KeptForPeerLinks; l.Peer == "c" && (k == nil || k.Tombstones != 1 || k.Ranges != 0) {
			t.Fatalf("a's link to c reports kept for c's other links %+v, want 1 tombstone", k)
		} else if l.Peer == "b" && k != nil {
			t.Fatalf("a keeps %+v for b's other links: b keeps nothing", k)
		}
	}
	if rep, err := filterOf(a, "c"); err != nil || len(rep.PeerKeeps) != 1 || rep.KeptForPeerLinks == nil {
		t.Fatalf("a's filter report of c: %+v %v", rep, err)
	}

	// c loses its data; its filter toward b comes from its flags again.
	old := c.OriginReport().Stream
	m.Restart("c", func(dir string) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		for i := range m.Opts["c"].Peers {
			if m.Opts["c"].Peers[i].Name == "b" {
				m.Opts["c"].Peers[i].Exclude = []string{"c-only/"}
			}
		}
	})
	c = m.Nodes["c"]
	nodetest.WaitFor(t, 30*time.Second, func() (bool, string) {
		if c.OriginReport().Stream == old {
			return false, "c did not notice its wipe"
		}
		r := c.PeersReport().Rejoin
		return len(r.Phases) == 0 && len(r.Requests) == 0, fmt.Sprintf("c's rejoin: %+v", r)
	})
	m.Settle()
	for _, n := range []*node.Node{a, c} {
		if v, err := n.Get("c-only/k1"); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("%s holds c-only/k1 (%+v), deleted by c before its wipe: %v", n.ClusterID(), v, err)
		}
	}
	if _, err := b.Get("c-only/k1"); err != nil {
		t.Fatalf("b lost c-only/k1 while c's link keeps c-only/ home: %v", err)
	}
	// The widening carries the delete c got back.
	if _, err := setFilter(c, "b", entry.Filter{}); err != nil {
		t.Fatal(err)
	}
	m.Converged(30 * time.Second)
	if _, err := b.Get("c-only/k1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("b holds c-only/k1 after c's widening: %v", err)
	}
}

// TestReseedClaimsNoStreamAFilterKeptHome (issue 45): b's link to a keeps
// w/ home, and b's link to c is cut while b writes w/k and x/k; a holds x/k
// and a filtered marker for w/k. a then re-seeds c. Before, the re-seed's
// trailer claimed b's stream up to a's mark, so c counted w/k as applied
// and dropped b's own delivery of it once the cut healed: c lacked w/k for
// good (only a comparison could find it; a WAIT at b counted c). Now a
// claims no stream of b's while b's filter toward a keeps some of it home
// (nor one a filtered marker moved), relays none of b's writes (issue 48),
// and c takes w/k and x/k from b.
func TestReseedClaimsNoStreamAFilterKeptHome(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, func(o *node.Options) {
		o.AntiEntropyInterval = -1
	}, "a", "b", "c")
	a, b, c := m.Nodes["a"], m.Nodes["b"], m.Nodes["c"]
	ctx := context.Background()
	must := mustWrite(t)
	must(b.Put(ctx, "x/0", []byte("b")))
	m.Converged(20 * time.Second)
	if _, err := setFilter(b, "a", entry.Filter{Exclude: []string{"w/"}}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		f := linkOf(t, a, "b").PeerFilter
		return f != nil && !f.All(), fmt.Sprintf("a's record of b's filter: %v", f)
	})
	m.Cut("b", "c", true)
	must(b.Put(ctx, "w/k", []byte("b")))
	must(b.Put(ctx, "x/k", []byte("b")))
	m.Settle()
	if _, err := a.Get("w/k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("w/k crossed b's filter to a: %v", err)
	}
	runs := nodetest.Link(t, a, "c").Reseed.Runs
	if err := a.ReseedPeer("c"); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		l := nodetest.Link(t, a, "c")
		return l.Reseed.Runs > runs && !l.Reseed.Running, fmt.Sprintf("a's re-seed of c: %+v", l.Reseed)
	})
	// a holds b's writes clipped by b's filter: it relays none of them
	// (a transaction of b's would show in part at c, issue 48).
	if _, err := c.Get("x/k"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a's re-seed relayed b's x/k, of a stream a holds in part: %v", err)
	}
	m.Cut("b", "c", false)
	m.Settle()
	for _, k := range []string{"w/k", "x/k"} {
		if _, err := c.Get(k); err != nil {
			t.Fatalf("c lacks b's %s after a's re-seed (it claimed b's stream?): %v", k, err)
		}
	}
	if ls := linkOf(t, a, "b"); len(ls.PartialStreams) == 0 {
		t.Fatalf("a records no stream of b's as partial: %+v", ls)
	}
}

// TestRestoredPeerGetsTheBackfillAgain: a's link to c keeps w/ home while
// a deletes w/k; c's backup is taken then; a widens the link and the
// backfill carries the delete to c; c is restored from the backup, which
// lacks it. A backfill has no place in a's stream: c's marks say it holds
// a's entries up to the backup, and a's rewind resends them as the markers
// they were. Before, c kept w/k for good (a robustness run, seed 7, found
// it after the tombstones were collected, and a wiped cluster's rejoin then
// spread the key back). Now a's rewind makes the ranges its recorded
// filters kept home pending again, and the new backfill carries the delete.
func TestRestoredPeerGetsTheBackfillAgain(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, func(o *node.Options) {
		o.AntiEntropyInterval = -1
		o.TruncateInterval = time.Hour // a's WAL keeps every entry: a rewind resends them, no re-seed
	}, "a", "c")
	a := m.Nodes["a"]
	ctx := context.Background()
	must := mustWrite(t)
	must(a.Put(ctx, "w/k", []byte("v")))
	m.Settle()
	if _, err := setFilter(a, "c", entry.Filter{Exclude: []string{"w/"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Delete(ctx, "w/k"); err != nil {
		t.Fatal(err)
	}
	must(a.Put(ctx, "x/1", []byte("1")))
	m.Settle()
	backup := t.TempDir()
	m.Restart("c", func(dir string) { nodetest.CopyDir(t, dir, backup) })
	if _, err := setFilter(a, "c", entry.Filter{}); err != nil {
		t.Fatal(err)
	}
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		_, err := m.Nodes["c"].Get("w/k")
		return errors.Is(err, api.ErrNotFound), fmt.Sprintf("c's w/k after the widening: %v", err)
	})
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		ls := linkOf(t, a, "c")
		return len(ls.Backfill) == 0, fmt.Sprintf("a's pending backfill: %+v", ls.Backfill)
	})
	must(a.Put(ctx, "x/2", []byte("2"))) // c's restored marks fall behind a's cursor
	m.Settle()
	m.Restart("c", func(dir string) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		nodetest.CopyDir(t, backup, dir)
	})
	c := m.Nodes["c"]
	if _, err := c.Get("w/k"); err != nil {
		t.Fatalf("the backup should hold w/k (deleted behind the filter): %v", err)
	}
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		_, err := c.Get("x/2")
		_, errK := c.Get("w/k")
		return err == nil && errors.Is(errK, api.ErrNotFound), fmt.Sprintf("restored c: x/2 %v, w/k %v (a's backfill generation %d)", err, errK, linkOf(t, a, "c").BackfillGeneration)
	})
	if l := nodetest.Link(t, a, "c"); l.Reseed.Runs != 0 {
		t.Fatalf("a re-seeded c (%+v): the test means a rewind that resends the stream", l.Reseed)
	}
}

// checkDivergent fails t unless rep lists exactly want's keys, each lacking
// where want says.
func checkDivergent(t *testing.T, what string, rep client.DiffReport, want map[string]client.Lacks) {
	t.Helper()
	var got, exp []string
	for _, d := range rep.Divergent {
		got = append(got, d.Key+"="+string(d.Lacks))
	}
	for k, l := range want {
		exp = append(exp, k+"="+string(l))
	}
	slices.Sort(got)
	slices.Sort(exp)
	if fmt.Sprint(got) != fmt.Sprint(exp) {
		t.Fatalf("%s: divergent\n got %v\nwant %v\n(in flight %d, candidates %d)", what, got, exp, rep.InFlight, rep.Candidates)
	}
}

// everyoneWrites moves the clock by d and has a, b and c each write a key
// under prefix, so every peer's frontier moves past what came before, and
// waits for the links to settle.
func everyoneWrites(t *testing.T, m *nodetest.Mesh, pc *hlc.ManualClock, d time.Duration, prefix string) {
	t.Helper()
	pc.Advance(d)
	for _, name := range []string{"a", "b", "c"} {
		n := m.Nodes[name]
		if _, err := n.Put(context.Background(), prefix+n.ClusterID(), []byte("t")); err != nil {
			t.Fatal(err)
		}
	}
	m.Settle()
}

// waitCollected waits until n collected key's tombstone (a read finds
// nothing at all, not a delete) and also holds (nil: nothing more).
func waitCollected(t *testing.T, n *node.Node, key string, also func() (bool, string)) {
	t.Helper()
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		_, err := n.CollectTombstones()
		_, gerr := n.Get(key)
		var nf *api.NotFoundError
		if err != nil || !errors.As(gerr, &nf) || nf.Deleted != "" {
			return false, fmt.Sprintf("%s at %s: %v (collection: %v)", key, n.ClusterID(), gerr, err)
		}
		if also != nil {
			return also()
		}
		return true, ""
	})
}

package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/antientropy"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/internal/treeforge"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/wire"
)

// A hostile peer's tree answers (issue 46, 2 and 3): a repair takes only
// the peer's own writes of keys inside the link's filters, in the leaves it
// asked; the versions it refused are counted by rule; and this side names
// to the peer only keys its own filter lets cross, whatever scope the peer
// claims to have compared.
func TestRepairTakesOnlyWhatTheInboundPathWould(t *testing.T) {
	forger := &treeforge.Forger{Secret: "s"}
	m := nodetest.NewMesh(t, hlc.SystemClock{}, func(o *node.Options) {
		o.AntiEntropyInterval = -1
		if o.ClusterID == "a" {
			forger.Next = o.PeerTransport
			o.PeerTransport = forger
		}
	}, "a", "b")
	a := m.Nodes["a"]
	ctx := context.Background()
	if _, err := setFilter(a, "b", entry.Filter{Include: []string{"shared/"}}); err != nil {
		t.Fatal(err)
	}
	const lacked = "shared/lacked"
	leaf := hashtree.Leaf(lacked)
	victim := treeforge.KeyIn("shared/victim-", leaf, true)
	secret := treeforge.KeyIn("private/secret-", leaf, true)
	if _, err := a.Put(ctx, victim, []byte("the victim's")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, secret, []byte("kept home")); err != nil {
		t.Fatal(err)
	}
	m.Settle()
	diverge(t, m, "b", []string{lacked}, []byte("b's, lost at a"), false)
	at := hlc.Timestamp{Wall: time.Now().UnixNano()}
	forged := []wire.TreeVersion{
		{Key: treeforge.KeyIn("shared/own-", leaf, true), Origin: "a", Value: []byte("forged, a's origin")},
		{Key: treeforge.KeyIn("shared/nobody-", leaf, true), Origin: "zz", Value: []byte("forged, unknown origin")},
		{Key: victim, Origin: "a", Tombstone: true},
		{Key: treeforge.KeyIn("private/out-", leaf, true), Origin: "b", Value: []byte("forged, outside the filter")},
		{Key: treeforge.KeyIn("shared/unasked-", leaf, false), Origin: "b", Value: []byte("forged, a leaf not asked")},
		{Key: treeforge.KeyIn("shared/ctr-", leaf, true), Counter: true, Origin: "b", Kind: uint8(entry.KindCounter),
			Totals: []wire.Component{{Cluster: "a/0", P: 1 << 62}}},
	}
	for i := range forged {
		forged[i].Stamp, forged[i].Whole, forged[i].Hash = at, true, uint64(i+1)
	}
	forger.Forge = func(req *wire.TreeRequest, ans *wire.TreeAnswer) {
		switch req.Op {
		case wire.TreeSums:
			if req.Level == 0 {
				// Claims to have compared every key.
				ans.Filters = []wire.Filter{{Include: []string{"private/", "shared/"}}}
			}
		case wire.TreeLeaves:
			if !slices.Contains(req.Nodes, leaf) {
				return
			}
			ans.Versions = slices.DeleteFunc(ans.Versions, func(v wire.TreeVersion) bool { return v.Key == victim })
			for _, v := range forged {
				v.Value, v.Totals, v.Whole = nil, nil, false
				ans.Versions = append(ans.Versions, v)
			}
		case wire.TreeVersions:
			for _, k := range req.Keys {
				for _, v := range forged {
					if v.Key == k.Key && v.Counter == k.Counter {
						ans.Versions = slices.DeleteFunc(ans.Versions, func(o wire.TreeVersion) bool { return o.Key == k.Key && o.Counter == k.Counter })
						ans.Versions = append(ans.Versions, v)
					}
				}
			}
		}
	}
	rep, err := adminOf(a).Diff(ctx, "b", true)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Repaired != 1 {
		t.Errorf("repaired %d, want 1 (%s only): %+v", rep.Repaired, lacked, rep)
	}
	if rep.RefusedWhy["scope"] != 1 || rep.RefusedWhy["unasked"] < 1 {
		t.Errorf("refusals %v (refused %d), want scope 1 and unasked at least 1", rep.RefusedWhy, rep.Refused)
	}
	if v, err := a.Get(lacked); err != nil || string(v.Value) != "b's, lost at a" {
		t.Errorf("the peer's own lost write was not repaired: %q %v", v.Value, err)
	}
	if v, err := a.Get(victim); err != nil || string(v.Value) != "the victim's" {
		t.Errorf("the victim's key after the repair: %q %v", v.Value, err)
	}
	for _, v := range forged {
		if v.Key == victim {
			continue
		}
		if v.Counter {
			if c, err := a.Counter(v.Key); err == nil && c.Value != 0 {
				t.Errorf("a forged counter component was applied: %s = %d", v.Key, c.Value)
			}
			continue
		}
		if _, err := a.Get(v.Key); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s (origin %s) was applied: %v", v.Key, v.Origin, err)
		}
	}
	for _, k := range forger.Named() {
		if strings.HasPrefix(k, "private/") && k != forged[3].Key {
			t.Errorf("a named %q to the peer, a key its filter keeps home", k)
		}
	}
}

// A peer flooding tree requests (issue 46, 7 and 9): requests that each
// scan the tree anew (a new pass, a filter) from two goroutines at once
// take at most a quarter of a core at the answering node, and their bytes
// count against the link's bandwidth limit there; its client writes go on.
func TestTreeFloodIsPacedAndCharged(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, func(o *node.Options) { o.AntiEntropyInterval = -1 }, "a", "b")
	a := m.Nodes["a"]
	ctx := context.Background()
	var ops []api.BatchOp
	for i := 0; i < 20000; i++ {
		ops = append(ops, api.BatchOp{Key: fmt.Sprintf("k/%06d", i), Value: bytes.Repeat([]byte("v"), 64)})
		if len(ops) == 1000 {
			if _, err := a.Batch(ctx, ops); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	m.Settle()
	const limit = 32 << 10
	if _, err := setBandwidth(a, "b", limit); err != nil {
		t.Fatal(err)
	}
	// b's requests, as a hostile peer holding the link's secret sends them
	// (it paces nothing of its own).
	sh := hostileTreeAsker{url: a.PeerURL() + wire.PathTree, from: "b", secret: "s"}
	fctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var pass uint64
	var mu sync.Mutex
	nAnswered := 0
	start := time.Now()
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for fctx.Err() == nil {
				mu.Lock()
				pass++
				p := pass
				mu.Unlock()
				req := &wire.TreeRequest{Protocol: hashtree.Version, Op: wire.TreeSums, Level: 0, Nodes: []int{0}, Pass: p,
					Filters: []wire.Filter{{Include: []string{"k/"}}}}
				if _, _, err := sh.AskTree(fctx, req); err == nil {
					mu.Lock()
					nAnswered++
					mu.Unlock()
				}
			}
		}()
	}
	// The node's clients meanwhile.
	for fctx.Err() == nil {
		if _, err := a.Put(ctx, "client", []byte("v")); err != nil {
			t.Fatalf("a client's write during the flood: %v", err)
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu, sent := answered(t, a, "b")
	t.Logf("%d requests answered in %s: %.3f s of work, %.0f bytes", nAnswered, elapsed, cpu, sent)
	if nAnswered == 0 {
		t.Fatal("no tree request was answered: the test proved nothing")
	}
	// The pace lets each request's work run, then holds the next for three
	// times as long: the work is at most a quarter of the time, plus the
	// requests in flight at the start (two).
	perRequest := cpu / float64(nAnswered)
	if bound := antientropy.TreeShare*elapsed.Seconds() + 2*perRequest + 0.05; cpu > bound {
		t.Fatalf("%.3f s of work answering b in %s, bound %.3f s (a quarter core)", cpu, elapsed, bound)
	}
	if sent <= 0 {
		t.Fatal("no tree bytes charged to the link")
	}

	// Bytes: leaves of many keys, each answer tens of KiB, over a link
	// limited to 32 KiB/s at a: the exchanges go at the limit's rate (plus
	// a burst and the exchange under way).
	_, before := answered(t, a, "b")
	leaves := make([]int, 8192)
	for i := range leaves {
		leaves[i] = i
	}
	lctx, lcancel := context.WithTimeout(ctx, 6*time.Second)
	defer lcancel()
	largest := int64(0)
	start = time.Now()
	for lctx.Err() == nil {
		mu.Lock()
		pass++
		p := pass
		mu.Unlock()
		_, n, err := sh.AskTree(lctx, &wire.TreeRequest{Protocol: hashtree.Version, Op: wire.TreeLeaves, Nodes: leaves, Pass: p})
		if err == nil {
			largest = max(largest, n)
		}
	}
	elapsed = time.Since(start)
	_, sentNow := answered(t, a, "b")
	sent = sentNow - before
	t.Logf("leaves: %.0f bytes in %s, the largest exchange %d", sent, elapsed, largest)
	if largest < limit {
		t.Fatalf("exchanges of at most %d bytes: the test proved nothing", largest)
	}
	if bound := float64(limit)*(elapsed.Seconds()+1) + 2*float64(largest); sent > bound {
		t.Fatalf("%.0f bytes of tree exchanges in %s over a link limited to %d B/s (bound %.0f)", sent, elapsed, limit, bound)
	}
}

// hostileTreeAsker posts tree requests to a node's peer endpoint as peer
// from, with its secret, the way a hostile peer would: no pacing and no
// bandwidth limit of its own.
type hostileTreeAsker struct{ url, from, secret string }

// AskTree sends req and reads the whole answer; it returns the bytes of
// both.
func (h hostileTreeAsker) AskTree(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, int64, error) {
	body, err := wire.EncodeTree(req)
	if err != nil {
		return nil, 0, err
	}
	status, ans, err := treeforge.Post(ctx, nil, h.url, h.from, h.secret, body)
	if err != nil {
		return nil, 0, err
	}
	if status != http.StatusOK {
		return nil, 0, fmt.Errorf("tree request: %d %s", status, ans)
	}
	return nil, int64(len(body) + len(ans)), nil
}

// answered is what n's metrics say answering peer's tree requests cost:
// the seconds of work and the bytes charged to the link.
func answered(t *testing.T, n *node.Node, peer string) (seconds, bytes float64) {
	t.Helper()
	_, body := nodetest.Do(t, http.MethodGet, n.URL()+"/metrics", nil)
	return metricOf(t, body, "replicator_antientropy_answer_seconds_total", peer), metricOf(t, body, "replicator_antientropy_answer_bytes_total", peer)
}

// metricOf is the value of name's series for peer in a metrics page (0
// when the series is not there yet).
func metricOf(t *testing.T, page []byte, name, peer string) float64 {
	t.Helper()
	for _, l := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(l, name+"{") && strings.Contains(l, `peer="`+peer+`"`) {
			v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return v
		}
	}
	return 0
}

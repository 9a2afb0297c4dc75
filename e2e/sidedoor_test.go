package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/treeforge"
	"github.com/replicator/replicator/wire"
)

// TestSideDoorsOverRealProcesses (issue 46): the side doors the third
// plan's surfaces opened, tried on real processes, each held.
func TestSideDoorsOverRealProcesses(t *testing.T) {
	t.Run("admin through a follower", testAdminThroughAFollower)
	t.Run("a forging peer's tree answers", testForgingPeer)
	t.Run("a peer's tree flood", testTreeFlood)
	t.Run("RESP slots", testRESPSlots)
}

func tokenFile(t *testing.T, tok string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func rawRequest(t *testing.T, method, u, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Through a follower of a cluster of three, with the API token or none, no
// spelling of an admin path reaches an admin handler; the admin token
// does.
func testAdminThroughAFollower(t *testing.T) {
	m := newRaftMesh(t, []string{"a"}, 3, "--api-token-file", tokenFile(t, "data-token"),
		"--admin-token-file", tokenFile(t, "admin-token"), "--insecure-peers")
	for _, n := range m.nodes {
		n.token = "admin-token"
	}
	m.start()
	l := m.waitLeader("a", 30*time.Second)
	var f *rnode
	for _, n := range m.members("a") {
		if n != l {
			f = n
		}
	}
	routes := []struct{ method, path string }{
		{"GET", "admin/cluster?consistent=true"}, {"GET", "admin/peers"}, {"GET", "admin/conflicts"},
		{"POST", "admin/tree/rebuild"}, {"POST", "admin/cluster/remove"}, {"POST", "admin/deadletters/x/discard"},
	}
	for _, rt := range routes {
		for _, p := range []string{"/" + rt.path, "/v1/kv/../../" + rt.path, "//" + rt.path, "/v1/kv/%2e%2e/%2e%2e/" + rt.path, "/./" + rt.path} {
			for _, tok := range []string{"", "data-token"} {
				code, body := rawRequest(t, rt.method, f.url+p, tok)
				isKey := strings.HasPrefix(p, "/v1/kv/") && strings.Contains(body, `"key":"../../admin/`)
				if (code < 400 && !isKey) || strings.Contains(body, `"nodes":[`) {
					t.Errorf("%s %s through %s with token %q: %d %s", rt.method, p, f.id, tok, code, body)
				}
			}
		}
	}
	if code, body := rawRequest(t, "GET", f.url+"/admin/cluster?consistent=true", "admin-token"); code != http.StatusOK || !strings.Contains(body, `"nodes":[`) {
		t.Fatalf("the admin token through %s: %d %s", f.id, code, body)
	}
	var rep api.ClusterReport
	if _, err := l.client().Do(bg(), http.MethodGet, "/admin/cluster", nil, nil, &rep); err != nil || len(rep.Nodes) != 3 {
		t.Fatalf("the cluster after the attempts: %+v %v", rep.Nodes, err)
	}
	// Keys whose segments a path cleaner would remove are keys of their
	// own, through the follower.
	cl := client.New(f.url, &client.Options{Token: "data-token"})
	for _, k := range []string{"a/../b", "a//b", "dir/", ".."} {
		if _, err := cl.Put(bg(), k, []byte("v:"+k)); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
		var v []byte
		if _, err := cl.Do(bg(), http.MethodGet, client.KeyPath(k)+"?consistent=true", nil, nil, &v); err != nil || string(v) != "v:"+k {
			t.Fatalf("get %q: %q %v", k, v, err)
		}
	}
}

// forgingProxy is a hostile peer's proxy on a link: it passes everything
// to target, and a's tree answers through the forger.
func forgingProxy(t *testing.T, target string, f *treeforge.Forger) *httptest.Server {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	f.Next, rp.Transport = http.DefaultTransport, f
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv
}

// A hostile b forges its tree answers to a's comparison: it claims to have
// compared every key, and offers versions of a's own origin, of a cluster
// nobody knows, a delete of a's key, a key outside a's filter and one of a
// leaf never asked. a names no key its filter keeps from b, and its repair
// takes none of them.
func testForgingPeer(t *testing.T) {
	a := newProc(t, "a", "a", "--antientropy-interval", "-1s")
	b := newProc(t, "b", "b", "--antientropy-interval", "-1s", "--peer", "a="+a.url, "--peer-secret", "a=secret-ab")
	leaf := hashtree.Leaf("shared/lacked")
	victim, secret := treeforge.KeyIn("shared/victim-", leaf, true), treeforge.KeyIn("private/secret-", leaf, true)
	px := &treeforge.Forger{Secret: "secret-ab"}
	at := hlc.Timestamp{Wall: time.Now().UnixNano()}
	forged := []wire.TreeVersion{
		{Key: treeforge.KeyIn("shared/own-", leaf, true), Origin: "a", Value: []byte("forged")},
		{Key: treeforge.KeyIn("shared/nobody-", leaf, true), Origin: "zz", Value: []byte("forged")},
		{Key: victim, Origin: "a", Tombstone: true},
		{Key: treeforge.KeyIn("private/out-", leaf, true), Origin: "b", Value: []byte("forged")},
		{Key: treeforge.KeyIn("shared/unasked-", leaf, false), Origin: "b", Value: []byte("forged")},
	}
	for i := range forged {
		forged[i].Stamp, forged[i].Whole, forged[i].Hash = at, true, uint64(i+1)
	}
	px.Forge = func(req *wire.TreeRequest, ans *wire.TreeAnswer) {
		switch req.Op {
		case wire.TreeSums:
			if req.Level == 0 {
				ans.Filters = []wire.Filter{{Include: []string{"private/", "shared/"}}}
			}
			// The path to the leaf differs, so a comes down to it.
			for i, n := range req.Nodes {
				if n == leaf>>(hashtree.FanoutBits*(hashtree.Depth-req.Level)) && len(ans.Sums[i]) > 0 {
					ans.Sums[i][0] ^= 0xff
				}
			}
		case wire.TreeLeaves:
			if !slices.Contains(req.Nodes, leaf) {
				return
			}
			ans.Versions = slices.DeleteFunc(ans.Versions, func(v wire.TreeVersion) bool { return v.Key == victim })
			for _, v := range forged {
				v.Value, v.Whole = nil, false
				ans.Versions = append(ans.Versions, v)
			}
		case wire.TreeVersions:
			for _, k := range req.Keys {
				for _, v := range forged {
					if v.Key == k.Key {
						ans.Versions = slices.DeleteFunc(ans.Versions, func(o wire.TreeVersion) bool { return o.Key == k.Key })
						ans.Versions = append(ans.Versions, v)
					}
				}
			}
		}
	}
	srv := forgingProxy(t, b.url, px)
	a.args = append(a.args, "--peer", "b="+srv.URL, "--peer-secret", "b=secret-ab")
	a.startReady()
	b.startReady()
	ca := a.client()
	if _, err := ca.Do(bg(), http.MethodPut, "/admin/peers/b/filter", []byte(`{"include": ["shared/"]}`), http.Header{"Content-Type": {"application/json"}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{victim, secret} {
		if _, err := ca.Put(bg(), k, []byte("a's")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		_, err := b.client().Get(bg(), victim)
		return err == nil, fmt.Sprint(err)
	})
	var rep client.DiffReport
	if _, err := ca.Do(bg(), http.MethodPost, "/admin/peers/b/diff?repair=true", nil, nil, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("a's repair from b: repaired %d, refused %d %v, divergent %d", rep.Repaired, rep.Refused, rep.RefusedWhy, len(rep.Divergent))
	if rep.Repaired != 0 || rep.RefusedWhy["scope"] != 1 || rep.RefusedWhy["unasked"] < 1 {
		t.Errorf("repaired %d, refusals %v; want none repaired, scope 1, unasked at least 1", rep.Repaired, rep.RefusedWhy)
	}
	if v, err := ca.Get(bg(), victim); err != nil || string(v.Value) != "a's" {
		t.Errorf("a's key after the repair: %q %v", v.Value, err)
	}
	for _, v := range forged {
		if v.Key == victim {
			continue
		}
		if _, err := ca.Get(bg(), v.Key); err == nil {
			t.Errorf("a took the forged %s (origin %s)", v.Key, v.Origin)
		}
	}
	for _, k := range px.Named() {
		if strings.HasPrefix(k, "private/") && k != forged[3].Key {
			t.Errorf("a named %q to b, a key its filter keeps from b", k)
		}
	}
}

// A peer (m, with its secret) sends tree requests that each scan a's tree
// anew, two at a time: a spends at most about a quarter of a core on them,
// says so in its metrics, and its client's writes go on.
func testTreeFlood(t *testing.T) {
	a := newProc(t, "a", "a", "--peer", "m=http://127.0.0.1:1", "--peer-secret", "m=secret-m", "--antientropy-interval", "-1s")
	a.startReady()
	ca := a.client()
	for i := 0; i < 30; i++ {
		var ops []client.BatchOp
		for j := 0; j < 1000; j++ {
			ops = append(ops, client.SetOp(fmt.Sprintf("k/%02d/%04d", i, j), bytes.Repeat([]byte("v"), 32)))
		}
		if _, err := ca.Batch(bg(), ops, ""); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	pass, answered := uint64(0), 0
	start := time.Now()
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				pass++
				p := pass
				mu.Unlock()
				body, _ := wire.EncodeTree(&wire.TreeRequest{Protocol: hashtree.Version, Op: wire.TreeSums, Nodes: []int{0}, Pass: p,
					Filters: []wire.Filter{{Include: []string{"k/"}}}})
				if status, _, _ := treeforge.Post(ctx, nil, a.url+wire.PathTree, "m", "secret-m", body); status == http.StatusOK {
					mu.Lock()
					answered++
					mu.Unlock()
				}
			}
		}()
	}
	writes := 0
	for ctx.Err() == nil {
		if _, err := ca.Put(bg(), "client/"+strconv.Itoa(writes), []byte("v")); err != nil {
			t.Fatalf("a client's write during the flood: %v", err)
		}
		writes++
	}
	wg.Wait()
	elapsed := time.Since(start)
	code, scrape := rawRequest(t, "GET", a.url+"/metrics", "")
	if code != http.StatusOK {
		t.Fatal(code)
	}
	cpu := metricValue(scrape, `replicator_antientropy_answer_seconds_total{cluster="a",peer="m"}`)
	t.Logf("%d tree requests answered in %s: %.3f s of work; %d client writes meanwhile", answered, elapsed.Round(time.Millisecond), cpu, writes)
	if answered == 0 || cpu <= 0 {
		t.Fatalf("answered %d, work %.3f s: the flood proved nothing", answered, cpu)
	}
	if bound := 0.25*elapsed.Seconds() + 2*cpu/float64(answered) + 0.05; cpu > bound {
		t.Fatalf("%.3f s of work answering m's tree requests in %s (bound %.3f s: a quarter core)", cpu, elapsed, bound)
	}
}

// RESP: clients that send WAIT 1 0 and leave hold no slot; clients without
// the token make room at the bound for one with it.
func testRESPSlots(t *testing.T) {
	port := freePort(t)
	a := newProc(t, "a", "a", "--peer", "m=http://127.0.0.1:1", "--peer-secret", "m=secret-m",
		"--api-token-file", tokenFile(t, "tok"), "--resp-listen", fmt.Sprintf("127.0.0.1:%d", port), "--max-connections", "32")
	a.token = "tok"
	a.startReady()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	dial := func() (net.Conn, *bufio.Reader) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		return nc, bufio.NewReader(nc)
	}
	expectLine := func(br *bufio.Reader, want string) {
		t.Helper()
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, want) {
			t.Fatalf("got %q %v, want %q", line, err, want)
		}
	}
	conns := func() float64 {
		_, scrape := rawRequest(t, "GET", a.url+"/metrics", "tok")
		return metricValue(scrape, `replicator_resp_connections{cluster="a"}`)
	}
	// m never acknowledges: WAIT 1 0 waits as long as its client stays.
	for i := 0; i < 100; i++ {
		nc, br := dial()
		fmt.Fprint(nc, "AUTH tok\r\nSET k v\r\nWAIT 1 0\r\n")
		expectLine(br, "+OK")
		expectLine(br, "+OK")
		nc.Close()
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		n := conns()
		return n == 0, fmt.Sprintf("%v RESP connections after 100 clients left in WAIT 1 0", n)
	})
	// 32 clients without the token, at the bound: a client with it gets
	// in, in the place of the oldest.
	for i := 0; i < 32; i++ {
		nc, br := dial()
		fmt.Fprint(nc, "PING\r\n")
		expectLine(br, "-NOAUTH")
	}
	nc, br := dial()
	fmt.Fprint(nc, "AUTH tok\r\nSET k v2\r\nGET k\r\n")
	expectLine(br, "+OK")
	expectLine(br, "+OK")
	expectLine(br, "$2")
	_, scrape := rawRequest(t, "GET", a.url+"/metrics", "tok")
	if v := metricValue(scrape, `replicator_resp_connections_evicted_total{cluster="a"}`); v < 1 {
		t.Fatalf("evicted %v connections at the bound", v)
	}
}

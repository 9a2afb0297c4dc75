package node_test

// Hostile input (issue 13): each test is named for the finding it covers.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// endless yields a CSV record that never ends: `"k","xxxxx...`.
type endless struct{ sent int64 }

func (e *endless) Read(p []byte) (int, error) {
	if e.sent == 0 {
		n := copy(p, `"k","`)
		e.sent += int64(n)
		return n, nil
	}
	if e.sent > 1<<30 {
		return 0, io.EOF
	}
	for i := range p {
		p[i] = 'x'
	}
	e.sent += int64(len(p))
	return len(p), nil
}

// TestBulkCSVRecordBounded: one CSV record of unbounded length is refused
// once it passes the line bound, without buffering it (a 300 MB record cost
// 1.1 GB of RSS before the 400).
func TestBulkCSVRecordBounded(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	src := &endless{}
	br := httpapi.NewBulkReader(src, true, 2<<20)
	_, err := br.Next()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("an endless record: %v", err)
	}
	if src.sent > 8<<20 {
		t.Fatalf("read %d bytes of one record before refusing it, bound 2 MiB", src.sent)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("allocated %d MiB for one refused record", grew>>20)
	}
}

// TestBulkInvalidUTF8Refused: NDJSON with a key that is not valid UTF-8 is
// refused like CSV, not rewritten to U+FFFD.
func TestBulkInvalidUTF8Refused(t *testing.T) {
	for _, line := range []string{
		"{\"key\":\"k\xff\",\"value\":\"v\"}",        // fast path
		"{\"value\":\"v\",\"key\":\"k\xff\"}",        // slow path (field order)
		"{\"key\":\"k\\u00e9\xff\",\"value\":\"v\"}", // slow path (escape)
	} {
		if rec, err := httpapi.DecodeBulkLine([]byte(line)); !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("%q: %+v %v", line, rec, err)
		}
	}
	if _, _, err := httpapi.DecodeBatchRequest([]byte("{\"ops\":[{\"op\":\"set\",\"key\":\"k\xff\",\"value\":\"v\"}]}")); !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("batch with an invalid UTF-8 key: %v", err)
	}
}

// TestCounterRange: local increments that would leave the int64 range (or
// wrap a cluster's totals) are refused with a clear error; two +MaxInt64 no
// longer give -2.
func TestCounterRange(t *testing.T) {
	n := nodetest.Open(t, opts(t.TempDir()))
	defer n.Close()
	ctx := context.Background()
	if _, err := n.Increment(ctx, "c", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Increment(ctx, "c", math.MaxInt64); !errors.Is(err, api.ErrCounterRange) {
		t.Fatalf("a second +MaxInt64: %v", err)
	}
	if c, _ := n.Counter("c"); c.Value != math.MaxInt64 {
		t.Fatalf("counter %d after a refused overflow, want MaxInt64", c.Value)
	}
	if _, err := n.Increment(ctx, "c", -5); err != nil {
		t.Fatalf("a decrement back into range: %v", err)
	}
	// Totals merged from two clusters can each fit while their sum does
	// not: the value saturates, the same on every cluster.
	c := store.Counter{Totals: map[string]entry.PN{"a": {P: math.MaxInt64}, "b": {P: math.MaxInt64}}}
	if c.Value() != math.MaxInt64 {
		t.Fatalf("merged value %d, want saturation at MaxInt64", c.Value())
	}
	c = store.Counter{Totals: map[string]entry.PN{"a": {N: math.MaxInt64}, "b": {N: math.MaxInt64}}}
	if c.Value() != math.MinInt64 {
		t.Fatalf("merged value %d, want saturation at MinInt64", c.Value())
	}
}

// TestRangeDeleteGuard: a range from the smallest key to the end of the key
// space is "delete everything", which is not an API call (start=%00 used to
// pass the guard and empty every cluster).
func TestRangeDeleteGuard(t *testing.T) {
	n := nodetest.Open(t, opts(t.TempDir()))
	defer n.Close()
	ctx := context.Background()
	nodetest.PutN(t, n, "k", 3)
	for _, start := range []string{"\x00", "\x00\x00"} {
		if _, err := n.DeleteRange(ctx, start, ""); !errors.Is(err, api.ErrBadRequest) {
			t.Fatalf("DeleteRange(%q, \"\"): %v", start, err)
		}
	}
	if d, _ := n.Digest(); d.Keys != 3 {
		t.Fatalf("%d keys left, want 3", d.Keys)
	}
	if _, err := n.DeleteRange(ctx, "\x00", "k001"); err != nil {
		t.Fatalf("a bounded range from NUL: %v", err)
	}
}

// TestScanPageBoundedByBytes: a page stops at DefaultScanBytes of keys and
// values, not only at its item limit.
func TestScanPageBoundedByBytes(t *testing.T) {
	n := nodetest.Open(t, opts(t.TempDir()))
	defer n.Close()
	ctx := context.Background()
	big := make([]byte, 1<<20-64)
	for i := 0; i < 12; i++ {
		if _, err := n.Put(ctx, fmt.Sprintf("big%02d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	items, next, err := n.Scan(api.ScanOptions{Limit: store.MaxScanLimit})
	if err != nil || len(items) != 4 || next != "big03" {
		t.Fatalf("a page of 1 MiB values: %d items, next %q, %v; want 4 (4 MiB) and more to come", len(items), next, err)
	}
}

// trickle starts a request whose body arrives one byte a second (chunked),
// and returns a channel of its status (0 when the connection was cut).
func trickle(t *testing.T, url string, hdr map[string]string) <-chan int {
	t.Helper()
	pr, pw := io.Pipe()
	stop := make(chan struct{})
	go func() {
		// Exits when the request is answered or cut, or after a minute.
		for i := 0; i < 60; i++ {
			if _, err := pw.Write([]byte{0x80}); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, url, pr)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	out := make(chan int, 1)
	go func() {
		// Exits when the answer (or the cut) arrives.
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		defer close(stop)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			pr.CloseWithError(err)
			out <- 0
			return
		}
		resp.Body.Close()
		pr.Close()
		out <- resp.StatusCode
	}()
	return out
}

// TestSlowBodiesHoldNothing: trickling /v1/replicate bodies with a valid
// peer secret used to take every replay permit before their bodies were
// read, so every genuine batch got 429; and a trickling body was held for
// ever. Now permits are taken after the body is in, a peer reads at most
// its share of bodies, and a body slower than the minimum rate is cut.
func TestSlowBodiesHoldNothing(t *testing.T) {
	o := opts(t.TempDir())
	o.Peers = []node.Peer{{Name: "b", Secret: "sb"}, {Name: "c", Secret: "sc"}}
	o.Gossip = &node.GossipOptions{Bind: "127.0.0.1:0"}
	o.BodyGrace = 500 * time.Millisecond
	n := nodetest.Open(t, o)
	defer n.Close()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	url := n.URL() + "/v1/replicate"
	var slow []<-chan int
	for i := 0; i < 6; i++ {
		slow = append(slow, trickle(t, url, map[string]string{"X-Replicator-Origin": "b", "Authorization": "Bearer sb",
			"Content-Type": "application/msgpack"}))
	}
	time.Sleep(200 * time.Millisecond)
	// c's genuine batch goes through while b trickles.
	e := entry.Entry{Index: 1, Origin: "c", Stream: entry.StreamID{0xc}, Commit: hlc.Timestamp{Wall: time.Now().UnixNano()}, Op: entry.OpSet, Key: "k", Value: []byte("v")}
	e.Stamp = e.Commit
	body := wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: "c", Stream: e.Stream}, Entries: []entry.Entry{e}})
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("X-Replicator-Origin", "c")
	req.Header.Set("Authorization", "Bearer sc")
	req.Header.Set("Content-Type", "application/msgpack")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a genuine batch while another peer trickles: %d", resp.StatusCode)
	}
	// The trickles: two beyond b's share are refused at once; the others
	// are cut once they fall below the minimum rate.
	refused, cut := 0, 0
	for _, ch := range slow {
		select {
		case st := <-ch:
			if st == 429 {
				refused++
			} else {
				cut++
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a trickling body is still held after 10 s")
		}
	}
	if refused != 2 || cut != 4 {
		t.Fatalf("trickles: %d refused beyond the share, %d cut; want 2 and 4", refused, cut)
	}
}

// TestUnauthenticatedBodyNotDrained: with an API token, a request without it
// gets its 401 at once, although its body trickles (the server used to drain
// the body before answering).
func TestUnauthenticatedBodyNotDrained(t *testing.T) {
	o := opts(t.TempDir())
	o.APIToken = "tok"
	n := nodetest.Open(t, o)
	defer n.Close()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	ch := trickle(t, n.URL()+"/v1/kv/k", nil)
	select {
	case st := <-ch:
		if st != 401 {
			t.Fatalf("status %d, want 401", st)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no 401 within 3 s while the body trickles")
	}
}

// TestBrowserRequestsRefused: without a token, a cross-site form POST from a
// web page used to reach every mutating endpoint, and a DNS name rebound to
// 127.0.0.1 reached a loopback node. Both are refused; a script or the CLI
// (no browser headers) and loopback names are served.
func TestBrowserRequestsRefused(t *testing.T) {
	n := nodetest.Open(t, opts(t.TempDir()))
	defer n.Close()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	do := func(method, path, host string, hdr map[string]string) int {
		req, _ := http.NewRequest(method, n.URL()+path, strings.NewReader("v"))
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	cross := map[string]string{"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
	for _, path := range []string{"/v1/kv/k", "/v1/batch", "/v1/bulk", "/admin/peers/b/pause", "/admin/deadletters/x/discard"} {
		method := http.MethodPost
		if path == "/v1/kv/k" {
			method = http.MethodPut
		}
		if st := do(method, path, "", cross); st != http.StatusForbidden {
			t.Errorf("a cross-site %s %s: %d, want 403", method, path, st)
		}
	}
	if st := do(http.MethodPost, "/v1/batch", "", map[string]string{"Origin": "https://evil.example"}); st != http.StatusForbidden {
		t.Errorf("a POST with a foreign Origin: %d, want 403", st)
	}
	if st := do(http.MethodPut, "/v1/kv/k", "", nil); st != 200 {
		t.Errorf("a script's PUT: %d, want 200", st)
	}
	if st := do(http.MethodGet, "/v1/kv/k", "rebound.evil.example:7400", nil); st != http.StatusMisdirectedRequest {
		t.Errorf("a rebound host name: %d, want 421", st)
	}
	for _, h := range []string{"localhost:7400", "127.0.0.1", "[::1]:7400"} {
		if st := do(http.MethodGet, "/v1/kv/k", h, nil); st != 200 {
			t.Errorf("host %s: %d, want 200", h, st)
		}
	}
}

// TestPprofNeedsToken: profiles are not served without the API token.
func TestPprofNeedsToken(t *testing.T) {
	o := opts(t.TempDir())
	o.Pprof = true
	if _, err := node.Open(context.Background(), o); err == nil || !strings.Contains(err.Error(), "pprof") {
		t.Fatalf("--pprof without a token: %v", err)
	}
}

// TestIdleConnectionsDoNotLockOut: at the connection bound, idle keep-alive
// connections give way to a new client (a health check must not wait two
// minutes behind them).
func TestIdleConnectionsDoNotLockOut(t *testing.T) {
	o := opts(t.TempDir())
	o.MaxConnections = 4
	n := nodetest.Open(t, o)
	defer n.Close()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	var idle []*http.Transport
	for i := 0; i < 8; i++ { // twice the bound, each left idle
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr, Timeout: 3 * time.Second}
		resp, err := c.Get(n.URL() + "/healthz")
		if err != nil {
			t.Fatalf("client %d behind %d idle connections at a bound of 4: %v", i, len(idle), err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		idle = append(idle, tr)
	}
}

// TestNeverAnsweringLinkAges: a peer that never answered (a mistyped URL, a
// firewall) reads lagging, then stalled, at the thresholds, instead of
// unknown for ever; each change is logged once, and its failures are counted
// in /metrics from the first scrape.
func TestNeverAnsweringLinkAges(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ghost := "http://" + dead.Addr().String()
	dead.Close() // nobody answers there
	var logs nodetest.SyncBuffer
	o := opts(t.TempDir())
	o.Peers = []node.Peer{{Name: "ghost", URL: ghost, Secret: "s"}}
	o.LinkLagging, o.LinkStalled = 300*time.Millisecond, 900*time.Millisecond
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	n := nodetest.Open(t, o)
	defer n.Close()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && !seen[transport.StateStalled] {
		seen[n.PeerStatus()[0].State] = true
		time.Sleep(20 * time.Millisecond)
	}
	if !seen[transport.StateLagging] || !seen[transport.StateStalled] {
		t.Fatalf("states seen %v: want lagging, then stalled", seen)
	}
	time.Sleep(300 * time.Millisecond) // a few more watch rounds: no repeats
	out := logs.String()
	// Never reached, lagging is said at INFO (a healthy start of two
	// clusters together logs nothing above it); stalled is WARNed.
	for _, want := range []struct{ msg, state string }{
		{`level=INFO msg="peer link waiting for the peer's first answer"`, "peer=ghost "},
		{`level=WARN msg="peer link degraded"`, "peer=ghost state=stalled "},
	} {
		state := want.msg
		c := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, want.msg) && strings.Contains(line, want.state) {
				c++
			}
		}
		if c != 1 {
			t.Errorf("the change to %s logged %d times, want once:\n%s", state, c, out)
		}
	}
	if !strings.Contains(out, "connection refused") {
		t.Errorf("the log does not say why: %s", out)
	}
	resp, err := http.Get(n.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`replicator_peer_send_failures_total{cluster="a",peer="ghost"}`, `replicator_link_state{cluster="a",peer="ghost",state="stalled"} 1`,
		`replicator_link_state{cluster="a",peer="ghost",state="healthy"} 0`, `replicator_peer_last_contact_timestamp_seconds{cluster="a",peer="ghost"} 0`, "replicator_build_info{"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestPeerVersionsShown: during a rolling upgrade each link shows the build
// its peer answered with, in /admin/peers and as replicator_peer_build_info.
func TestPeerVersionsShown(t *testing.T) {
	m := nodetest.NewMesh(t, hlc.SystemClock{}, func(o *node.Options) {
		o.BuildVersion = map[string]string{"a": "v1.4.0", "b": "v1.5.0-rc.1"}[o.ClusterID]
	}, "a", "b")
	for _, tc := range []struct{ from, peer, want string }{{"a", "b", "v1.5.0-rc.1"}, {"b", "a", "v1.4.0"}} {
		deadline := time.Now().Add(10 * time.Second)
		for nodetest.Link(t, m.Nodes[tc.from], tc.peer).PeerVersion != tc.want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := nodetest.Link(t, m.Nodes[tc.from], tc.peer).PeerVersion; got != tc.want {
			t.Fatalf("%s sees %s at %q, want %q", tc.from, tc.peer, got, tc.want)
		}
		resp, err := http.Get(m.Nodes[tc.from].URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf(`replicator_peer_build_info{cluster=%q,peer=%q,version=%q} 1`, tc.from, tc.peer, tc.want)
		if !strings.Contains(string(body), want) {
			t.Errorf("%s /metrics lacks %s", tc.from, want)
		}
	}
	if v := m.Nodes["a"].OriginReport().Version; v != "v1.4.0" {
		t.Fatalf("a's /admin/origin version %q", v)
	}
}

// TestShortBodyWritesNothing: a PUT whose body ends before its
// Content-Length (the client died mid-request) writes nothing, and a body
// that trickles below the minimum rate is cut, on the exact-length read
// single writes use.
func TestShortBodyWritesNothing(t *testing.T) {
	o := opts(t.TempDir())
	o.BodyGrace = 300 * time.Millisecond
	n := nodetest.Open(t, o)
	defer n.Close()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(n.URL(), "http://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "PUT /v1/kv/short HTTP/1.1\r\nHost: %s\r\nContent-Length: 10\r\n\r\nhello", host)
	c.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, c)
	c.Close()

	// Declared lengths read at once (small) and as they arrive (large).
	for _, size := range []int{1000, 100000} {
		slow, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(slow, "PUT /v1/kv/slow-%d HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\nx", size, host, size)
		slow.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(slow); err != nil {
			t.Fatalf("a trickling PUT body of %d bytes is still held: %v", size, err)
		}
		slow.Close()
	}
	for _, k := range []string{"short", "slow-1000", "slow-100000"} {
		if _, err := n.Get(k); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("%s: a body that never completed wrote something (err %v)", k, err)
		}
	}
	// The connection-level path still works for a whole body.
	req, _ := http.NewRequest(http.MethodPut, n.URL()+"/v1/kv/whole", strings.NewReader("0123456789"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("whole body: %d %s", resp.StatusCode, body)
	}
	if rec, err := n.Get("whole"); err != nil || string(rec.Value) != "0123456789" {
		t.Fatalf("whole body: %v %q", err, rec.Value)
	}
}

// Issue 25, finding 5: the API token was the only credential, for data and
// admin alike: every client that could write could also join and remove
// nodes. With --admin-token-file, the admin endpoints take that token only,
// and the data endpoints the API token only; without it, the API token
// opens both (as before, with a warning at start).
func TestAdminTokenSeparate(t *testing.T) {
	status := func(n *node.Node, method, path, token string) int {
		req, _ := http.NewRequest(method, n.URL()+path, strings.NewReader("v"))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	o := opts(t.TempDir())
	o.APIToken, o.AdminToken = "data", "adm"
	n := nodetest.Start(t, o)
	for _, c := range []struct {
		method, path, token string
		want                int
	}{
		{http.MethodPut, "/v1/kv/k", "data", 200},
		{http.MethodPut, "/v1/kv/k", "adm", 401},
		{http.MethodGet, "/v1/kv/k", "", 401},
		{http.MethodGet, "/admin/peers", "adm", 200},
		{http.MethodGet, "/admin/peers", "data", 401},
		{http.MethodGet, "/admin/cluster", "data", 401},
		{http.MethodGet, "/admin/cluster", "adm", 200},
		{http.MethodGet, "/metrics", "data", 200},
		{http.MethodGet, "/healthz", "", 200},
	} {
		if got := status(n, c.method, c.path, c.token); got != c.want {
			t.Errorf("%s %s with %q: %d, want %d", c.method, c.path, c.token, got, c.want)
		}
	}
	o = opts(t.TempDir())
	o.APIToken = "data"
	n = nodetest.Start(t, o)
	if got := status(n, http.MethodGet, "/admin/peers", "data"); got != 200 {
		t.Errorf("without an admin token, the API token opens the admin endpoints: %d", got)
	}
}

// TestPlantedIdempotencyRecordNotReplayed: a peer attaches an idempotency
// record for a key a client will use to one of its own writes (of another
// key). The client's keyed write must happen, not "replay" the forged answer.
func TestPlantedIdempotencyRecordNotReplayed(t *testing.T) {
	o := opts(t.TempDir())
	o.Peers = []node.Peer{{Name: "b", Secret: "sb"}}
	o.Gossip = &node.GossipOptions{Bind: "127.0.0.1:0"}
	n := nodetest.Open(t, o)
	defer n.Close()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	target, _ := http.NewRequest(http.MethodPut, n.URL()+"/v1/kv/target", strings.NewReader("mine"))
	fp := httpapi.Fingerprint(target, "target", []byte("mine"))
	ts := hlc.Timestamp{Wall: time.Now().UnixNano()}
	e := entry.Entry{Index: 1, Origin: "b", Stream: entry.StreamID{0xb}, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: "elsewhere", Value: []byte("x"),
		Idem: &entry.Idem{Key: "victim-key", Fingerprint: fp, Status: 200, Body: []byte(`{"key":"target","version":"forged","origin":"b"}`),
			Expires: ts.Wall + int64(time.Hour)}}
	if st, body := nodetest.SendBatch(t, n, "b", "sb", e); st != http.StatusOK {
		t.Fatalf("b's batch: %d %s", st, body)
	}
	target.Header.Set(httpapi.HeaderIdempotencyKey, "victim-key")
	resp, err := http.DefaultClient.Do(target)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(httpapi.HeaderReplayed) != "" || strings.Contains(string(body), "forged") {
		t.Fatalf("the client's keyed write answered %d %q (replayed %q)", resp.StatusCode, body, resp.Header.Get(httpapi.HeaderReplayed))
	}
	if r, err := n.Get("target"); err != nil || string(r.Value) != "mine" {
		t.Fatalf("target after the keyed write: %q %v", r.Value, err)
	}
	// and a genuine retry of it replays
	retry, _ := http.NewRequest(http.MethodPut, n.URL()+"/v1/kv/target", strings.NewReader("mine"))
	retry.Header.Set(httpapi.HeaderIdempotencyKey, "victim-key")
	resp, err = http.DefaultClient.Do(retry)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(httpapi.HeaderReplayed) != "true" {
		t.Fatalf("a genuine retry: %d, replayed %q", resp.StatusCode, resp.Header.Get(httpapi.HeaderReplayed))
	}
}

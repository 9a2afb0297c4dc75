package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/wal"
)

// Black-box tests of one node: through the exported API, the HTTP surface
// and the shared harness (internal/nodetest) only.

// opts are a node of cluster a in dir.
func opts(dir string) *node.Options { return nodetest.Options("a", dir) }

func TestOptionsValidateReportsEverything(t *testing.T) {
	o := &node.Options{ClusterID: "Bad_ID!", MaxKeyBytes: -1, TombstoneRetention: time.Second, MaxGroupEntries: -3,
		Raft: &node.RaftOptions{Listen: "127.0.0.1:7500", ElectionTimeout: time.Millisecond, SnapshotInterval: -time.Second}}
	o.EnsureDefaults()
	err := o.Validate()
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"Bad_ID!", "data directory", "MaxKeyBytes", "TombstoneRetention", "MaxGroupEntries", "raft-election-timeout", "SnapshotInterval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestPutGetDeleteScan(t *testing.T) {
	n := nodetest.Open(t, opts(t.TempDir()))
	defer n.Close()
	ctx := context.Background()
	r1, err := n.Put(ctx, "a/1", []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	if r1.Origin != "a" || r1.Outcome != entry.Applied || r1.Index != 1 {
		t.Fatalf("put result %+v", r1)
	}
	rec, err := n.Get("a/1")
	if err != nil || string(rec.Value) != "one" || rec.Stamp.String() != r1.Version {
		t.Fatalf("get: %+v %v", rec, err)
	}
	r2, _ := n.Put(ctx, "a/1", []byte("two"))
	if r2.Version <= r1.Version && r2.Index != 2 {
		t.Fatalf("second write %+v not after %+v", r2, r1)
	}
	n.Put(ctx, "a/2", []byte("x"))
	n.Put(ctx, "b/1", []byte("y"))
	if _, err := n.Delete(ctx, "a/2"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Get("a/2"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("deleted key: %v", err)
	}
	items, next, err := n.Scan(api.ScanOptions{Prefix: "a/"})
	if err != nil || len(items) != 1 || items[0].Key != "a/1" || string(items[0].Value) != "two" || next != "" {
		t.Fatalf("scan: %+v %q %v", items, next, err)
	}
}

// TestRestartWithClockSetBack: a node restarted with its clock an hour
// behind still stamps above everything it stamped before, because the HLC
// high-water mark commits with every write.
func TestRestartWithClockSetBack(t *testing.T) {
	dir := t.TempDir()
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	o := opts(dir)
	o.Clock = pc
	n := nodetest.Open(t, o)
	var last entry.Stamp
	for i := 0; i < 50; i++ {
		r, err := n.Put(context.Background(), "k", []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		last, _ = entry.ParseStamp(r.Version)
	}
	n.Close()

	pc.Advance(-time.Hour)
	n = nodetest.Open(t, o)
	defer n.Close()
	r, err := n.Put(context.Background(), "k", []byte("after"))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := entry.ParseStamp(r.Version)
	if st.Compare(last) <= 0 {
		t.Fatalf("after restart with the clock an hour back: stamped %s, not above %s", st, last)
	}
	if rec, _ := n.Get("k"); string(rec.Value) != "after" {
		t.Fatalf("the newer write lost LWW: %q", rec.Value)
	}
}

func TestOriginPinnedAcrossStarts(t *testing.T) {
	dir := t.TempDir()
	n := nodetest.Open(t, opts(dir))
	if _, err := n.Put(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	n.Close()
	o := opts(dir)
	o.ClusterID = "b"
	_, err := node.Open(context.Background(), o)
	if !errors.Is(err, origin.ErrMismatch) || !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("start as another cluster: %v", err)
	}
	o.ReassignOrigin = true
	n = nodetest.Open(t, o)
	n.Close()
}

func TestEnvResolver(t *testing.T) {
	o := opts(t.TempDir())
	o.ClusterID = ""
	o.Origin = origin.Env{Var: "X", Lookup: func(string) (string, bool) { return "east-1", true }}
	n := nodetest.Open(t, o)
	defer n.Close()
	if n.ClusterID() != "east-1" {
		t.Fatalf("cluster %q", n.ClusterID())
	}
}

func TestValidation(t *testing.T) {
	o := opts(t.TempDir())
	o.MaxKeyBytes = 10
	o.MaxValueBytes = 20
	n := nodetest.Open(t, o)
	defer n.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		key   string
		value []byte
		want  error
	}{
		{"", nil, api.ErrInvalidKey},
		{"\xff\xfe", nil, api.ErrInvalidKey},
		{"12345678901", nil, api.ErrKeyTooLarge},
		{"k", make([]byte, 21), api.ErrValueTooLarge},
	} {
		if _, err := n.Put(ctx, tc.key, tc.value); !errors.Is(err, tc.want) {
			t.Errorf("put %q (%d bytes): %v, want %v", tc.key, len(tc.value), err, tc.want)
		}
	}
	if n.WALReport().Last != 0 {
		t.Fatalf("refused writes reached the WAL: last index %d", n.WALReport().Last)
	}
}

// TestGracefulShutdown closes the node while writers are busy: every write
// is either acknowledged (and then present after reopening) or refused.
func TestGracefulShutdown(t *testing.T) {
	dir := t.TempDir()
	n := nodetest.Open(t, opts(dir))
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string]bool{}
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				k := fmt.Sprintf("w%d-%d", w, i)
				if _, err := n.Put(context.Background(), k, []byte("v")); err != nil {
					if !errors.Is(err, api.ErrClosed) {
						t.Errorf("write during shutdown: %v", err)
					}
					return
				}
				mu.Lock()
				acked[k] = true
				mu.Unlock()
			}
		}(w)
	}
	time.Sleep(50 * time.Millisecond)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	n = nodetest.Open(t, opts(dir))
	defer n.Close()
	for k := range acked {
		if _, err := n.Get(k); err != nil {
			t.Fatalf("acknowledged %s lost over a graceful restart: %v", k, err)
		}
	}
	if len(acked) == 0 {
		t.Fatal("no writes acknowledged before shutdown")
	}
}

func TestCollectTombstonesAfterRetention(t *testing.T) {
	pc := hlc.NewManualClock(int64(100 * time.Hour))
	o := opts(t.TempDir())
	o.Clock = pc
	o.TombstoneRetention = time.Hour
	n := nodetest.Open(t, o)
	defer n.Close()
	n.Put(context.Background(), "k", []byte("v"))
	n.Delete(context.Background(), "k")
	if c, _ := n.CollectTombstones(); c != 0 {
		t.Fatalf("collected %d before retention", c)
	}
	pc.Advance(time.Hour + time.Second)
	if c, err := n.CollectTombstones(); c != 1 || err != nil {
		t.Fatalf("after retention: collected %d, %v", c, err)
	}
	d, _ := n.Digest()
	if d.Tombstones != 0 || d.Keys != 0 {
		t.Fatalf("digest after collection: %+v", d)
	}
}

func TestHTTPRoundTrip(t *testing.T) {
	n := nodetest.Start(t, opts(t.TempDir()))
	u := n.URL()
	resp, b := nodetest.Do(t, "PUT", u+"/v1/kv/dir/sub%20key", strings.NewReader("hello"))
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"key":"dir/sub key"`) || !strings.Contains(string(b), `"origin":"a"`) {
		t.Fatalf("put: %d %s", resp.StatusCode, b)
	}
	resp, b = nodetest.Do(t, "GET", u+"/v1/kv/dir/sub%20key", nil)
	if resp.StatusCode != 200 || string(b) != "hello" || resp.Header.Get("X-Replicator-Origin") != "a" ||
		!strings.HasPrefix(resp.Header.Get("ETag"), `"`) {
		t.Fatalf("get: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	resp, b = nodetest.Do(t, "GET", u+"/v1/kv?prefix=dir/", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"value":"aGVsbG8="`) {
		t.Fatalf("scan: %d %s", resp.StatusCode, b)
	}
	resp, _ = nodetest.Do(t, "GET", u+"/readyz", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("readyz %d", resp.StatusCode)
	}
}

func TestShuttingDownAnswers503(t *testing.T) {
	n := nodetest.Open(t, opts(t.TempDir()))
	h := n.Handler()
	n.Close()
	req, _ := http.NewRequest("PUT", "/v1/kv/x", strings.NewReader("v"))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), `"retryable":true`) {
		t.Fatalf("write during shutdown: %d %s", rec.Code, rec.Body.String())
	}
}

// TestDiskFullRefusesAndRecovers: while the WAL cannot be written, writes are
// refused as not written (nothing reaches the WAL or the store) and the node
// stays ready to serve reads; once space returns, writes are taken again
// without a restart.
func TestDiskFullRefusesAndRecovers(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "disk-full")
	o := opts(filepath.Join(dir, "data"))
	o.Testing.DiskFullFile = full
	n := nodetest.Start(t, o)
	ctx := context.Background()
	if _, err := n.Put(ctx, "before", []byte("v")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(full, []byte("full"), 0o644)
	last := n.WALReport().Last
	_, err := n.Put(ctx, "during", []byte("v"))
	if !errors.Is(err, api.ErrNotWritten) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("write on a full disk: %v", err)
	}
	resp, b := nodetest.Do(t, "PUT", n.URL()+"/v1/kv/during", strings.NewReader("v"))
	if resp.StatusCode != 503 || !strings.Contains(string(b), `"code":"not_written"`) || !strings.Contains(string(b), `"retryable":true`) {
		t.Fatalf("HTTP write on a full disk: %d %s", resp.StatusCode, b)
	}
	if n.WALReport().Last != last {
		t.Fatal("a refused write reached the WAL")
	}
	if _, err := n.Get("during"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a refused write is readable: %v", err)
	}
	if r, err := n.Get("before"); err != nil || string(r.Value) != "v" {
		t.Fatalf("reads fail on a full disk: %v", err)
	}
	os.WriteFile(full, nil, 0o644)
	if _, err := n.Put(ctx, "after", []byte("v")); err != nil {
		t.Fatalf("write once space returned: %v", err)
	}
}

// TestFailedStartClaimsNothing: a node whose listener cannot bind leaves no
// CLUSTER_ID behind (a mistyped --cluster-id that then failed on "address in
// use" used to pin the directory, and the corrected command was refused);
// a second node on a held directory is told which process holds it.
func TestFailedStartClaimsNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	o := opts(dir)
	o.ClusterID = "typo"
	o.Listen = busy.Addr().String()
	n := nodetest.Open(t, o)
	if err := n.Start(); err == nil {
		t.Fatal("started on a port in use")
	}
	n.Close()
	if _, err := os.Stat(filepath.Join(dir, origin.PinFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed start pinned the directory: %v", err)
	}
	o = opts(dir)
	o.ClusterID = "right"
	n = nodetest.Open(t, o)
	defer n.Close()
	o2 := opts(dir)
	o2.ClusterID = "right"
	if _, err := node.Open(context.Background(), o2); err == nil || !strings.Contains(err.Error(), "in use by process") {
		t.Fatalf("a second node on a held directory: %v", err)
	}
}

// TestRecoveryReplaysLog puts a command in the raft log that the store
// never saw (a crash between the log's fsync and the apply) and checks that
// Open applies it before it returns, and restores the clock above it.
func TestRecoveryReplaysLog(t *testing.T) {
	dir := t.TempDir()
	n := nodetest.Open(t, opts(dir))
	n.Put(context.Background(), "before", []byte("x"))
	n.Close()

	future := hlc.Timestamp{Wall: time.Now().Add(time.Hour).UnixNano()}
	cmd := machine.Command{}
	for i := 0; i < 300; i++ {
		cmd.Local = append(cmd.Local, machine.Proposal{Entry: entry.Entry{Commit: future.Add(time.Duration(i)), Op: entry.OpSet,
			Key: fmt.Sprintf("r/%03d", i), Value: []byte("replayed")}})
	}
	cmd.Local = append(cmd.Local, machine.Proposal{Entry: entry.Entry{Commit: future.Add(time.Second), Op: entry.OpDelete, Key: "before"}})
	appendCommand(t, dir, &cmd)

	n = nodetest.Open(t, opts(dir))
	defer n.Close()
	items, _, _ := n.Scan(api.ScanOptions{Prefix: "r/", Limit: 1000})
	if len(items) != 300 {
		t.Fatalf("replayed %d of 300 entries", len(items))
	}
	if _, err := n.Get("before"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("replayed delete not applied: %v", err)
	}
	r, _ := n.Put(context.Background(), "new", []byte("y"))
	st, _ := entry.ParseStamp(r.Version)
	if st.HLC.Compare(future.Add(time.Second)) <= 0 {
		t.Fatalf("clock not restored above replayed entries: %s", st)
	}
	if r.Index != 303 {
		t.Fatalf("new write got stream index %d, want 303", r.Index)
	}
}

// appendCommand writes c at the end of a stopped node's raft log, in its
// current term: committed by the node's next election, as a command whose
// append was fsynced before a crash.
func appendCommand(t *testing.T, dir string, c *machine.Command) {
	t.Helper()
	data, err := machine.NewEncoder().Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := wal.Open(filepath.Join(dir, "cluster", "raft"), &wal.Options{Logger: nodetest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	last, _ := rl.LastIndex()
	term, _ := rl.GetUint64([]byte("CurrentTerm"))
	if last == 0 || term == 0 {
		t.Fatalf("no raft state: last %d, term %d", last, term)
	}
	if err := rl.StoreLog(&raft.Log{Index: last + 1, Term: term, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// TestTornLogTailNodeServes damages the raft log's last segment at random
// offsets between runs: the node must start, keep every acknowledged write
// (they are in the store), and keep taking writes under stream indexes it
// never used before.
func TestTornLogTailNodeServes(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	dir := t.TempDir()
	o := opts(dir)
	o.WALSegmentSize = 16 << 10
	want := map[string]string{}
	seen := map[string]bool{} // stream/index pairs handed out
	for round := 0; round < 10; round++ {
		n, err := node.Open(context.Background(), o)
		if errors.Is(err, wal.ErrCorrupt) {
			// A flipped byte with whole later appends after it is not a
			// torn tail: the documented recovery moves the raft directory
			// aside (the store holds every applied write; a new stream
			// begins).
			if err := os.Rename(filepath.Join(dir, "cluster"), filepath.Join(dir, fmt.Sprintf("cluster.corrupt-%d", round))); err != nil {
				t.Fatal(err)
			}
			n, err = node.Open(context.Background(), o)
		}
		if err != nil {
			t.Fatalf("seed %d round %d: open: %v", seed, round, err)
		}
		for i := 0; i < 100; i++ {
			k := fmt.Sprintf("k%03d", r.IntN(200))
			v := fmt.Sprintf("r%d-%d", round, i)
			res, err := n.Put(context.Background(), k, []byte(v))
			if err != nil {
				t.Fatalf("seed %d round %d: put: %v", seed, round, err)
			}
			id := n.OriginReport().Stream + fmt.Sprint(res.Index)
			if seen[id] {
				t.Fatalf("seed %d: WAL identity %s reused", seed, id)
			}
			seen[id] = true
			want[k] = v
		}
		for k, v := range want {
			rec, err := n.Get(k)
			if err != nil || string(rec.Value) != v {
				t.Fatalf("seed %d round %d: %s = %q %v, want %q", seed, round, k, rec.Value, err, v)
			}
		}
		n.Close()
		logs, _ := filepath.Glob(filepath.Join(dir, "cluster", "raft", "log-*"))
		if len(logs) != 1 {
			t.Fatalf("raft log directories: %v", logs)
		}
		segs, _ := os.ReadDir(logs[0])
		if len(segs) == 0 {
			continue
		}
		last := filepath.Join(logs[0], segs[len(segs)-1].Name())
		data, _ := os.ReadFile(last)
		if len(data) == 0 {
			continue
		}
		off := r.IntN(len(data))
		if round%2 == 1 {
			os.Truncate(last, int64(off))
		} else {
			data[off] ^= 0x5a
			os.WriteFile(last, data, 0o644)
		}
	}
}

// TestHTTPErrors: each API error answers its status with a JSON error body,
// nothing is written, and the node keeps serving.
func TestHTTPErrors(t *testing.T) {
	n := nodetest.Start(t, opts(t.TempDir()))
	u := n.URL()
	long := strings.Repeat("k", 5000)
	type tc struct {
		name   string
		method string
		path   string
		body   io.Reader
		status int
		code   string
	}
	tests := []tc{
		{"empty key", "PUT", "/v1/kv/", strings.NewReader("v"), 400, "bad_key"},
		{"invalid utf-8 key", "PUT", "/v1/kv/%ff%fe", strings.NewReader("v"), 400, "bad_key"},
		{"key over 4 KiB", "PUT", "/v1/kv/" + long, strings.NewReader("v"), 413, "too_large"},
		{"value over 1 MiB", "PUT", "/v1/kv/big", bytes.NewReader(make([]byte, 1<<20+1)), 413, "too_large"},
		{"value over 1 MiB, no length", "PUT", "/v1/kv/big", io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), strings.NewReader("x")), 413, "too_large"},
		{"absent key", "GET", "/v1/kv/never", nil, 404, "not_found"},
		{"method", "POST", "/v1/kv/x", nil, 405, "method_not_allowed"},
		{"range method", "POST", "/v1/kv", nil, 405, "method_not_allowed"},
		{"range delete without bounds", "DELETE", "/v1/kv", nil, 400, "bad_request"},
		{"bad limit", "GET", "/v1/kv?limit=0", nil, 400, "bad_request"},
		{"unknown path", "GET", "/v2/nothing", nil, 404, "not_found"},
	}
	for _, c := range tests {
		req, _ := http.NewRequest(c.method, u+c.path, c.body)
		if c.name == "value over 1 MiB, no length" {
			req.ContentLength = -1
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(b), `"code":"`+c.code+`"`) ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s, want %d with code %s", c.name, resp.StatusCode, b, c.status, c.code)
		}
	}
	if n.WALReport().Last != 0 {
		t.Fatalf("bad requests wrote %d WAL entries", n.WALReport().Last)
	}
	resp, _ := nodetest.Do(t, "PUT", u+"/v1/kv/ok", strings.NewReader("fine"))
	if resp.StatusCode != 200 {
		t.Fatalf("node stopped serving after bad input: %d", resp.StatusCode)
	}
	// deleted keys read as 404 too
	nodetest.Do(t, "DELETE", u+"/v1/kv/ok", nil)
	resp, b := nodetest.Do(t, "GET", u+"/v1/kv/ok", nil)
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("deleted key: %d %s", resp.StatusCode, b)
	}
}

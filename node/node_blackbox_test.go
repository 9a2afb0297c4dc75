package node_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/origin"
)

// Black-box tests of one node: through the exported API, the HTTP surface
// and the shared harness (internal/nodetest) only.

// opts are a node of cluster a in dir.
func opts(dir string) *node.Options { return nodetest.Options("a", dir) }

func TestOptionsValidateReportsEverything(t *testing.T) {
	o := &node.Options{ClusterID: "Bad_ID!", MaxKeyBytes: -1, TombstoneRetention: time.Second, MaxGroupEntries: -3}
	o.EnsureDefaults()
	err := o.Validate()
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"Bad_ID!", "data directory", "MaxKeyBytes", "TombstoneRetention", "MaxGroupEntries"} {
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

package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Pebble's and net/http's long-lived helpers are not ours.
		goleak.IgnoreAnyFunction("github.com/cockroachdb/pebble/v2/internal/cache.(*shard).releaseLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		// Pebble leaves its disk-health ticker behind when Open fails on
		// a held lock (TestFailedStartClaimsNothing): Pebble's, not ours.
		goleak.IgnoreAnyFunction("github.com/cockroachdb/pebble/v2/vfs.(*diskHealthCheckingFS).startTickerLocked.func1"),
		// memberlist's Shutdown does not wait for a probe in flight; it ends
		// at its probe timeout.
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}

var quiet = slog.New(slog.NewTextHandler(testLogOut(), &slog.HandlerOptions{Level: slog.LevelDebug}))

func testLogOut() io.Writer {
	if os.Getenv("NODE_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}

func testOptions(dir string) *Options {
	return &Options{ClusterID: "a", DataDir: dir, Listen: "127.0.0.1:0", Logger: quiet}
}

func openNode(t testing.TB, o *Options) *Node {
	t.Helper()
	n, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRecoveryReplaysLog puts a command in the raft log that the store
// never saw (a crash between the log's fsync and the apply) and checks that
// Open applies it before it returns, and restores the clock above it.
func TestRecoveryReplaysLog(t *testing.T) {
	dir := t.TempDir()
	n := openNode(t, testOptions(dir))
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

	n = openNode(t, testOptions(dir))
	defer n.Close()
	items, _, _ := n.Scan(store.ScanOptions{Prefix: "r/", Limit: 1000})
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
	rl, err := wal.Open(filepath.Join(dir, "cluster", "raft"), &wal.Options{Logger: quiet})
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
	o := testOptions(dir)
	o.WALSegmentSize = 16 << 10
	want := map[string]string{}
	seen := map[string]bool{} // stream/index pairs handed out
	for round := 0; round < 10; round++ {
		n, err := Open(context.Background(), o)
		if errors.Is(err, wal.ErrCorrupt) {
			// A flipped byte with whole later appends after it is not a
			// torn tail: the documented recovery moves the raft directory
			// aside (the store holds every applied write; a new stream
			// begins).
			if err := os.Rename(filepath.Join(dir, "cluster"), filepath.Join(dir, fmt.Sprintf("cluster.corrupt-%d", round))); err != nil {
				t.Fatal(err)
			}
			n, err = Open(context.Background(), o)
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
			id := n.out.Stream().String() + fmt.Sprint(res.Index)
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

func startNode(t *testing.T, o *Options) *Node {
	n := openNode(t, o)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func do(t *testing.T, method, url string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

// TestHTTPErrors: each API error answers its status with a JSON error body,
// nothing is written, and the node keeps serving.
func TestHTTPErrors(t *testing.T) {
	n := startNode(t, testOptions(t.TempDir()))
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
	if n.out.Last() != 0 {
		t.Fatalf("bad requests wrote %d WAL entries", n.out.Last())
	}
	resp, _ := do(t, "PUT", u+"/v1/kv/ok", strings.NewReader("fine"))
	if resp.StatusCode != 200 {
		t.Fatalf("node stopped serving after bad input: %d", resp.StatusCode)
	}
	// deleted keys read as 404 too
	do(t, "DELETE", u+"/v1/kv/ok", nil)
	resp, b := do(t, "GET", u+"/v1/kv/ok", nil)
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("deleted key: %d %s", resp.StatusCode, b)
	}
}

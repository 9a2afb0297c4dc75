package node

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The white-box tests of package node (raft roles and partitions, the
// replica's migration and format raise, benchmarks) share these helpers;
// the scenario tests are black-box tests in package node_test, through
// internal/nodetest.

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

func waitFor(t testing.TB, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	why := ""
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = cond(); ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("not reached in %s: %s", d, why)
}

// syncBuffer is a bytes.Buffer safe for a logger and a test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

package node

// Hostile input (issue 13): each test is named for the finding it covers.

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/wire"
)

// TestPlantedIdempotencyRecordNotReplayed: a peer attaches an idempotency
// record for a key a client will use to one of its own writes (of another
// key). The client's keyed write must happen, not "replay" the forged answer.
func TestPlantedIdempotencyRecordNotReplayed(t *testing.T) {
	o := testOptions(t.TempDir())
	o.Peers = []Peer{{Name: "b", Secret: "sb"}}
	o.Gossip = &GossipOptions{Bind: "127.0.0.1:0"}
	n := openNode(t, o)
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
	if _, err := n.acceptor.Apply("b", &wire.Batch{Header: wire.Header{Sender: "b", Stream: e.Stream}, Entries: []entry.Entry{e}}); err != nil {
		t.Fatal(err)
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

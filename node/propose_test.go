package node

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
)

// These stay inside the package on purpose: they watch what a follower
// sends its leader on the raft port (a typed proposal, never a request of
// the HTTP API), which no outside observer can read.

// sentProposals records what a follower sends its leader.
type sentProposals struct {
	mu    sync.Mutex
	paths []string
}

func recordProposals(n *Node) *sentProposals {
	s := &sentProposals{}
	send := n.follower.Send
	n.follower.Send = func(req *http.Request) (*http.Response, error) {
		s.mu.Lock()
		s.paths = append(s.paths, req.Method+" "+req.URL.Path+" "+req.Header.Get("Content-Type"))
		s.mu.Unlock()
		return send(req)
	}
	return s
}

func (s *sentProposals) check(t *testing.T, atLeast int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.paths) < atLeast {
		t.Fatalf("the follower sent %d proposals, want at least %d", len(s.paths), atLeast)
	}
	for _, p := range s.paths {
		if p != "POST "+forward.PathPropose+" "+forward.ContentType {
			t.Fatalf("the follower sent %q, not a typed proposal", p)
		}
	}
}

// TestFollowerProposesTyped: a write a follower takes in process reaches the
// leader as a typed proposal (never a request of the HTTP API), is answered
// once the follower applied it, and comes back refused by its class: the
// error is of the leader's class, not a string parsed back.
func TestFollowerProposesTyped(t *testing.T) {
	c := newRaftCluster(t, "p", 3, nil)
	f := c.nodes[c.follower()]
	sent := recordProposals(f)
	ctx := context.Background()
	res, err := f.Put(ctx, "k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := f.Get("k"); err != nil || r.Stamp.String() != res.Version || res.Index == 0 || res.Stream.IsZero() {
		t.Fatalf("the follower reads %v (%v) of its write %+v", r.Stamp, err, res)
	}
	if _, err := f.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpCounter, Key: "n"}, Delta: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	var remote *api.RemoteError
	for _, tc := range []struct {
		name  string
		w     api.Write
		class error
	}{
		{"an increment of a value that is not an integer", api.Write{Entry: entry.Entry{Op: entry.OpCounter, Key: "k"}, Delta: 1}, api.ErrNotInteger},
		{"an increment out of range", api.Write{Entry: entry.Entry{Op: entry.OpCounter, Key: "n"}, Delta: 1}, api.ErrCounterRange},
		{"a reused idempotency key", api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: "k2", Value: []byte("b")},
			Keyed: &api.Keyed{Key: "idem-1", Fingerprint: []byte("other"), Answer: api.AnswerWrite}}, api.ErrIdempotencyConflict},
	} {
		if tc.class == api.ErrIdempotencyConflict {
			first := tc.w
			first.Keyed = &api.Keyed{Key: "idem-1", Fingerprint: []byte("first"), Answer: api.AnswerWrite}
			if _, err := f.Propose(ctx, first); err != nil {
				t.Fatal(err)
			}
		}
		_, err := f.Propose(ctx, tc.w)
		if !errors.Is(err, tc.class) || !errors.As(err, &remote) || errors.Is(err, api.ErrUnknownOutcome) {
			t.Fatalf("%s through the follower: %v (%T), want the class %v", tc.name, err, err, tc.class)
		}
	}
	_, err = f.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: "k", Value: []byte("w")}, Cond: &api.Condition{IfMatch: "1.0@p"}})
	var pe *api.PreconditionError
	if !errors.As(err, &pe) || pe.Current != res.Version {
		t.Fatalf("a failed If-Match through the follower: %v, want a precondition naming %s", err, res.Version)
	}
	// Checked by the leader as any write is.
	if _, err := f.Put(ctx, "", []byte("v")); !errors.Is(err, api.ErrInvalidKey) {
		t.Fatalf("an empty key through the follower: %v", err)
	}
	sent.check(t, 7)

	// The leader takes a proposal only for a caller granted the api scope:
	// a member that says its caller has none is refused before anything
	// is proposed.
	body, err := forward.EncodeProposal(ctx, api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: "scoped", Value: []byte("v")}})
	if err != nil {
		t.Fatal(err)
	}
	l := c.nodes[c.leader()]
	req, _ := http.NewRequest(http.MethodPost, forward.URL(l.group.ID(), forward.PathPropose), bytes.NewReader(body))
	req.Header.Set(forward.HeaderScope, "none")
	resp, err := f.svc.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a proposal for a caller without the api scope: %d", resp.StatusCode)
	}
	if _, err := l.Get("scoped"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the refused proposal wrote: %v", err)
	}
	// A client cannot reach the route through a follower's API: the
	// follower relays the request whole to the leader, which answers it as
	// a request of the API (no such route), not as a proposal.
	for _, nd := range []*Node{f, l} {
		resp, err := http.Post(nd.URL()+forward.PathPropose, forward.ContentType, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("a proposal on %s's API: %d, want 404", nd.nodeID, resp.StatusCode)
		}
	}
	if _, err := l.Get("scoped"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a proposal through the API wrote: %v", err)
	}
}

// TestHTTPFollowerWritesTyped: every write of the HTTP API a follower
// takes (a key's PUT and DELETE, a range delete, an increment, a batch, a
// bulk load) reaches the leader as a typed proposal, never relayed whole,
// and answers as the leader would: a keyed write's retry replays the same
// bytes, a failed If-Match names the key's version.
func TestHTTPFollowerWritesTyped(t *testing.T) {
	c := newRaftCluster(t, "h", 3, nil)
	f := c.nodes[c.follower()]
	sent := recordProposals(f)
	u := f.URL()
	steps := []struct {
		method, path, body string
		hdr                []string
		want               int
	}{
		{http.MethodPut, "/v1/kv/a", "1", nil, http.StatusOK},
		{http.MethodPut, "/v1/kv/b", "2", []string{"Idempotency-Key", "put-b"}, http.StatusOK},
		{http.MethodDelete, "/v1/kv/a", "", nil, http.StatusOK},
		{http.MethodPost, "/v1/counters/n", `{"delta": 5}`, nil, http.StatusOK},
		{http.MethodPost, "/v1/batch", `{"ops":[{"op":"set","key":"x","value":"x"},{"op":"delete","key":"y"}]}`, nil, http.StatusOK},
		{http.MethodPost, "/v1/bulk", `{"key":"bulk1","value":"v"}` + "\n", []string{"Content-Type", "application/x-ndjson"}, http.StatusOK},
		{http.MethodDelete, "/v1/kv?start=r0&end=r9", "", nil, http.StatusOK},
		{http.MethodPut, "/v1/kv/b", "3", []string{"If-Match", `"1.0@h"`}, http.StatusPreconditionFailed},
	}
	var first []byte
	for i, s := range steps {
		resp, body := do(t, s.method, u+s.path, strings.NewReader(s.body), s.hdr...)
		if resp.StatusCode != s.want {
			t.Fatalf("step %d (%s %s): %d %s, want %d", i, s.method, s.path, resp.StatusCode, body, s.want)
		}
		if i == 1 {
			first = body
		}
	}
	// The keyed write again: the leader's recorded answer, byte for byte.
	resp, again := do(t, http.MethodPut, u+"/v1/kv/b", strings.NewReader("2"), "Idempotency-Key", "put-b")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(again, first) {
		t.Fatalf("the keyed write's retry answered %d %s; the first answer was %s", resp.StatusCode, again, first)
	}
	sent.check(t, len(steps)+1)
	// Read your writes on the follower.
	if r, err := f.Get("x"); err != nil || string(r.Value) != "x" {
		t.Fatalf("x on the follower: %q, %v", r.Value, err)
	}
	if cnt, err := f.Counter("n"); err != nil || cnt.Value != 5 {
		t.Fatalf("n on the follower: %+v, %v", cnt, err)
	}
}

package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/policy"
)

func writes() []api.Write {
	return []api.Write{
		{Entry: entry.Entry{Op: entry.OpSet, Key: "k", Value: []byte("v")}},
		{Entry: entry.Entry{Op: entry.OpSet, Key: "empty", Value: []byte{}}},
		{Entry: entry.Entry{Op: entry.OpDelete, Key: "k"}, Cond: &api.Condition{IfMatch: "1.0@a"}},
		{Entry: entry.Entry{Op: entry.OpSet, Key: "n"}, Cond: &api.Condition{IfNoneMatch: true}},
		{Entry: entry.Entry{Op: entry.OpCounter, Key: "c"}, Delta: -7},
		{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "a", End: "b"}},
		{Ops: []api.BatchOp{{Key: "x", Value: []byte("1")}, {Delete: true, Key: "y"}},
			Keyed: &api.Keyed{Key: "op:1", Fingerprint: []byte{1, 2}, Answer: api.AnswerBatch, OpID: "1"}},
		{Ops: []api.BatchOp{}},
		// A transaction's reads and WATCH (VersionKeys).
		{Ops: []api.BatchOp{{Key: "x", Value: []byte("1")}}, Cond: &api.Condition{Keys: []api.KeyVersion{{Key: "x", Version: "4.0@a"}, {Key: "w"}}}},
		// Writes that expire (VersionExpiry).
		{Entry: entry.Entry{Op: entry.OpSet, Key: "ttl", Value: []byte("v"), Expires: 1e18}},
		{Ops: []api.BatchOp{{Key: "x", Value: []byte("1"), Expires: 1e18}, {Delete: true, Key: "y"}},
			Cond: &api.Condition{Keys: []api.KeyVersion{{Key: "w", Version: "4.0@a"}}}},
		// A conflict's loser restored (machine.ConflictLog) keeps what it
		// restores across the hop.
		{Entry: entry.Entry{Op: entry.OpSet, Key: "r", Value: []byte("lost"), Restores: &entry.Restore{
			Loser:  entry.Stamp{HLC: hlc.Timestamp{Wall: 5, Logical: 1}, Origin: "b"},
			Winner: entry.Stamp{HLC: hlc.Timestamp{Wall: 6}, Origin: "a"}}}},
	}
}

func TestProposalRoundTrips(t *testing.T) {
	for i, w := range writes() {
		b, err := EncodeProposal(context.Background(), w)
		if err != nil {
			t.Fatal(err)
		}
		ctx, got, err := DecodeProposal(context.Background(), b)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if w.Entry.Value != nil && len(w.Entry.Value) == 0 {
			got.Entry.Value = []byte{} // msgpack reads an empty binary as nil
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("%d: decoded %+v, sent %+v", i, got, w)
		}
		if _, ok := policy.KeyFrom(ctx); ok {
			t.Fatalf("%d: a scope nobody pinned", i)
		}
	}
	// The idempotency scope pinned on the caller's context crosses.
	k := policy.Key{ID: "retry-1", HLC: hlc.Timestamp{Wall: 1700000000000000000, Logical: 3}}
	b, _ := EncodeProposal(policy.WithKey(context.Background(), k), writes()[0])
	ctx, _, err := DecodeProposal(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := policy.KeyFrom(ctx); !ok || got != k {
		t.Fatalf("scope %+v (%v), pinned %+v", got, ok, k)
	}
	// A range delete's part for one raft group names its group (0 too).
	rd := api.Write{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: "a", End: "b"}}
	for _, g := range []int{0, 5} {
		b, _ = EncodeProposal(WithGroup(context.Background(), g), rd)
		ctx, _, err = DecodeProposal(context.Background(), b)
		if got, ok := GroupFrom(ctx); err != nil || !ok || got != g {
			t.Fatalf("group %d crossed as %d (%v, %v)", g, got, ok, err)
		}
	}
	b, _ = EncodeProposal(context.Background(), rd)
	if ctx, _, _ = DecodeProposal(context.Background(), b); ctx.Value(groupKey{}) != nil {
		t.Fatal("a range delete for every group names one")
	}
}

func TestMalformedProposalsAreRefused(t *testing.T) {
	good, _ := EncodeProposal(context.Background(), writes()[0])
	for name, b := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("PUT /v1/kv/k"),
		"truncated": good[:len(good)/2],
		"version":   mustMarshal(t, proposal{V: 3, Op: entry.OpSet, Key: "k"}),
		// Keys' versions only as VersionKeys, and VersionKeys only with
		// them: a leader of an older build refuses what it cannot check.
		"keys at version 1": mustMarshal(t, proposal{V: Version, Op: entry.OpMulti, Batch: true, Ops: []api.BatchOp{{Key: "x"}},
			Cond: &condition{Keys: []string{"x", ""}}}),
		"version 2 without keys": mustMarshal(t, proposal{V: VersionKeys, Op: entry.OpSet, Key: "k"}),
		"expiry at version 1":    mustMarshal(t, proposal{V: Version, Op: entry.OpSet, Key: "k", Expires: 5}),
		"expiry in an op at version 2": mustMarshal(t, proposal{V: VersionKeys, Op: entry.OpMulti, Batch: true,
			Ops: []api.BatchOp{{Key: "x", Expires: 5}}, Cond: &condition{Keys: []string{"x", ""}}}),
		"odd keys": mustMarshal(t, proposal{V: VersionKeys, Op: entry.OpMulti, Batch: true, Ops: []api.BatchOp{{Key: "x"}},
			Cond: &condition{Keys: []string{"x"}}}),
		"op":       mustMarshal(t, proposal{V: Version, Op: 9, Key: "k"}),
		"no op":    mustMarshal(t, proposal{V: Version, Key: "k"}),
		"batch op": mustMarshal(t, proposal{V: Version, Op: entry.OpSet, Batch: true}),
		// Only a range delete's part names a raft group, one of at most 64.
		"group of a set":     mustMarshal(t, proposal{V: Version, Op: entry.OpSet, Key: "k", Group: 2}),
		"group out of range": mustMarshal(t, proposal{V: Version, Op: entry.OpDeleteRange, Key: "k", Group: 66}),
	} {
		if _, _, err := DecodeProposal(context.Background(), b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAnswerCarriesTheResultAndTheClass(t *testing.T) {
	res := api.WriteResult{Key: "k", Version: "5.1@a", Origin: "a", Outcome: entry.Applied, Index: 9, Stream: entry.NewStreamID(),
		Counter: 4, Existed: 1, Replay: &api.IdemRecord{Key: "i", Fingerprint: []byte{9}, Status: 200, Body: []byte("{}\n"),
			Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: 5, Logical: 1}, Origin: "a"}, Expires: 77}}
	got, failure, applied, err := DecodeAnswer(EncodeAnswer(res, nil, 12))
	if err != nil || failure != nil || applied != 12 || !reflect.DeepEqual(got, res) {
		t.Fatalf("decoded %+v, %v, %d, %v; sent %+v", got, failure, applied, err, res)
	}
	for _, tc := range []struct {
		err        error
		class      error
		notWritten bool
	}{
		{fmt.Errorf("%w: the leader is moving", api.ErrNotWritten), api.ErrNotWritten, true},
		{fmt.Errorf("%w: fsync: EIO", api.ErrUnknownOutcome), api.ErrUnknownOutcome, false},
		{&api.PreconditionError{Key: "k", Current: "3.0@b", Why: "the version differs"}, api.ErrPrecondition, false},
		{&api.SaturatedError{Source: "outbound_backlog", Peer: "b", Cause: "entries", Waited: time.Second}, api.ErrSaturated, true},
		{fmt.Errorf("decide: %w", api.ErrKindConflict), api.ErrKindConflict, false},
		{fmt.Errorf("%w: too big", api.ErrValueTooLarge), api.ErrValueTooLarge, false},
		{fmt.Errorf("%w: %w", api.ErrNotWritten, &api.NotLeaderError{LeaderID: "n2"}), api.ErrNotLeader, true},
		{fmt.Errorf("%w: %w", api.ErrClosed, api.ErrNotWritten), api.ErrClosed, true},
		{errors.New("a bug"), api.ErrUnknownOutcome, false},
	} {
		_, failure, _, err := DecodeAnswer(EncodeAnswer(api.WriteResult{}, tc.err, 3))
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(failure, tc.class) || errors.Is(failure, api.ErrNotWritten) != tc.notWritten {
			t.Errorf("%v crossed as %v (class %s): is %v %v, not written %v", tc.err, failure, api.ClassOf(failure), tc.class, errors.Is(failure, tc.class), errors.Is(failure, api.ErrNotWritten))
		}
		if errors.Is(failure, api.ErrNotWritten) && errors.Is(failure, api.ErrUnknownOutcome) {
			t.Errorf("%v: both not written and unknown", tc.err)
		}
	}
	_, failure, _, _ = DecodeAnswer(EncodeAnswer(api.WriteResult{}, &api.PreconditionError{Key: "k", Current: "3.0@b", Deleted: "", Why: "differs"}, 0))
	var pe *api.PreconditionError
	if !errors.As(failure, &pe) || pe.Current != "3.0@b" || pe.Key != "k" || pe.Why != "differs" {
		t.Fatalf("precondition crossed as %#v", failure)
	}
}

// cluster is a leader and a follower wired in process: the follower's Send
// is the leader's handler (no listener).
type testCluster struct {
	leader   *Leader
	follower *Follower
	proposed []api.Write
	awaited  []uint64
	sends    int
}

func newCluster(propose func(api.Write) (api.WriteResult, error)) *testCluster {
	c := &testCluster{}
	c.leader = &Leader{MaxBody: 1 << 20, Applied: func(context.Context, api.Write) uint64 { return 41 },
		Propose: func(ctx context.Context, w api.Write) (api.WriteResult, error) {
			c.proposed = append(c.proposed, w)
			return propose(w)
		}}
	c.follower = &Follower{Self: "n2", Leader: func(context.Context) (string, error) { return "n1", nil },
		Local: func(context.Context, api.Write) (api.WriteResult, error) {
			return api.WriteResult{}, errors.New("not here")
		},
		Send: func(req *http.Request) (*http.Response, error) {
			c.sends++
			rec := httptest.NewRecorder()
			c.leader.ServeHTTP(rec, req)
			return rec.Result(), nil
		},
		URL:     func(id, uri string) string { return "http://" + id + ".raft.internal" + uri },
		NotSent: func(err error) bool { return strings.Contains(err.Error(), "dial") },
		Await: func(_ context.Context, i uint64) error {
			c.awaited = append(c.awaited, i)
			return nil
		},
		Counted: func(string) {}}
	return c
}

func TestFollowerProposesToTheLeader(t *testing.T) {
	c := newCluster(func(w api.Write) (api.WriteResult, error) {
		return api.WriteResult{Key: w.Entry.Key, Version: "9.0@a", Origin: "a", Index: 40}, nil
	})
	w := writes()[0]
	res, err := c.follower.Propose(context.Background(), w)
	if err != nil || res.Version != "9.0@a" || res.Index != 40 {
		t.Fatalf("%+v, %v", res, err)
	}
	if len(c.proposed) != 1 || !reflect.DeepEqual(c.proposed[0], w) {
		t.Fatalf("the leader proposed %+v", c.proposed)
	}
	if !reflect.DeepEqual(c.awaited, []uint64{41}) {
		t.Fatalf("the follower waited for %v, want the leader's applied index 41", c.awaited)
	}
}

func TestFollowerGetsTheLeadersClass(t *testing.T) {
	c := newCluster(func(api.Write) (api.WriteResult, error) {
		return api.WriteResult{}, &api.PreconditionError{Key: "k", Current: "2.0@a", Why: "differs"}
	})
	_, err := c.follower.Propose(context.Background(), writes()[0])
	var pe *api.PreconditionError
	if !errors.As(err, &pe) || pe.Current != "2.0@a" || errors.Is(err, api.ErrUnknownOutcome) {
		t.Fatalf("%v", err)
	}
	if len(c.awaited) != 0 {
		t.Fatalf("waited for %v after a refusal", c.awaited)
	}
}

func TestFollowerOutcomes(t *testing.T) {
	ok := func(api.Write) (api.WriteResult, error) { return api.WriteResult{Version: "1.0@a"}, nil }
	t.Run("never sent, twice: not written", func(t *testing.T) {
		c := newCluster(ok)
		c.follower.Send = func(*http.Request) (*http.Response, error) { c.sends++; return nil, errors.New("dial n1: refused") }
		_, err := c.follower.Propose(context.Background(), writes()[0])
		if !errors.Is(err, api.ErrNotWritten) || c.sends != 2 {
			t.Fatalf("%v after %d sends", err, c.sends)
		}
	})
	t.Run("sent, no answer: unknown outcome", func(t *testing.T) {
		c := newCluster(ok)
		c.follower.Send = func(req *http.Request) (*http.Response, error) {
			c.sends++
			c.leader.ServeHTTP(httptest.NewRecorder(), req) // applied there
			return nil, io.ErrUnexpectedEOF
		}
		_, err := c.follower.Propose(context.Background(), writes()[0])
		if !errors.Is(err, api.ErrUnknownOutcome) || errors.Is(err, api.ErrNotWritten) || c.sends != 1 || len(c.proposed) != 1 {
			t.Fatalf("%v after %d sends, %d proposed", err, c.sends, len(c.proposed))
		}
	})
	t.Run("an older leader: not written", func(t *testing.T) {
		c := newCluster(ok)
		c.follower.Send = func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(strings.NewReader("404 page not found"))}, nil
		}
		_, err := c.follower.Propose(context.Background(), writes()[0])
		if !errors.Is(err, api.ErrNotWritten) || !errors.Is(err, ErrOlderLeader) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("a garbled answer: unknown outcome", func(t *testing.T) {
		c := newCluster(ok)
		c.follower.Send = func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("\xc1"))}, nil
		}
		_, err := c.follower.Propose(context.Background(), writes()[0])
		if !errors.Is(err, api.ErrUnknownOutcome) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("written, not applied here in time: unknown outcome", func(t *testing.T) {
		c := newCluster(ok)
		c.follower.Await = func(context.Context, uint64) error { return context.DeadlineExceeded }
		_, err := c.follower.Propose(context.Background(), writes()[0])
		if !errors.Is(err, api.ErrUnknownOutcome) || len(c.proposed) != 1 {
			t.Fatalf("%v", err)
		}
	})
	t.Run("elected meanwhile: proposed here", func(t *testing.T) {
		c := newCluster(ok)
		c.follower.Leader = func(context.Context) (string, error) { return "n2", nil }
		local := 0
		c.follower.Local = func(context.Context, api.Write) (api.WriteResult, error) { local++; return api.WriteResult{}, nil }
		if _, err := c.follower.Propose(context.Background(), writes()[0]); err != nil || local != 1 || c.sends != 0 {
			t.Fatalf("%v, %d local, %d sent", err, local, c.sends)
		}
	})
	t.Run("no leader known: not written", func(t *testing.T) {
		c := newCluster(ok)
		c.follower.Leader = func(context.Context) (string, error) { return "", errors.New("no leader") }
		if _, err := c.follower.Propose(context.Background(), writes()[0]); !errors.Is(err, api.ErrNotWritten) || c.sends != 0 {
			t.Fatalf("%v", err)
		}
	})
}

func TestLeaderRefusesBadProposals(t *testing.T) {
	c := newCluster(func(api.Write) (api.WriteResult, error) { return api.WriteResult{}, nil })
	c.leader.MaxBody = 64
	for name, tc := range map[string]struct {
		method string
		body   []byte
		code   int
	}{
		"get":       {http.MethodGet, nil, http.StatusMethodNotAllowed},
		"malformed": {http.MethodPost, []byte("{}"), http.StatusBadRequest},
		"oversize":  {http.MethodPost, bytes.Repeat([]byte{0x90}, 65), http.StatusRequestEntityTooLarge},
	} {
		rec := httptest.NewRecorder()
		c.leader.ServeHTTP(rec, httptest.NewRequest(tc.method, PathPropose, bytes.NewReader(tc.body)))
		if rec.Code != tc.code {
			t.Errorf("%s: %d, want %d", name, rec.Code, tc.code)
		}
	}
	if len(c.proposed) != 0 {
		t.Fatalf("proposed %+v", c.proposed)
	}
	// The follower reads a refusal before the proposal as not written.
	c.follower.Send = func(req *http.Request) (*http.Response, error) {
		rec := httptest.NewRecorder()
		c.leader.ServeHTTP(rec, req)
		return rec.Result(), nil
	}
	_, err := c.follower.Propose(context.Background(), api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: "k", Value: make([]byte, 100)}})
	if !errors.Is(err, api.ErrNotWritten) {
		t.Fatalf("%v", err)
	}
}

func FuzzDecodeProposal(f *testing.F) {
	for _, w := range writes() {
		b, _ := EncodeProposal(context.Background(), w)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, w, err := DecodeProposal(context.Background(), b)
		if err != nil {
			return
		}
		again, err := EncodeProposal(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		_, w2, err := DecodeProposal(context.Background(), again)
		if err != nil || !reflect.DeepEqual(w, w2) {
			t.Fatalf("re-encoded %+v decodes as %+v (%v)", w, w2, err)
		}
	})
}

func FuzzDecodeAnswer(f *testing.F) {
	f.Add(EncodeAnswer(api.WriteResult{Key: "k", Version: "1.0@a", Stream: entry.NewStreamID()}, nil, 3))
	f.Add(EncodeAnswer(api.WriteResult{}, &api.PreconditionError{Key: "k"}, 3))
	f.Add(EncodeAnswer(api.WriteResult{}, api.ErrNotWritten, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		res, failure, _, err := DecodeAnswer(b)
		if err != nil {
			return
		}
		if failure != nil && res != (api.WriteResult{}) && res.Replay == nil {
			t.Fatalf("a failure with a result %+v", res)
		}
		if failure != nil && failure.Error() == "" && api.ClassOf(failure) == "" {
			t.Fatal("a failure of no class")
		}
	})
}

package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

// fakeNode is the node as the surface sees it, in memory: a map of keys,
// and an error the next write answers. Methods no test here reaches are the
// embedded interface's (nil: a call panics, so a route that reaches one
// fails its test).
type fakeNode struct {
	Node
	mu     sync.Mutex
	keys   map[string]entry.Record
	next   error
	writes []api.Write
}

func newFakeNode() *fakeNode { return &fakeNode{keys: map[string]entry.Record{}} }

func (f *fakeNode) ClusterID() string { return "a" }
func (f *fakeNode) Ready() error      { return nil }

func (f *fakeNode) Get(key string) (entry.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.keys[key]
	if !ok {
		return entry.Record{}, &api.NotFoundError{Key: key}
	}
	return r, nil
}

func (f *fakeNode) Propose(_ context.Context, w api.Write) (api.WriteResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, w)
	if err := f.next; err != nil {
		f.next = nil
		return api.WriteResult{}, err
	}
	st := entry.Stamp{HLC: hlc.Timestamp{Wall: int64(len(f.writes))}, Origin: "a"}
	switch w.Entry.Op {
	case entry.OpSet:
		f.keys[w.Entry.Key] = entry.Record{Value: w.Entry.Value, Stamp: st}
	case entry.OpDelete:
		delete(f.keys, w.Entry.Key)
	}
	return api.WriteResult{Key: w.Entry.Key, Version: st.String(), Origin: "a", Outcome: entry.Applied, Index: uint64(len(f.writes))}, nil
}

func serve(t *testing.T, h http.Handler, method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// errorCode reads an error answer's code and retryable flag.
func errorCode(t *testing.T, w *httptest.ResponseRecorder) (string, bool) {
	t.Helper()
	var e struct {
		Error struct {
			Code      string `json:"code"`
			Retryable bool   `json:"retryable"`
			Version   string `json:"version"`
		} `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
		t.Fatalf("error answer %q: %v", w.Body, err)
	}
	return e.Error.Code, e.Error.Retryable
}

// TestKeyRoundTripInMemory: the surface over a node in memory, without a
// listener: a PUT proposes one write of the key and value, a GET answers
// the value with its version as ETag, a missing key is 404.
func TestKeyRoundTripInMemory(t *testing.T) {
	f := newFakeNode()
	h := New(f, Options{MaxKeyBytes: 64, MaxValueBytes: 1024, MaxBatchBytes: 4096, Metrics: http.NotFoundHandler()}).Handler()
	if w := serve(t, h, http.MethodPut, "/v1/kv/a/b", "v1"); w.Code != http.StatusOK {
		t.Fatalf("PUT: %d %s", w.Code, w.Body)
	}
	if len(f.writes) != 1 || f.writes[0].Entry.Op != entry.OpSet || f.writes[0].Entry.Key != "a/b" || string(f.writes[0].Entry.Value) != "v1" {
		t.Fatalf("proposed %+v", f.writes)
	}
	w := serve(t, h, http.MethodGet, "/v1/kv/a/b", "")
	if w.Code != http.StatusOK || w.Body.String() != "v1" || w.Header().Get("ETag") != `"`+f.keys["a/b"].Stamp.String()+`"` {
		t.Fatalf("GET: %d %q ETag %q", w.Code, w.Body, w.Header().Get("ETag"))
	}
	if w := serve(t, h, http.MethodGet, "/v1/kv/none", ""); w.Code != http.StatusNotFound {
		t.Fatalf("GET of a missing key: %d", w.Code)
	}
	// Bounds are the surface's to check before the node is asked.
	if w := serve(t, h, http.MethodPut, "/v1/kv/"+strings.Repeat("k", 65), "v"); w.Code != http.StatusRequestEntityTooLarge && w.Code != http.StatusBadRequest {
		t.Fatalf("an oversize key: %d", w.Code)
	}
	if w := serve(t, h, http.MethodPut, "/v1/kv/big", strings.Repeat("v", 1025)); w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("an oversize value: %d", w.Code)
	}
	if len(f.writes) != 1 {
		t.Fatalf("refused writes reached the node: %+v", f.writes[1:])
	}
}

// TestWriteFailuresByClass: each class of a write's failure answers its
// status and code, and says whether a retry is safe; a precondition names
// the key's version.
func TestWriteFailuresByClass(t *testing.T) {
	f := newFakeNode()
	h := New(f, Options{MaxKeyBytes: 64, MaxValueBytes: 1024, MaxBatchBytes: 4096, Metrics: http.NotFoundHandler()}).Handler()
	for _, c := range []struct {
		err       error
		status    int
		code      string
		retryable bool
	}{
		{fmt.Errorf("%w: no leader", api.ErrNotWritten), http.StatusServiceUnavailable, "not_written", true},
		{fmt.Errorf("%w: the leader did not answer", api.ErrUnknownOutcome), http.StatusServiceUnavailable, "unknown_outcome", true},
		{&api.PreconditionError{Key: "k", Current: "5.0@b"}, http.StatusPreconditionFailed, "precondition_failed", false},
		{fmt.Errorf("%w: a counter", api.ErrKindConflict), http.StatusConflict, "kind_conflict", false},
		{fmt.Errorf("%w: reused", api.ErrIdempotencyConflict), http.StatusUnprocessableEntity, "idempotency_key_reused", false},
		{&api.CrossGroupError{Groups: []int{0, 2}, Keys: []string{"a", "b"}}, http.StatusBadRequest, "cross_group", false},
		{api.FailureOf(&api.CrossGroupError{Groups: []int{0, 2}, Keys: []string{"a", "b"}}).Err(), http.StatusBadRequest, "cross_group", false},
		{&api.RemoteError{}, 0, "", false}, // filled below
	} {
		if c.status == 0 {
			// A failure that came back from the leader by its class (a
			// typed proposal) answers as the class does here.
			c.err = api.FailureOf(fmt.Errorf("%w: the leader was deposed", api.ErrNotWritten)).Err()
			c.status, c.code, c.retryable = http.StatusServiceUnavailable, "not_written", true
		}
		f.next = c.err
		w := serve(t, h, http.MethodPut, "/v1/kv/k", "v")
		code, retryable := errorCode(t, w)
		if w.Code != c.status || code != c.code || retryable != c.retryable {
			t.Errorf("%v: %d %s (retryable %v), want %d %s (%v)", c.err, w.Code, code, retryable, c.status, c.code, c.retryable)
		}
	}
}

// TestRouteRules: the scope a route needs, the writes the node proposes
// wherever the leader is, and the paths refused before any route.
func TestRouteRules(t *testing.T) {
	f := newFakeNode()
	mux := New(f, Options{MaxKeyBytes: 64, MaxValueBytes: 1024, Metrics: http.NotFoundHandler()}).Handler()
	var refused []string
	need := NeedScope(mux, func(code string) { refused = append(refused, code) })
	for _, c := range []struct {
		method, path string
		scope        Scope
		write        bool
	}{
		{http.MethodPut, "/v1/kv/k", ScopeAPI, true},
		{http.MethodDelete, "/v1/kv?start=a&end=b", ScopeAPI, true},
		{http.MethodPost, "/v1/counters/n", ScopeAPI, true},
		{http.MethodPost, "/v1/batch", ScopeAPI, true},
		{http.MethodPost, "/v1/bulk", ScopeAPI, true},
		{http.MethodGet, "/v1/kv/k", ScopeAPI, false},
		{http.MethodPost, "/admin/peers/b/pause", ScopeAdmin, false},
		{http.MethodGet, "/admin/cluster", ScopeAdmin, false},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		got, ok := need(httptest.NewRecorder(), r)
		if !ok || got != c.scope {
			t.Errorf("%s %s needs %v (%v), want %v", c.method, c.path, got, ok, c.scope)
		}
		if ClientWrite(r) != c.write {
			t.Errorf("%s %s: a client write %v, want %v", c.method, c.path, !c.write, c.write)
		}
	}
	// A path that is not canonical outside a key is refused before any
	// route (the mux would redirect it to the cleaned path, a door around
	// the scope its spelling needs); in a key route it is the key, escaped
	// whole, and needs the key route's scope.
	for _, p := range []string{"//admin/cluster", "/v1/../admin/cluster", "/admin/./cluster"} {
		w := httptest.NewRecorder()
		if _, ok := need(w, httptest.NewRequest(http.MethodGet, p, nil)); ok || w.Code != http.StatusBadRequest {
			t.Fatalf("%s: allowed %v, %d", p, ok, w.Code)
		}
	}
	if len(refused) != 3 || refused[0] != "bad_path" {
		t.Fatalf("refusals counted: %v", refused)
	}
	r := httptest.NewRequest(http.MethodGet, "/v1/kv/../../admin/cluster", nil)
	if got, ok := need(httptest.NewRecorder(), r); !ok || got != ScopeAPI || r.URL.RawPath != "/v1/kv/"+EscapeKey("../../admin/cluster") {
		t.Fatalf("a key of dot segments: scope %v (%v), path %q", got, ok, r.URL.RawPath)
	}
}

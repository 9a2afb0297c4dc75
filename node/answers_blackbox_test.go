package node_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/internal/nodetest"
)

func errorBody(t *testing.T, body []byte) httpjson.Error {
	t.Helper()
	var e struct{ Error httpjson.Error }
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return e.Error
}

// Answers a client can place in a history (issue 24): a 404 and a 412 on a
// deleted key carry the delete's version while its tombstone is kept; once
// collected, a 404 says below which stamp deletes were collected; a 503 on
// a write says whether it may have happened.
func TestAnswersPlaceableInAHistory(t *testing.T) {
	pc := hlc.NewManualClock(int64(100 * time.Hour))
	o := opts(t.TempDir())
	o.Clock, o.TombstoneRetention = pc, time.Hour
	n := nodetest.Start(t, o)
	ctx := context.Background()
	url := n.URL() + "/v1/kv/"

	resp, body := nodetest.Do(t, http.MethodGet, url+"never", nil)
	if e := errorBody(t, body); resp.StatusCode != http.StatusNotFound || e.Deleted || e.Version != "" || e.CollectedBelow != "" ||
		!strings.Contains(e.Message, "no value and no tombstone") {
		t.Fatalf("a key never written: %d %+v", resp.StatusCode, e)
	}
	if _, err := n.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	del, err := n.Delete(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	resp, body = nodetest.Do(t, http.MethodGet, url+"k", nil)
	if e := errorBody(t, body); resp.StatusCode != http.StatusNotFound || !e.Deleted || e.Version != del.Version {
		t.Fatalf("a deleted key: %d %+v, want the delete's version %s", resp.StatusCode, e, del.Version)
	}
	resp, body = nodetest.Do(t, http.MethodPut, url+"k", strings.NewReader("w"), "If-Match", `"`+del.Version+`"`)
	if e := errorBody(t, body); resp.StatusCode != http.StatusPreconditionFailed || !e.Deleted || e.Version != del.Version ||
		resp.Header.Get("ETag") != "" {
		t.Fatalf("If-Match on a deleted key: %d %+v", resp.StatusCode, e)
	}

	pc.Advance(time.Hour + time.Second)
	if c, err := n.CollectTombstones(); c != 1 || err != nil {
		t.Fatalf("collected %d, %v", c, err)
	}
	resp, body = nodetest.Do(t, http.MethodGet, url+"k", nil)
	e := errorBody(t, body)
	if resp.StatusCode != http.StatusNotFound || e.Deleted || e.CollectedBelow == "" {
		t.Fatalf("a key whose tombstone was collected: %d %+v", resp.StatusCode, e)
	}
	below, err := hlc.Parse(e.CollectedBelow)
	if err != nil {
		t.Fatal(err)
	}
	if deleted, err := entry.ParseStamp(del.Version); err != nil || !deleted.HLC.Less(below) {
		t.Fatalf("collected below %s, but the delete %s is not below it", below, del.Version)
	}

	// A write refused as the node shuts down says nothing was written: the
	// node's handler answers while Close runs (the listener is gone).
	h := n.Handler()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/v1/kv/late", strings.NewReader("v")))
	if e := errorBody(t, rec.Body.Bytes()); rec.Code != http.StatusServiceUnavailable || e.Outcome != "not_written" {
		t.Fatalf("a write refused at shutdown: %d %+v", rec.Code, e)
	}
}

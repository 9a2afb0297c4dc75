package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestDiffBoundByItsContextOnly (issue 49, 6): a comparison waits for the
// link's lag and reads the differing leaves on both sides; the HTTP
// client's own timeout (10 s by default, here 50 ms) used to end it
// whatever --timeout said. Only the context bounds it now; a write still
// has the client's timeout.
func TestDiffBoundByItsContextOnly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"peer":"b","equal":true,"repaired":-1}`))
	}))
	defer srv.Close()
	c := New(srv.URL, &Options{HTTPClient: &http.Client{Timeout: 50 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := c.Diff(ctx, "b", false)
	if err != nil || !rep.Equal || rep.Peer != "b" {
		t.Fatalf("a comparison longer than the HTTP client's timeout: %+v %v", rep, err)
	}
	if _, err := c.RebuildTree(ctx); err != nil {
		t.Fatalf("a rebuild longer than the HTTP client's timeout: %v", err)
	}
	if _, err := c.Put(ctx, "k", []byte("v")); err == nil {
		t.Fatal("a write outlived the HTTP client's timeout")
	}
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if _, err := c.Diff(short, "b", false); err == nil {
		t.Fatal("a comparison outlived its context")
	}
}

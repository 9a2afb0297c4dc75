package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/policy"
)

// TestMayHaveWritten: a failed write says whether it may have happened, as
// the server and the connection tell it, over every attempt made.
func TestMayHaveWritten(t *testing.T) {
	answer := func(status int, body string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			w.Write([]byte(body))
		}))
	}
	for _, tc := range []struct {
		name   string
		status int
		body   string
		maybe  bool
	}{
		{"saturated", 503, `{"error":{"code":"saturated","retryable":false,"outcome":"not_written","message":"m"}}`, false},
		{"saturated from a build that says no outcome", 503, `{"error":{"code":"saturated","retryable":false,"message":"m"}}`, false},
		{"not written", 503, `{"error":{"code":"not_written","retryable":true,"outcome":"not_written","message":"m"}}`, false},
		{"refused", 400, `{"error":{"code":"bad_key","message":"m"}}`, false},
		{"unknown outcome", 503, `{"error":{"code":"unknown_outcome","retryable":true,"outcome":"unknown","message":"m"}}`, true},
		{"a 500 without a body", 500, ``, true},
	} {
		srv := answer(tc.status, tc.body)
		_, err := New(srv.URL, nil).Put(context.Background(), "k", []byte("v"))
		srv.Close()
		if err == nil {
			t.Fatalf("%s: no error", tc.name)
		}
		if got := MayHaveWritten(err); got != tc.maybe {
			t.Errorf("%s: MayHaveWritten %v, want %v (%v)", tc.name, got, tc.maybe, err)
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.Status != tc.status {
			t.Errorf("%s: the API's error does not unwrap: %v", tc.name, err)
		}
	}

	// No connection: the request never left.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = New("http://"+addr, nil).Put(context.Background(), "k", []byte("v"))
	if err == nil || MayHaveWritten(err) {
		t.Fatalf("a refused connection: %v, may have written %v", err, MayHaveWritten(err))
	}

	// Retried under a key: one attempt with an unknown outcome makes the
	// whole write unknown, even when the last attempt never connected.
	calls := 0
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(503)
		w.Write([]byte(`{"error":{"code":"unknown_outcome","retryable":true,"outcome":"unknown","message":"m"}}`))
		go srv.CloseClientConnections()
		srv.Listener.Close() // the next attempt finds no listener
	}))
	defer srv.Close()
	p, err := policy.New(policy.Options{MaxAttempts: 3, InitialDelay: time.Millisecond, MaxDelay: time.Millisecond, NoJitter: true})
	if err != nil {
		t.Fatal(err)
	}
	c := New(srv.URL, &Options{Retry: p})
	ctx, _ := policy.NewScope(context.Background())
	_, err = c.Put(ctx, "k", []byte("v"))
	if err == nil || calls != 1 {
		t.Fatalf("calls %d, err %v", calls, err)
	}
	if !MayHaveWritten(err) {
		t.Fatalf("an attempt with an unknown outcome, then refused connections: said nothing was written (%v)", err)
	}
}

// TestBulkFailureSaysWhatWasLoaded: a load is not atomic. A bad line with
// records loaded before it leaves those written (MayHaveWritten), one with
// none loaded does not; a load that lost its answer may have written.
func TestBulkFailureSaysWhatWasLoaded(t *testing.T) {
	var loaded string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":{"code":"bulk_failed","message":"line 3: bad","retryable":false,"loaded":` + loaded + `}}`))
	}))
	defer srv.Close()
	c := New(srv.URL, nil)
	for _, tc := range []struct {
		loaded string
		may    bool
	}{{"2", true}, {"0", false}} {
		loaded = tc.loaded
		_, err := c.Bulk(context.Background(), strings.NewReader("{}\n"), false)
		var we *WriteError
		if !errors.As(err, &we) || MayHaveWritten(err) != tc.may {
			t.Fatalf("bulk_failed with %s loaded: %v (may have written %v, want %v)", tc.loaded, err, MayHaveWritten(err), tc.may)
		}
	}
	// The answer lost on the way back: the records may have been loaded.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			conn.Read(buf)
			conn.Close() // read the request, answer nothing
		}
	}()
	defer ln.Close()
	_, err := New("http://"+ln.Addr().String(), nil).Bulk(context.Background(), strings.NewReader("{}\n"), false)
	if !MayHaveWritten(err) {
		t.Fatalf("a load whose answer was lost: %v, said not written", err)
	}
}

package forward

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/listener"
)

// TestEnforceScopeOnTheRaftPort: what a member forwards reaches a route
// only within the scope it says it verified of its caller; a member of an
// older build says none and reaches the API's routes only; the handler sees
// the scope granted.
func TestEnforceScopeOnTheRaftPort(t *testing.T) {
	var seen []api.Scope
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = append(seen, listener.ScopeOf(r)) })
	need := func(w http.ResponseWriter, r *http.Request) (api.Scope, bool) {
		if r.URL.Path == "/admin/x" {
			return api.ScopeAdmin, true
		}
		return api.ScopeAPI, true
	}
	var refused []string
	g := EnforceScope(need, h, func(code string) { refused = append(refused, code) })
	for _, tc := range []struct {
		path, scope string
		code        int
	}{
		{"/v1/kv/k", "api", 200},
		{"/admin/x", "api", 403},
		{"/admin/x", "", 403},
		{"/v1/kv/k", "", 200},
		{"/admin/x", "api+admin", 200},
		{"/admin/x", "nonsense", 403},
	} {
		r := httptest.NewRequest(http.MethodPost, tc.path, nil)
		if tc.scope != "" {
			r.Header.Set(HeaderScope, tc.scope)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, r)
		if rec.Code != tc.code {
			t.Errorf("%s granted %q: %d, want %d", tc.path, tc.scope, rec.Code, tc.code)
		}
	}
	if len(seen) != 3 || seen[2] != api.ScopeAPI|api.ScopeAdmin || len(refused) != 3 {
		t.Fatalf("seen %v, refused %v", seen, refused)
	}
}

func TestWhoForwardedAndWhoCalled(t *testing.T) {
	s := NewService(true, nil)
	r := httptest.NewRequest(http.MethodGet, "/v1/kv/k?consistent=true", nil)
	if Forwarded(r) || !Consistent(r) || s.CallerOf(r) != "none" {
		t.Fatalf("a request on the API: forwarded %v, caller %q", Forwarded(r), s.CallerOf(r))
	}
	r.Header.Set("Authorization", "Bearer t")
	if c := s.CallerOf(r.WithContext(listener.WithScope(r.Context(), api.ScopeAdmin))); c != "admin token" {
		t.Fatalf("caller %q", c)
	}
	// Over the raft port, the sending member says whom it verified.
	r = r.WithContext(context.WithValue(r.Context(), serviceSenderKey{}, "n2#abc"))
	r.Header.Set(HeaderCaller, "API token")
	if !Forwarded(r) || s.CallerOf(r) != "API token, forwarded by n2#abc" {
		t.Fatalf("forwarded %v, caller %q", Forwarded(r), s.CallerOf(r))
	}
	// A dial to an address that names no member never leaves.
	_, err := s.Client.Get("http://10.0.0.1:1/")
	if !NotSent(err) {
		t.Fatalf("%v", err)
	}
	if !errors.Is(NoRedirects(nil, nil), http.ErrUseLastResponse) {
		t.Fatal("an internal client follows redirects")
	}
}

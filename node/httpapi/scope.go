package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/wire"
)

// Scope is what a route requires, and, as a set, what a caller's
// credentials grant (api.Scope).
type Scope = api.Scope

const (
	ScopeNone  = api.ScopeNone
	ScopeAPI   = api.ScopeAPI
	ScopeAdmin = api.ScopeAdmin
)

// ParseScope reads a scope's (or a grant's) name (api.ParseScope).
func ParseScope(s string) (Scope, bool) { return api.ParseScope(s) }

// RouteScope is the scope the route registered as pattern requires. It is
// decided from the route the mux matched, never from the raw path: a path
// that reaches an admin handler needs the admin scope however it is
// spelled.
func RouteScope(pattern string) Scope {
	switch pattern {
	case PathHealthz, PathReadyz, PathUI, wire.PathReplicate, wire.PathProve, wire.PathTree:
		return ScopeNone
	}
	if strings.HasPrefix(pattern, "/admin/") || strings.HasPrefix(pattern, "/debug/") {
		return ScopeAdmin
	}
	return ScopeAPI
}

// keyRoutes are the routes whose path ends in a key: any UTF-8, so `a//b`,
// `a/../b` and `dir/` are keys, not spellings of another path.
var keyRoutes = []string{"/v1/kv/", "/v1/counters/", "/v1/idempotency/"}

// ErrNonCanonical refuses a path that is not in its canonical form outside
// the key of a key route.
var ErrNonCanonical = errors.New("httpapi: the path is not canonical (no empty, '.' or '..' segments outside a key; escape them in a key)")

// Canonical checks r's path and readies it for the mux: a path outside a
// key route must be canonical (the mux would answer another spelling with a
// redirect to the cleaned path, which a forwarding hop must never follow);
// in a key route the key is taken as it is, whatever its segments, and
// escaped whole so the mux matches it without cleaning it. Idempotent.
func Canonical(r *http.Request) error {
	ep := r.URL.EscapedPath()
	for _, p := range keyRoutes {
		if strings.HasPrefix(ep, p) {
			// p has no escapes, so the decoded path starts with it too.
			r.URL.RawPath = p + EscapeKey(strings.TrimPrefix(r.URL.Path, p))
			return nil
		}
	}
	if ep != cleanPath(ep) {
		return ErrNonCanonical
	}
	return nil
}

// EscapeKey escapes a key as one path segment: every '/' too, and a key of
// only '.' or '..', so no spelling of it is cleaned away.
func EscapeKey(key string) string {
	switch key {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(key)
}

// cleanPath is net/http's: path.Clean, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		if len(p) == len(np)+1 && strings.HasPrefix(p, np) {
			np = p
		} else {
			np += "/"
		}
	}
	return np
}

// NeedScope is the scope r needs: the scope of the route the mux matches
// (RouteScope), decided after the path is checked to be canonical
// (false: refused here).
func NeedScope(mux *http.ServeMux, refused func(code string)) func(w http.ResponseWriter, r *http.Request) (Scope, bool) {
	return func(w http.ResponseWriter, r *http.Request) (Scope, bool) {
		if !CanonicalOrRefuse(w, r, refused) {
			return ScopeNone, false
		}
		_, pattern := mux.Handler(r)
		return RouteScope(pattern), true
	}
}

// CanonicalOrRefuse refuses a path that is not canonical outside a key
// (Canonical) with a 400 that closes the connection, and readies a key
// route's path for the mux.
func CanonicalOrRefuse(w http.ResponseWriter, r *http.Request, refused func(code string)) bool {
	if err := Canonical(r); err != nil {
		refused("bad_path")
		w.Header().Set("Connection", "close") // refused before the body was read
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.Error{Code: "bad_path",
			Message: fmt.Sprintf("path %q: %v", r.URL.EscapedPath(), err)})
		return false
	}
	return true
}

// ClientWrite reports a write of the client API (a key's PUT or DELETE, a
// range delete, a counter's increment, a batch, a bulk load): the node
// proposes it, wherever the leader is, as a typed write.
func ClientWrite(r *http.Request) bool {
	p := r.URL.Path
	switch r.Method {
	case http.MethodPut:
		return strings.HasPrefix(p, pathKV+"/")
	case http.MethodDelete:
		return p == pathKV || strings.HasPrefix(p, pathKV+"/") || strings.HasPrefix(p, "/v1/counters/")
	case http.MethodPost:
		return strings.HasPrefix(p, "/v1/counters/") || p == pathBatch || p == pathBulk
	}
	return false
}

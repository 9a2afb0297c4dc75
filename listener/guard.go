package listener

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/internal/secret"
)

// Tokens are the credentials of a node's API: the API token, and the admin
// token (the API token's when empty). A scope whose token is not set is
// open to all.
type Tokens struct {
	API, Admin string
}

// RequireToken guards the API and admin endpoints with their tokens. need
// says the scope a request needs (the node's: the scope of the route its
// mux matches, decided after the path is checked to be canonical, so no
// spelling of an admin path reaches its handler with less than the admin
// scope), or false when it refused the request itself. The scope the
// caller's credentials grant goes with the request (ScopeOf): a follower
// forwards it, and the leader enforces it again.
func RequireToken(o Tokens, need func(w http.ResponseWriter, r *http.Request) (api.Scope, bool), h http.Handler, refused func(code string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		need, ok := need(w, r)
		if !ok {
			return
		}
		got := Granted(o, r)
		if !got.Allows(need) {
			// Said from the caller's side: what to send, and where the
			// replicator CLI takes it from; the node's own flag last, for
			// whoever runs it.
			which, flag := "the API token", "--api-token-file"
			if need == api.ScopeAdmin {
				which, flag = "the admin token", "--admin-token-file"
				if o.Admin == "" {
					which, flag = "the API token, which opens the admin endpoints while no admin token is set", "--api-token-file"
				}
			}
			refused("unauthenticated")
			RefuseEarly(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="replicator"`)
			httpjson.WriteError(w, http.StatusUnauthorized, httpjson.Error{Code: "unauthenticated",
				Message: "this node requires Authorization: Bearer <token> with " + which +
					" (replicator's commands send it from --token-file or $REPLICATOR_TOKEN_FILE; the node reads it from its " + flag + ")"})
			return
		}
		h.ServeHTTP(w, r.WithContext(WithScope(r.Context(), got)))
	})
}

// Granted is what r's credentials grant: the admin scope with the admin
// token (the API token when no admin token is given), the API scope with
// the API token; a scope whose token is not set is open to all. Tokens are
// compared in constant time.
func Granted(o Tokens, r *http.Request) api.Scope {
	auth := r.Header.Get("Authorization")
	var g api.Scope
	if o.API == "" || secret.Equal(auth, "Bearer "+o.API) {
		g |= api.ScopeAPI
	}
	if admin := o.admin(); admin == "" || secret.Equal(auth, "Bearer "+admin) {
		g |= api.ScopeAdmin
	}
	return g
}

type scopeKey struct{}

// WithScope records the scope a request's caller was granted.
func WithScope(ctx context.Context, s api.Scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, s)
}

// ScopeOf is the scope recorded with r (none when nothing verified it).
func ScopeOf(r *http.Request) api.Scope {
	s, _ := r.Context().Value(scopeKey{}).(api.Scope)
	return s
}

// admin is the token the admin endpoints require: Admin, or the API token
// when none is given.
func (o Tokens) admin() string {
	if o.Admin != "" {
		return o.Admin
	}
	return o.API
}

// Protect guards the API against browsers: a cross-site request that
// mutates (a form or text/plain POST from any web page the operator visits)
// is refused by Go's cross-origin protection, and a node on a loopback
// address without a token answers only requests that name a loopback host,
// so a DNS name rebound to 127.0.0.1 reaches nothing.
func Protect(o Tokens, h http.Handler, ln net.Listener, refused func(code string)) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refused("cross_origin")
		RefuseEarly(w)
		httpjson.WriteError(w, http.StatusForbidden, httpjson.Error{Code: "cross_origin",
			Message: "a cross-origin request that changes state is refused (send it from a script or the CLI, not a web page)"})
	}))
	h = cop.Handler(h)
	if o.API != "" || !loopback(ln) {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			host = hh
		}
		host = strings.Trim(host, "[]")
		if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && !strings.EqualFold(host, "localhost") {
			refused("host_not_allowed")
			RefuseEarly(w)
			httpjson.WriteError(w, http.StatusMisdirectedRequest, httpjson.Error{Code: "host_not_allowed",
				Message: fmt.Sprintf("host %q: this node listens on a loopback address without an API token, and answers only loopback names", r.Host)})
			return
		}
		h.ServeHTTP(w, r)
	})
}

func loopback(ln net.Listener) bool {
	if ln == nil {
		return false
	}
	a, ok := ln.Addr().(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}

package node

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/replicator/replicator/forward"
)

// This stays inside the package on purpose: it plays a member of the
// cluster sending the leader a request over the raft port with a scope of
// its choosing, which takes the member's own service client.

// adminRoutes are the admin endpoints, each as a request that would act or
// answer with admin data (issue 46: every one was reachable through a
// follower with the API token or, with only an admin token set, none).
// A forwarded request reaches only the routes within the scope the
// forwarding node granted: the leader enforces it whatever the follower
// does (a member of an older build, sending no scope, reaches the API).
func TestLeaderEnforcesTheForwardedScope(t *testing.T) {
	c := newRaftCluster(t, "a", 3, func(name string, o *Options) {
		o.APIToken, o.AdminToken = "the-api-token", "the-admin-token"
		o.InsecurePeers = true
	})
	l, w, _ := c.roles()
	svc := c.nodes[w].svc
	ask := func(method, path, scope string) int {
		req, err := http.NewRequest(method, forward.URL(c.nodes[l].group.ID(), path), bytes.NewReader(nil))
		if err != nil {
			t.Fatal(err)
		}
		if scope != "" {
			req.Header.Set(forward.HeaderScope, scope)
		}
		resp, err := svc.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		method, path, scope string
		want                int
	}{
		{"GET", "/admin/cluster", "api", http.StatusForbidden},
		{"GET", "/admin/cluster", "", http.StatusForbidden},
		{"GET", "/admin/cluster", "none", http.StatusForbidden},
		{"GET", "/admin/cluster", "admin", http.StatusOK},
		{"GET", "//admin/cluster", "admin", http.StatusBadRequest},
		{"GET", "/v1/kv/../../admin/cluster", "api", http.StatusNotFound}, // a key's read
		{"PUT", "/v1/kv/k", "none", http.StatusForbidden},
		{"PUT", "/v1/kv/k", "", http.StatusOK},
		{"PUT", "/v1/kv/k", "api", http.StatusOK},
	} {
		if got := ask(tc.method, tc.path, tc.scope); got != tc.want {
			t.Errorf("%s %s forwarded with scope %q: %d, want %d", tc.method, tc.path, tc.scope, got, tc.want)
		}
	}
}

package node_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/node/httpapi"
)

// adminRoutes are the admin endpoints, each as a request that would act or
// answer with admin data (issue 46: every one was reachable through a
// follower with the API token or, with only an admin token set, none).
var adminRoutes = []struct{ method, path string }{
	{"GET", "/admin/cluster?consistent=true"},
	{"GET", "/admin/peers"},
	{"GET", "/admin/digest?consistent=true"},
	{"GET", "/admin/wal"},
	{"GET", "/admin/origin"},
	{"GET", "/admin/history"},
	{"GET", "/admin/lag"},
	{"GET", "/admin/deadletters"},
	{"GET", "/admin/conflicts"},
	{"POST", "/admin/peers/b/pause"},
	{"POST", "/admin/peers/b/resume"},
	{"POST", "/admin/peers/b/reseed"},
	{"POST", "/admin/peers/b/detach"},
	{"POST", "/admin/peers/b/diff?repair=true"},
	{"POST", "/admin/peers/b/filter/release"},
	{"PUT", "/admin/peers/b/bandwidth"},
	{"PUT", "/admin/peers/b/filter"},
	{"POST", "/admin/tree/rebuild"},
	{"POST", "/admin/conflicts/x/restore"},
	{"POST", "/admin/deadletters/x/replay"},
	{"POST", "/admin/deadletters/x/discard"},
	{"POST", "/admin/cluster/remove"},
	{"POST", "/admin/cluster/join"},
}

// spellings are the ways of writing an admin path that reached it before
// the scope was taken from the matched route.
func spellings(p string) []string {
	rest := strings.TrimPrefix(p, "/")
	return []string{
		p,
		"/v1/kv/../../" + rest,
		"/" + p,
		"/./" + rest,
		"/v1/../" + rest,
		"/v1/kv/%2e%2e/%2e%2e/" + rest,
		"/admin/../" + rest,
	}
}

func rawDo(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{CheckRedirect: forward.NoRedirects, Timeout: 20 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// No spelling of an admin path reaches an admin handler, on a follower or
// the leader, with the API token or with no token; the admin token reaches
// each through a follower. With only an admin token set, the API stays open
// and the admin endpoints do not.
func TestAdminScopeFromTheMatchedRoute(t *testing.T) {
	for _, tc := range []struct {
		name     string
		apiToken string
	}{{"both tokens", "the-api-token"}, {"admin token only", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			c := nodetest.NewCluster(t, "a", 3, func(name string, o *node.Options) {
				o.APIToken, o.AdminToken = tc.apiToken, "the-admin-token"
				o.InsecurePeers = true // the raft port without credentials, beside a token (tests only)
				o.Peers = []node.Peer{{Name: "b", URL: "http://127.0.0.1:1", Secret: "s"}}
			})
			l, w, _ := c.Roles()
			for _, at := range []string{w, l} {
				base := c.Nodes[at].URL()
				for _, rt := range adminRoutes {
					for _, p := range spellings(rt.path) {
						for _, tok := range []string{"", tc.apiToken, "wrong"} {
							code, body := rawDo(t, rt.method, base+p, tok)
							// A write under /v1/kv/ writes a key of that name
							// (data, in the API scope): never an admin action.
							isKey := strings.HasPrefix(p, "/v1/kv/") && strings.Contains(body, `"key":"../../admin/`)
							if (code < 400 && !isKey) || strings.Contains(body, `"nodes":[`) || strings.Contains(body, `"links"`) {
								t.Errorf("%s %s at %s with token %q: %d %s", rt.method, p, at, tok, code, body)
							}
						}
					}
				}
			}
			for _, name := range c.Names {
				for _, st := range c.Nodes[name].PeerStatus() {
					if st.State == "paused" || st.State == "detached" {
						t.Fatalf("%s: the link to b is %s: an admin action ran", name, st.State)
					}
				}
			}
			// The admin token reaches the admin endpoints through a follower.
			for _, rt := range adminRoutes[:9] {
				if code, body := rawDo(t, rt.method, c.Nodes[w].URL()+rt.path, "the-admin-token"); code != http.StatusOK {
					t.Errorf("%s %s through %s with the admin token: %d %s", rt.method, rt.path, w, code, body)
				}
			}
			if code, body := rawDo(t, "POST", c.Nodes[w].URL()+"/admin/peers/b/pause", "the-admin-token"); code != http.StatusOK || !strings.Contains(body, "paused") {
				t.Fatalf("pause through %s with the admin token: %d %s", w, code, body)
			}
			if tc.apiToken == "" {
				// Only the admin endpoints are closed.
				if code, body := rawDo(t, "PUT", c.Nodes[w].URL()+"/v1/kv/open", ""); code != http.StatusOK {
					t.Fatalf("a write with only an admin token set: %d %s", code, body)
				}
			}
		})
	}
}

// Keys are any UTF-8: segments that a path cleaner would remove are keys of
// their own, written and read back through a follower, by the client and by
// a caller that does not escape them.
func TestKeysWithDotAndEmptySegments(t *testing.T) {
	c := nodetest.NewCluster(t, "a", 3, func(name string, o *node.Options) {
		o.APIToken = "tok"
		o.InsecurePeers = true
	})
	_, w, _ := c.Roles()
	cl := client.New(c.Nodes[w].URL(), &client.Options{Token: "tok"})
	ctx := context.Background()
	keys := []string{"a/../b", "a//b", "dir/", ".", "..", "/lead", "x/./y", "b"}
	for _, k := range keys {
		if _, err := cl.Put(ctx, k, []byte("v:"+k)); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
	}
	get := func(k string) ([]byte, error) {
		var b []byte
		_, err := cl.Do(ctx, http.MethodGet, client.KeyPath(k)+"?consistent=true", nil, nil, &b)
		return b, err
	}
	for _, k := range keys {
		v, err := get(k)
		if err != nil || string(v) != "v:"+k {
			t.Fatalf("get %q: %q %v", k, v, err)
		}
	}
	// Unescaped, as curl sends them: still the key itself, never a
	// redirect to another one.
	if code, body := rawDo(t, "PUT", c.Nodes[w].URL()+"/v1/kv/p/../q", "tok"); code != http.StatusOK {
		t.Fatalf("PUT /v1/kv/p/../q: %d %s", code, body)
	}
	if code, body := rawDo(t, "GET", c.Nodes[w].URL()+"/v1/kv/p/../q?consistent=true", "tok"); code != http.StatusOK {
		t.Fatalf("GET /v1/kv/p/../q: %d %s", code, body)
	}
	if _, err := get("q"); err == nil {
		t.Fatal("p/../q was written as q")
	}
	if got := httpapi.EscapeKey(".."); got != "%2E%2E" {
		t.Fatalf("EscapeKey(..) = %q", got)
	}
}

package listener

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/testpki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestGrantedScopes(t *testing.T) {
	for _, tc := range []struct {
		tokens Tokens
		auth   string
		want   api.Scope
	}{
		{Tokens{}, "", api.ScopeAPI | api.ScopeAdmin},
		{Tokens{API: "a"}, "", api.ScopeNone},
		{Tokens{API: "a"}, "Bearer a", api.ScopeAPI | api.ScopeAdmin}, // no admin token: the API's opens both
		{Tokens{API: "a", Admin: "x"}, "Bearer a", api.ScopeAPI},
		{Tokens{API: "a", Admin: "x"}, "Bearer x", api.ScopeAdmin},
		{Tokens{API: "a", Admin: "x"}, "Bearer ax", api.ScopeNone},
		{Tokens{Admin: "x"}, "", api.ScopeAPI}, // an admin token alone leaves the API open, not admin
		{Tokens{Admin: "x"}, "Bearer x", api.ScopeAPI | api.ScopeAdmin},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		if got := Granted(tc.tokens, r); got != tc.want {
			t.Errorf("%+v with %q: granted %s, want %s", tc.tokens, tc.auth, got, tc.want)
		}
	}
}

// TestRequireTokenByTheNeededScope: a request reaches the handler only with
// the scope need names, and carries its grant; a request need refused
// itself never reaches it.
func TestRequireTokenByTheNeededScope(t *testing.T) {
	tokens := Tokens{API: "a", Admin: "x"}
	var reached []api.Scope
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = append(reached, ScopeOf(r)) })
	var refusals []string
	need := func(w http.ResponseWriter, r *http.Request) (api.Scope, bool) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/admin/"):
			return api.ScopeAdmin, true
		case r.URL.Path == "/bad":
			http.Error(w, "bad path", http.StatusBadRequest)
			return api.ScopeNone, false
		case r.URL.Path == "/healthz":
			return api.ScopeNone, true
		}
		return api.ScopeAPI, true
	}
	guard := RequireToken(tokens, need, h, func(code string) { refusals = append(refusals, code) })
	for _, tc := range []struct {
		path, auth string
		code       int
	}{
		{"/v1/kv/k", "Bearer a", 200},
		{"/v1/kv/k", "Bearer x", 401},
		{"/admin/peers", "Bearer a", 401},
		{"/admin/peers", "Bearer x", 200},
		{"/healthz", "", 200},
		{"/bad", "Bearer x", 400},
	} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, tc.path, nil)
		r.Header.Set("Authorization", tc.auth)
		guard.ServeHTTP(rec, r)
		if rec.Code != tc.code {
			t.Errorf("%s with %q: %d, want %d", tc.path, tc.auth, rec.Code, tc.code)
		}
		if rec.Code == 401 && (rec.Header().Get("WWW-Authenticate") == "" || rec.Header().Get("Connection") != "close") {
			t.Errorf("%s: a refusal without its challenge or early close: %v", tc.path, rec.Header())
		}
		// The refusal says what the caller sends and where the CLI takes
		// it from, not only the node's flag (issue 49).
		if rec.Code == 401 && !strings.Contains(rec.Body.String(), "--token-file or $REPLICATOR_TOKEN_FILE") {
			t.Errorf("%s: the refusal does not tell the caller how to send the token: %s", tc.path, rec.Body)
		}
	}
	if len(reached) != 3 || reached[0] != api.ScopeAPI || reached[1] != api.ScopeAdmin {
		t.Fatalf("reached with %v", reached)
	}
	if strings.Join(refusals, ",") != "unauthenticated,unauthenticated" {
		t.Fatalf("refusals counted %v", refusals)
	}
}

type addrOnly struct {
	net.Listener
	addr net.Addr
}

func (a addrOnly) Addr() net.Addr { return a.addr }

func TestProtectFromBrowsers(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	lo := addrOnly{addr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}}
	var refusals []string
	refused := func(code string) { refusals = append(refusals, code) }
	h := Protect(Tokens{}, ok, lo, refused)
	for _, tc := range []struct {
		host, origin, site string
		method             string
		code               int
	}{
		{"127.0.0.1:1", "", "", http.MethodGet, 200},
		{"localhost:1", "", "", http.MethodPut, 200},
		{"[::1]:1", "", "", http.MethodGet, 200},
		{"rebound.example.com:1", "", "", http.MethodGet, http.StatusMisdirectedRequest},
		{"127.0.0.1:1", "https://evil.example", "cross-site", http.MethodPost, http.StatusForbidden},
	} {
		r := httptest.NewRequest(tc.method, "/v1/kv/k", nil)
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
			r.Header.Set("Sec-Fetch-Site", tc.site)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != tc.code {
			t.Errorf("%s %s from %q: %d, want %d", tc.method, tc.host, tc.origin, rec.Code, tc.code)
		}
	}
	if strings.Join(refusals, ",") != "host_not_allowed,cross_origin" {
		t.Fatalf("refusals %v", refusals)
	}
	// With a token, or off loopback, any host name is answered.
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Host = "replicator.example.com"
	for _, h := range []http.Handler{Protect(Tokens{API: "a"}, ok, lo, refused),
		Protect(Tokens{}, ok, addrOnly{addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.1")}}, refused)} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != 200 {
			t.Fatalf("%d", rec.Code)
		}
	}
}

// TestTLSNamesItsCluster: a certificate that names another cluster is
// refused at load and at reload (the old one stays); one that names none is
// refused with mutual TLS; a rotated pair is taken on reload.
func TestTLSNamesItsCluster(t *testing.T) {
	pki := testpki.New(t, "ca")
	cert, key, _ := pki.Issue(t, "a", ClusterURI("a"))
	tl, err := NewTLS(TLSOptions{Cert: cert, Key: key, ClientCA: pki.CAFile}, "a", quiet, nil)
	if err != nil || !tl.On() || tl.Server(true) == nil || tl.Client() == nil || tl.Expiry().IsZero() {
		t.Fatalf("%v", err)
	}
	if id, err := ClusterFromCert(tl.Live().Leaf, SANModeURI); err != nil || id != "a" {
		t.Fatalf("the certificate names %q (%v)", id, err)
	}
	otherCert, otherKey, _ := pki.Issue(t, "b", ClusterURI("b"))
	if _, err := NewTLS(TLSOptions{Cert: otherCert, Key: otherKey}, "a", quiet, nil); !errors.Is(err, ErrWrongCluster) {
		t.Fatalf("another cluster's certificate: %v", err)
	}
	uc, uk := pki.IssueUnnamed(t)
	if _, err := NewTLS(TLSOptions{Cert: uc, Key: uk, ClientCA: pki.CAFile}, "a", quiet, nil); !errors.Is(err, ErrWrongCluster) {
		t.Fatalf("an unnamed certificate with mutual TLS: %v", err)
	}
	if _, err := NewTLS(TLSOptions{ClientCA: pki.CAFile}, "a", quiet, nil); err == nil || !strings.Contains(err.Error(), "--tls-client-ca needs") {
		t.Fatalf("a client CA without a certificate: %v", err)
	}
	if _, err := NewTLS(TLSOptions{Cert: uc, Key: uk}, "a", quiet, nil); err != nil {
		t.Fatalf("an unnamed certificate without mutual TLS serves the API: %v", err)
	}
	if _, err := NewTLS(TLSOptions{Cert: "/nonexistent.pem", Key: key, PeerCA: "/nonexistent"}, "a", quiet, nil); err == nil ||
		!strings.Contains(err.Error(), "--peer-ca") || !strings.Contains(err.Error(), "--tls-cert") {
		t.Fatalf("every problem at once: %v", err)
	}
	// Reload: another cluster's pair is refused, the live one stays.
	live := tl.Live()
	copyFile(t, otherCert, cert)
	copyFile(t, otherKey, key)
	if err := tl.Reload(); !errors.Is(err, ErrWrongCluster) || tl.Live() != live {
		t.Fatalf("reload of another cluster's pair: %v", err)
	}
	reloaded := 0
	tl.reloaded = func() { reloaded++ }
	newCert, newKey, _ := pki.Issue(t, "a2", ClusterURI("a"))
	copyFile(t, newCert, cert)
	copyFile(t, newKey, key)
	future := time.Now().Add(time.Minute)
	os.Chtimes(cert, future, future)
	tl.ReloadIfChanged()
	if tl.Live() == live || reloaded != 1 || tl.Live().Leaf.Subject.CommonName != "a2" {
		t.Fatalf("the rotated pair was not taken (reloaded %d)", reloaded)
	}
	tl.ReloadIfChanged() // unchanged since: nothing
	if reloaded != 1 {
		t.Fatalf("reloaded %d times", reloaded)
	}
	var off *TLS
	if off.On() || off.Server(false) != nil || off.Client() != nil || off.Reload() != nil {
		t.Fatal("a node without TLS")
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestConnectionBound: at the bound a new connection takes the place of an
// idle keep-alive one instead of waiting behind it.
func TestConnectionBound(t *testing.T) {
	s := NewSet(Limits{MaxConnections: 2}, nil, quiet)
	ln, err := s.Listen(nil, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	var errc chan error
	srv := s.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), &errc)
	defer func() {
		srv.Close()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}()
	url := "http://" + ln.Addr().String() + "/"
	var clients []*http.Client
	for i := 0; i < 4; i++ {
		// Each client keeps its connection idle after its request.
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 5 * time.Second}
		clients = append(clients, c)
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("client %d behind %d idle connections: %v", i, i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	s.Wait()
}

// TestAWaitingClientTakesTheNextIdlePlace: at the bound with every
// connection busy, a new client waits; when one turns idle (its request
// answered, the connection kept alive), the new client takes its place at
// once instead of waiting for it to close; and Close ends the wait of an
// Accept at the bound.
func TestAWaitingClientTakesTheNextIdlePlace(t *testing.T) {
	s := NewSet(Limits{MaxConnections: 1}, nil, quiet)
	ln, err := s.Listen(nil, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	var errc chan error
	srv := s.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	}), &errc)
	url := "http://" + ln.Addr().String()
	first := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() {
		resp, err := first.Get(url + "/slow")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	<-entered // the one place is busy
	second := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	got := make(chan error, 1)
	go func() {
		resp, err := second.Get(url + "/")
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a second client was served past the bound: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release) // the first turns idle, kept alive by its client
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiting client: %v", err)
	}
	first.CloseIdleConnections()
	second.CloseIdleConnections()
	srv.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	s.Wait()
}

package node

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/internal/secret"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/origin"
)

// SAN modes: how a peer's certificate names its cluster.
const (
	SANModeURI = "uri" // a URI SAN replicator://cluster/<id>
	SANModeDNS = "dns" // the first label of the first DNS SAN (<id>.peers.example.com)
)

// tlsSetup holds the parsed TLS material.
type tlsSetup struct {
	opts *Options
	log  *slog.Logger
	// cluster is the node's cluster ID: a certificate that names another
	// is refused at load and at reload, not first met by a peer.
	cluster string
	// reloaded runs after a new certificate is in place (the peer client
	// closes its idle links, so the next batch presents it).
	reloaded func()

	cert     *tls.Certificate // the first one loaded: TLS is on
	clientCA *x509.CertPool   // verifies peers' client certificates
	peerCA   *x509.CertPool   // verifies peers' server certificates
	// live is the certificate handshakes use now: ReloadTLS replaces it,
	// so new connections get a rotated certificate (cert-manager) and the
	// ones open, links included, go on.
	live atomic.Pointer[tls.Certificate]
	mu   struct {
		sync.Mutex
		modTime time.Time // of the cert and key files when last tried
	}
}

// ReloadTLS reads --tls-cert and --tls-key again (SIGHUP, or the files
// changed): new connections, served and shipped, present the new
// certificate. A pair that does not load leaves the old one in place.
func (n *Node) ReloadTLS() error {
	if n.tls.cert == nil {
		return nil
	}
	n.tls.mu.Lock()
	defer n.tls.mu.Unlock()
	return n.tls.reloadLocked()
}

func (t *tlsSetup) reloadLocked() error {
	o := t.opts
	// Stamped before reading, so a pair that fails is not retried by the
	// watcher until it changes again (SIGHUP always retries).
	t.mu.modTime = tlsModTime(o.TLSCert, o.TLSKey)
	c, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
	if err == nil {
		err = t.check(&c)
	}
	if err != nil {
		t.log.Error("TLS certificate reload failed; keeping the current one", "cert", o.TLSCert, "err", err)
		return fmt.Errorf("node: reload --tls-cert/--tls-key: %w", err)
	}
	t.live.Store(&c)
	// Idle links dial again with the new client certificate; busy ones
	// keep theirs until they close (certificates are checked at the
	// handshake only).
	if t.reloaded != nil {
		t.reloaded()
	}
	t.log.Info("TLS certificate reloaded", "cert", o.TLSCert)
	return nil
}

func tlsModTime(paths ...string) time.Time {
	var t time.Time
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && fi.ModTime().After(t) {
			t = fi.ModTime()
		}
	}
	return t
}

// reloadTLSIfChanged reloads the certificate when its files changed.
func (t *tlsSetup) reloadIfChanged() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tlsModTime(t.opts.TLSCert, t.opts.TLSKey).After(t.mu.modTime) {
		_ = t.reloadLocked()
	}
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

func (t *tlsSetup) load() error {
	o := t.opts
	if o.TLSCert == "" && o.TLSKey == "" && o.TLSClientCA == "" && o.PeerCA == "" {
		return nil
	}
	var errs []error
	if o.TLSCert != "" || o.TLSKey != "" {
		c, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err == nil {
			err = t.check(&c)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node: --tls-cert/--tls-key: %w", err))
		} else {
			t.cert = &c
			t.live.Store(&c)
			t.mu.modTime = tlsModTime(o.TLSCert, o.TLSKey)
		}
	}
	if o.TLSClientCA != "" {
		p, err := loadPool(o.TLSClientCA)
		if err != nil {
			errs = append(errs, fmt.Errorf("node: --tls-client-ca: %w", err))
		}
		t.clientCA = p
	}
	peerCA := o.PeerCA
	if peerCA == "" {
		peerCA = o.TLSClientCA
	}
	if peerCA != "" {
		p, err := loadPool(peerCA)
		if err != nil {
			errs = append(errs, fmt.Errorf("node: --peer-ca: %w", err))
		}
		t.peerCA = p
	}
	if t.clientCA != nil && t.cert == nil && len(errs) == 0 {
		errs = append(errs, errors.New("node: --tls-client-ca needs --tls-cert and --tls-key"))
	}
	return errors.Join(errs...)
}

// check refuses a certificate that names another cluster than this node's
// (by --peer-san-mode): peers would refuse every batch it signs, as
// "forbidden", and the operator would learn it from the other side. One
// that names no cluster is taken only without mutual TLS (it serves the
// API only).
func (t *tlsSetup) check(c *tls.Certificate) error {
	leaf := c.Leaf
	if leaf == nil {
		if len(c.Certificate) == 0 {
			return errors.New("no certificate in the file")
		}
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return err
		}
		c.Leaf = leaf
	}
	id, err := ClusterFromCert(leaf, t.opts.PeerSANMode)
	if err != nil && t.opts.TLSClientCA != "" {
		// Mutual TLS: peers and the raft port read the cluster from this
		// certificate, and would refuse one that names none (a renewal
		// that lost its URI SAN would cost the cluster its quorum).
		return fmt.Errorf("%w: with --tls-client-ca the certificate must name this cluster %q (a URI SAN %s, or with --peer-san-mode dns the first label of its first DNS SAN): %w",
			ErrWrongCluster, t.cluster, ClusterURI(t.cluster), err)
	}
	if err == nil && t.cluster != "" && id != t.cluster {
		return fmt.Errorf("%w: the certificate names cluster %q (--peer-san-mode %s), and this node is cluster %q: peers would refuse what it signs",
			ErrWrongCluster, id, cmp.Or(t.opts.PeerSANMode, SANModeURI), t.cluster)
	}
	return nil
}

// ErrWrongCluster refuses a certificate that names another cluster.
var ErrWrongCluster = errors.New("node: certificate of another cluster")

// expiry is when the certificate in use expires (zero without TLS).
func (t *tlsSetup) expiry() time.Time {
	if c := t.live.Load(); c != nil && c.Leaf != nil {
		return c.Leaf.NotAfter
	}
	return time.Time{}
}

// serverTLS is the TLS config of a listener; requireClient makes it mutual.
func (t *tlsSetup) server(requireClient bool) *tls.Config {
	if t.cert == nil {
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return t.live.Load(), nil }}
	if t.clientCA != nil {
		c.ClientCAs = t.clientCA
		c.ClientAuth = tls.VerifyClientCertIfGiven
		if requireClient {
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return c
}

// clientTLS is what the shippers present to peers and how they verify them.
func (t *tlsSetup) client() *tls.Config {
	if t.cert == nil && t.peerCA == nil {
		return nil
	}
	c := &tls.Config{RootCAs: t.peerCA, MinVersion: tls.VersionTLS12}
	if t.cert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return t.live.Load(), nil }
	}
	return c
}

// certCluster resolves the cluster of a peer from its verified client
// certificate, if it presented one.
func (t *tlsSetup) certCluster(cs *tls.ConnectionState) (string, bool, error) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", false, nil
	}
	leaf := cs.VerifiedChains[0][0]
	id, err := ClusterFromCert(leaf, t.opts.PeerSANMode)
	return id, true, err
}

// ClusterFromCert reads the cluster ID a peer certificate names: a URI SAN
// replicator://cluster/<id> (mode "uri"), or the first label of its first
// DNS SAN (mode "dns").
func ClusterFromCert(c *x509.Certificate, mode string) (string, error) {
	var id string
	switch mode {
	case SANModeDNS:
		if len(c.DNSNames) == 0 {
			return "", errors.New("the certificate has no DNS SAN")
		}
		id, _, _ = strings.Cut(c.DNSNames[0], ".")
	default:
		for _, u := range c.URIs {
			if u.Scheme == "replicator" && u.Host == "cluster" {
				id = strings.TrimPrefix(u.Path, "/")
				break
			}
		}
		if id == "" {
			return "", errors.New("the certificate has no URI SAN replicator://cluster/<id>")
		}
	}
	if err := origin.Validate(id); err != nil {
		return "", err
	}
	return id, nil
}

// ClusterURI is the URI SAN that names a cluster in a peer certificate.
func ClusterURI(id string) *url.URL {
	return &url.URL{Scheme: "replicator", Host: "cluster", Path: "/" + id}
}

// requireToken guards the API and admin endpoints with their tokens. The
// scope a request needs is the scope of the route the mux matches
// (httpapi.RouteScope), decided after the path is checked to be canonical:
// no spelling of an admin path reaches its handler with less than the admin
// scope. The scope the caller's credentials grant goes with the request
// (scopeOf): a follower forwards it, and the leader enforces it again.
func requireToken(o *Options, mux *http.ServeMux, h http.Handler, refused func(code string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !canonical(w, r, refused) {
			return
		}
		_, pattern := mux.Handler(r)
		need, got := httpapi.RouteScope(pattern), grantedScope(o, r)
		if !got.Allows(need) {
			flag := "--api-token-file"
			if need == httpapi.ScopeAdmin {
				flag = "--admin-token-file"
				if o.AdminToken == "" {
					flag = "--api-token-file, which opens the admin endpoints while no --admin-token-file is given"
				}
			}
			refused("unauthenticated")
			refuseEarly(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="replicator"`)
			writeError(w, http.StatusUnauthorized, apiError{Code: "unauthenticated",
				Message: "this node requires Authorization: Bearer <token> (" + flag + ")"})
			return
		}
		h.ServeHTTP(w, r.WithContext(withScope(r.Context(), got)))
	})
}

// canonical refuses a path that is not canonical outside a key
// (httpapi.Canonical), and readies a key route's path for the mux.
func canonical(w http.ResponseWriter, r *http.Request, refused func(code string)) bool {
	if err := httpapi.Canonical(r); err != nil {
		refused("bad_path")
		refuseEarly(w)
		writeError(w, http.StatusBadRequest, apiError{Code: "bad_path",
			Message: fmt.Sprintf("path %q: %v", r.URL.EscapedPath(), err)})
		return false
	}
	return true
}

// grantedScope is what r's credentials grant: the admin scope with the
// admin token (the API token when no admin token is given), the API scope
// with the API token; a scope whose token is not set is open to all.
// Tokens are compared in constant time.
func grantedScope(o *Options, r *http.Request) httpapi.Scope {
	auth := r.Header.Get("Authorization")
	var g httpapi.Scope
	if o.APIToken == "" || secret.Equal(auth, "Bearer "+o.APIToken) {
		g |= httpapi.ScopeAPI
	}
	if admin := adminToken(o); admin == "" || secret.Equal(auth, "Bearer "+admin) {
		g |= httpapi.ScopeAdmin
	}
	return g
}

type scopeKey struct{}

// withScope records the scope a request's caller was granted.
func withScope(ctx context.Context, s httpapi.Scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, s)
}

// scopeOf is the scope recorded with r (none when nothing verified it).
func scopeOf(r *http.Request) httpapi.Scope {
	s, _ := r.Context().Value(scopeKey{}).(httpapi.Scope)
	return s
}

// adminToken is the token the admin endpoints require: AdminToken, or the
// API token when none is given.
func adminToken(o *Options) string {
	if o.AdminToken != "" {
		return o.AdminToken
	}
	return o.APIToken
}

// protect guards the API against browsers: a cross-site request that
// mutates (a form or text/plain POST from any web page the operator visits)
// is refused by Go's cross-origin protection, and a node on a loopback
// address without a token answers only requests that name a loopback host,
// so a DNS name rebound to 127.0.0.1 reaches nothing.
func protect(o *Options, h http.Handler, ln net.Listener, refused func(code string)) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refused("cross_origin")
		refuseEarly(w)
		writeError(w, http.StatusForbidden, apiError{Code: "cross_origin",
			Message: "a cross-origin request that changes state is refused (send it from a script or the CLI, not a web page)"})
	}))
	h = cop.Handler(h)
	if o.APIToken != "" || !loopback(ln) {
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
			refuseEarly(w)
			writeError(w, http.StatusMisdirectedRequest, apiError{Code: "host_not_allowed",
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

package listener

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/origin"
)

// SAN modes: how a peer's certificate names its cluster.
const (
	SANModeURI = "uri" // a URI SAN replicator://cluster/<id>
	SANModeDNS = "dns" // the first label of the first DNS SAN (<id>.peers.example.com)
)

// TLSOptions name the TLS material of a node's listeners and links.
type TLSOptions struct {
	// Cert and Key serve the listeners and are presented to peers;
	// ClientCA verifies clients' certificates (mutual TLS), PeerCA peers'
	// server certificates (ClientCA when empty); SANMode says how a
	// certificate names its cluster (SANModeURI, SANModeDNS).
	Cert, Key, ClientCA, PeerCA, SANMode string
}

// TLS holds the parsed TLS material (off when no certificate is loaded).
type TLS struct {
	opts TLSOptions
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

// Reload reads the certificate and key again (SIGHUP, or the files
// changed): new connections, served and shipped, present the new
// certificate. A pair that does not load leaves the old one in place.
func (t *TLS) Reload() error {
	if t == nil || t.cert == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reloadLocked()
}

func (t *TLS) reloadLocked() error {
	o := t.opts
	// Stamped before reading, so a pair that fails is not retried by the
	// watcher until it changes again (SIGHUP always retries).
	t.mu.modTime = tlsModTime(o.Cert, o.Key)
	c, err := tls.LoadX509KeyPair(o.Cert, o.Key)
	if err == nil {
		err = t.check(&c)
	}
	if err != nil {
		t.log.Error("TLS certificate reload failed; keeping the current one", "cert", o.Cert, "err", err)
		return fmt.Errorf("listener: reload --tls-cert/--tls-key: %w", err)
	}
	t.live.Store(&c)
	// Idle links dial again with the new client certificate; busy ones
	// keep theirs until they close (certificates are checked at the
	// handshake only).
	if t.reloaded != nil {
		t.reloaded()
	}
	t.log.Info("TLS certificate reloaded", "cert", o.Cert)
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

// ReloadIfChanged reloads the certificate when its files changed.
func (t *TLS) ReloadIfChanged() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tlsModTime(t.opts.Cert, t.opts.Key).After(t.mu.modTime) {
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

// NewTLS loads the material o names for a node of cluster (a certificate
// naming another is refused); reloaded runs after a reload put a new
// certificate in place. Every problem is reported at once.
func NewTLS(o TLSOptions, cluster string, log *slog.Logger, reloaded func()) (*TLS, error) {
	t := &TLS{opts: o, cluster: cluster, log: log, reloaded: reloaded}
	if err := t.load(); err != nil {
		return nil, err
	}
	return t, nil
}

// Scheme is the scheme of the listeners' URLs: https:// with a
// certificate, http:// without.
func (t *TLS) Scheme() string {
	if t.On() {
		return "https://"
	}
	return "http://"
}

// On reports a certificate loaded: the listeners serve TLS.
func (t *TLS) On() bool { return t != nil && t.cert != nil }

// Live is the certificate handshakes present now; ClientCA the pool that
// verifies clients' certificates (nil without mutual TLS).
func (t *TLS) Live() *tls.Certificate   { return t.live.Load() }
func (t *TLS) ClientCA() *x509.CertPool { return t.clientCA }

func (t *TLS) load() error {
	o := t.opts
	if o.Cert == "" && o.Key == "" && o.ClientCA == "" && o.PeerCA == "" {
		return nil
	}
	var errs []error
	if o.Cert != "" || o.Key != "" {
		c, err := tls.LoadX509KeyPair(o.Cert, o.Key)
		if err == nil {
			err = t.check(&c)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("listener: --tls-cert/--tls-key: %w", err))
		} else {
			t.cert = &c
			t.live.Store(&c)
			t.mu.modTime = tlsModTime(o.Cert, o.Key)
		}
	}
	if o.ClientCA != "" {
		p, err := loadPool(o.ClientCA)
		if err != nil {
			errs = append(errs, fmt.Errorf("listener: --tls-client-ca: %w", err))
		}
		t.clientCA = p
	}
	peerCA := o.PeerCA
	if peerCA == "" {
		peerCA = o.ClientCA
	}
	if peerCA != "" {
		p, err := loadPool(peerCA)
		if err != nil {
			errs = append(errs, fmt.Errorf("listener: --peer-ca: %w", err))
		}
		t.peerCA = p
	}
	if t.clientCA != nil && t.cert == nil && len(errs) == 0 {
		errs = append(errs, errors.New("listener: --tls-client-ca needs --tls-cert and --tls-key"))
	}
	return errors.Join(errs...)
}

// check refuses a certificate that names another cluster than this node's
// (by --peer-san-mode): peers would refuse every batch it signs, as
// "forbidden", and the operator would learn it from the other side. One
// that names no cluster is taken only without mutual TLS (it serves the
// API only).
func (t *TLS) check(c *tls.Certificate) error {
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
	id, err := ClusterFromCert(leaf, t.opts.SANMode)
	if err != nil && t.opts.ClientCA != "" {
		// Mutual TLS: peers and the raft port read the cluster from this
		// certificate, and would refuse one that names none (a renewal
		// that lost its URI SAN would cost the cluster its quorum).
		return fmt.Errorf("%w: with --tls-client-ca the certificate must name this cluster %q (a URI SAN %s, or with --peer-san-mode dns the first label of its first DNS SAN): %w",
			ErrWrongCluster, t.cluster, ClusterURI(t.cluster), err)
	}
	if err == nil && t.cluster != "" && id != t.cluster {
		return fmt.Errorf("%w: the certificate names cluster %q (--peer-san-mode %s), and this node is cluster %q: peers would refuse what it signs",
			ErrWrongCluster, id, cmp.Or(t.opts.SANMode, SANModeURI), t.cluster)
	}
	return nil
}

// ErrWrongCluster refuses a certificate that names another cluster.
var ErrWrongCluster = errors.New("listener: certificate of another cluster")

// Expiry is when the certificate in use expires (zero without TLS).
func (t *TLS) Expiry() time.Time {
	if t == nil {
		return time.Time{}
	}
	if c := t.live.Load(); c != nil && c.Leaf != nil {
		return c.Leaf.NotAfter
	}
	return time.Time{}
}

// Server is the TLS config of a listener (nil: plain); requireClient makes
// it mutual.
func (t *TLS) Server(requireClient bool) *tls.Config {
	if !t.On() {
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

// Client is what the shippers present to peers and how they verify them
// (nil: plain).
func (t *TLS) Client() *tls.Config {
	if t == nil || t.cert == nil && t.peerCA == nil {
		return nil
	}
	c := &tls.Config{RootCAs: t.peerCA, MinVersion: tls.VersionTLS12}
	if t.cert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return t.live.Load(), nil }
	}
	return c
}

// CertCluster resolves the cluster of a peer from its verified client
// certificate, if it presented one.
func (t *TLS) CertCluster(cs *tls.ConnectionState) (string, bool, error) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", false, nil
	}
	leaf := cs.VerifiedChains[0][0]
	id, err := ClusterFromCert(leaf, t.opts.SANMode)
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

// Package raftconn secures the raft port (issue 15, docs/CLUSTER.md). The
// raft transport carries every write of a cluster, so every connection on it
// is TLS 1.3 with a certificate on both ends, and each end checks that the
// other names the same cluster: a node with other credentials can neither
// join nor append, and cannot read what the others exchange.
//
// Two sources of certificates:
//
//   - the node's own (mutual TLS): the peer's chain is verified against the
//     cluster's CA and its certificate must name the cluster;
//   - a gossip key, when TLS is off: a CA is derived from the key (HKDF to an
//     Ed25519 key), and each node signs a certificate of its own with it at
//     start. Whoever holds the gossip key can join, the trust gossip already
//     has; nobody else can complete a handshake.
package raftconn

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// ErrNoCredentials is returned when neither certificates nor a gossip key
// were given and the insecure mode was not asked for.
var ErrNoCredentials = errors.New("raftconn: the raft port needs TLS certificates or a gossip key (or the insecure test mode)")

// serverName is the name every derived certificate carries and every dial
// asks for: the cluster is checked from the URI, not from DNS.
const serverName = "replicator-raft"

// Options configures a Layer. Give Certificate and CA, or GossipKey, or
// Insecure.
type Options struct {
	// Cluster is this node's cluster ID; a peer must name the same.
	Cluster string
	// Node is this node's ID, written into a derived certificate.
	Node string
	// Certificate returns the node's certificate (called per handshake, so
	// a reloaded certificate is used at once); CA verifies the other end.
	// ClusterOf says which cluster a verified certificate names.
	Certificate func() (*tls.Certificate, error)
	CA          *x509.CertPool
	ClusterOf   func(*x509.Certificate) (string, error)
	// RaftKey, the cluster's own raft secret (issue 25), derives the
	// cluster's CA when Certificate is nil: unlike the gossip key, which a
	// mesh may share among its clusters, nobody outside the cluster holds
	// it.
	RaftKey []byte
	// GossipKey derives the CA of the older scheme: the cluster's CA when
	// neither Certificate nor RaftKey is given, and, with AcceptGossipKey,
	// the credential shown to and accepted from nodes that have no raft
	// key yet (a rolling upgrade to the raft key).
	GossipKey       []byte
	AcceptGossipKey bool
	// Insecure serves plain TCP: tests of other things only.
	Insecure bool
	// Loopback serves plain TCP on a loopback address only, and dials and
	// accepts loopback addresses only: every node of the cluster runs on
	// this machine (tests, demos), and the port has the trust of a
	// loopback API without a token (any local process can reach it).
	Loopback bool
	// HandshakeTimeout bounds an accepted connection's handshake (default
	// 10s), so that a silent client does not hold a goroutine.
	HandshakeTimeout time.Duration
	// MaxConns bounds the connections the port holds open that other
	// nodes dialled (default 512): one over it is closed at once. A node
	// needs a few per member (raft pools 4, plus a snapshot's), so only a
	// flood reaches it.
	MaxConns int
	// ID is this node's raft server ID (its node ID and incarnation): it
	// answers only connections bound to it (bind.go). Default: Node.
	ID string
	// Applied reports the last log index the state machine applied, told
	// to a node that asks who answers (Identify). Optional.
	Applied func() uint64
	// Refuse, when set, returns why a node may not talk raft with this
	// one ("" to accept): a removed or lost node is told why.
	Refuse func(sender string) string
	// OnRefused, when set, is called when another node refused this one
	// (by, the server ID it answered as, at addr, and why): a node kept
	// out of its cluster must stop, or two such nodes could form a quorum
	// of an old configuration. Whoever answers at an address may say
	// anything: the caller acts only on a member it knows at that address.
	OnRefused func(by, addr, why string)
	// Describe, when set, is what this node tells a node that asks who it
	// is (Identify): its API and replication URLs, which the cluster then
	// trusts over what gossip reports.
	Describe func() string
	// Logger receives refusals, at most one line of a kind every 10 s.
	Logger *slog.Logger
	// Blocked, when set, says that this node may not reach the raft
	// address it names: a dial to it fails, and a connection to it fails
	// its next write. A partition for tests: one node's Blocked cuts what
	// it sends (its requests; the answers to them too), both nodes' cut
	// the link.
	Blocked func(addr string) bool
}

// Layer is a raft.StreamLayer on TCP with TLS on both ends.
type Layer struct {
	ln         net.Listener
	advertise  net.Addr
	blocked    func(addr string) bool
	loopback   bool        // plain TCP between loopback addresses only
	server     *tls.Config // nil: insecure
	client     *tls.Config
	timeout    time.Duration
	id         string
	appliedFn  func() uint64
	refuse     func(string) string
	onRefused  func(by, addr, why string)
	describeFn func() string
	logger     *slog.Logger

	// svc hands service connections (bind.go) to ServiceListener.
	svc struct {
		serving   atomic.Bool
		closeOnce sync.Once
		ch        chan net.Conn // of *ServiceConn
		done      chan struct{}
	}

	// groups are the stream layers of raft groups other than the first
	// (groups.go), by group.
	groups struct {
		sync.Mutex
		layers map[byte]*groupLayer
		closed bool
	}

	maxConns int

	notes struct {
		sync.Mutex
		refusal  Refusal
		refusing map[string]Refusal
		logged   map[string]time.Time
	}

	// conns are the connections open through the layer. raft's transport
	// closes neither the ones it accepted nor its pooled ones when it
	// closes, and its handlers block reading them; Close closes them all.
	mu struct {
		sync.Mutex
		conns    map[*trackedConn]struct{}
		accepted int // of conns, those dialled by others
		closed   bool
	}
}

// trackedConn leaves the layer's set when closed.
type trackedConn struct {
	net.Conn
	l    *Layer
	once sync.Once
	to   string // the address dialed ("" when accepted)
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if c.to != "" && c.l.blocked != nil && c.l.blocked(c.to) {
		c.Close()
		return 0, fmt.Errorf("raftconn: %s is blocked (a test partition)", c.to)
	}
	return c.Conn.Write(p)
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		if _, ok := c.l.mu.conns[c]; ok && c.to == "" {
			c.l.mu.accepted--
		}
		delete(c.l.mu.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// track adds c to the layer's set (closing it at once if the layer closed).
func (l *Layer) track(c net.Conn) (net.Conn, error) { return l.trackTo(c, "") }

func (l *Layer) trackTo(c net.Conn, to string) (net.Conn, error) {
	t := &trackedConn{Conn: c, l: l, to: to}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	if l.mu.conns == nil {
		l.mu.conns = map[*trackedConn]struct{}{}
	}
	if to == "" {
		if l.maxConns > 0 && l.mu.accepted >= l.maxConns {
			c.Close()
			return nil, errTooMany
		}
		l.mu.accepted++
	}
	l.mu.conns[t] = struct{}{}
	return t, nil
}

// errTooMany refuses a connection over Options.MaxConns.
var errTooMany = errors.New("raftconn: too many connections")

var _ raft.StreamLayer = (*Layer)(nil)

// Listen opens the raft port on addr. advertise, when set, is the address
// other nodes dial (addr may be a wildcard).
func Listen(addr string, advertise net.Addr, o Options) (*Layer, error) {
	server, client, err := configs(o)
	if err != nil {
		return nil, err
	}
	loopback := server == nil && o.Loopback && !o.Insecure
	if loopback && !IsLoopback(addr) {
		return nil, fmt.Errorf("%w: %s is not a loopback address (without credentials the raft port serves loopback only)", ErrNoCredentials, addr)
	}
	if loopback && advertise != nil && !IsLoopback(advertise.String()) {
		return nil, fmt.Errorf("%w: advertised %s is not a loopback address", ErrNoCredentials, advertise)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("raftconn: listen %s: %w", addr, err)
	}
	if advertise == nil {
		advertise = ln.Addr()
	}
	t := o.HandshakeTimeout
	if t <= 0 {
		t = 10 * time.Second
	}
	id := o.ID
	if id == "" {
		id = o.Node
	}
	maxConns := o.MaxConns
	if maxConns == 0 {
		maxConns = 512
	}
	l := &Layer{ln: ln, advertise: advertise, blocked: o.Blocked, loopback: loopback, server: server, client: client, timeout: t,
		id: id, appliedFn: o.Applied, refuse: o.Refuse, onRefused: o.OnRefused, describeFn: o.Describe, logger: o.Logger, maxConns: maxConns}
	l.svc.ch, l.svc.done = make(chan net.Conn), make(chan struct{})
	return l, nil
}

// IsLoopback reports whether host:port names a loopback IP.
func IsLoopback(hostport string) bool {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Accept returns the next connection; its handshake runs (bounded) on its
// first read or write, in raft's handler goroutine, so a slow client cannot
// stall the accept loop.
func (l *Layer) Accept() (net.Conn, error) {
	c, err := l.ln.Accept()
	for err == nil && l.loopback && !IsLoopback(c.RemoteAddr().String()) {
		// Not an error of the listener: raft's accept loop would back off.
		c.Close()
		c, err = l.ln.Accept()
	}
	if err != nil {
		return nil, err
	}
	for {
		if l.server != nil {
			c = &lazyConn{Conn: tls.Server(c, l.server), timeout: l.timeout}
		}
		tc, err := l.track(c)
		if errors.Is(err, errTooMany) {
			// Not an error of the listener (raft's accept loop would back
			// off): the connection is closed, the next one waits.
			l.logOnce("too-many", slog.LevelWarn, fmt.Sprintf("raftconn: refused a connection: %d are open (the bound)", l.maxConns))
			if c, err = l.ln.Accept(); err != nil {
				return nil, err
			}
			for l.loopback && !IsLoopback(c.RemoteAddr().String()) {
				c.Close()
				if c, err = l.ln.Accept(); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return &boundConn{Conn: tc, l: l}, nil
	}
}

// Close stops accepting and closes every connection open through the layer.
func (l *Layer) Close() error {
	err := l.ln.Close()
	l.closeService()
	l.closeGroups()
	l.mu.Lock()
	l.mu.closed = true
	conns := l.mu.conns
	l.mu.conns = nil
	l.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
	return err
}

// Addr is the advertised address.
func (l *Layer) Addr() net.Addr { return l.advertise }

// Dial connects to another node of the cluster and completes the handshake
// within timeout. An address made by BindAddress names the server meant:
// the node there must be it (bind.go).
func (l *Layer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	target, addr, bound := splitBound(address)
	c, err := l.dialRaw(addr, timeout)
	if err != nil {
		return nil, err
	}
	if bound && bindsTo(c) {
		if _, err := l.bind(c, target, addr, timeout); err != nil {
			c.Close()
			return nil, err
		}
	}
	return l.trackTo(c, addr)
}

// dialRaw connects to addr and completes the TLS handshake.
func (l *Layer) dialRaw(addr string, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	var c net.Conn
	var err error
	if l.loopback && !IsLoopback(addr) {
		return nil, fmt.Errorf("raftconn: dial %s: not a loopback address, and the raft port has no credentials", addr)
	}
	if l.blocked != nil && l.blocked(addr) {
		return nil, fmt.Errorf("raftconn: dial %s: blocked (a test partition)", addr)
	}
	if l.client == nil {
		c, err = d.Dial("tcp", addr)
	} else {
		td := &tls.Dialer{NetDialer: d, Config: l.client}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err = td.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("raftconn: dial %s: %w", addr, err)
	}
	return c, nil
}

// lazyConn completes the server handshake before the first read or write.
type lazyConn struct {
	*tls.Conn
	timeout time.Duration
	once    sync.Once
	err     error
}

func (c *lazyConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		if c.err = c.Conn.HandshakeContext(ctx); c.err != nil {
			c.Conn.Close()
		}
	})
	return c.err
}

func (c *lazyConn) Read(p []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *lazyConn) Write(p []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// configs builds the server and client TLS configurations (both nil in the
// insecure mode).
func configs(o Options) (server, client *tls.Config, err error) {
	if o.Cluster == "" {
		return nil, nil, errors.New("raftconn: Cluster is required")
	}
	getCert := o.Certificate
	pool := o.CA
	clusterOf := o.ClusterOf
	switch {
	case getCert != nil:
		if pool == nil || clusterOf == nil {
			return nil, nil, errors.New("raftconn: a certificate needs CA and ClusterOf to check the other end")
		}
	case len(o.RaftKey) > 0:
		return derivedConfigs(o)
	case len(o.GossipKey) > 0:
		ca, caKey, err := DeriveCA(o.GossipKey)
		if err != nil {
			return nil, nil, err
		}
		leaf, err := issue(ca, caKey, o.Cluster, o.Node, serverName)
		if err != nil {
			return nil, nil, err
		}
		pool = x509.NewCertPool()
		pool.AddCert(ca)
		getCert = func() (*tls.Certificate, error) { return leaf, nil }
		clusterOf = clusterOfDerived
	case o.Insecure, o.Loopback:
		return nil, nil, nil
	default:
		return nil, nil, ErrNoCredentials
	}
	// Both ends check the chain (standard verification against pool) and
	// then that the verified certificate names this cluster.
	sameCluster := func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			return errors.New("raftconn: the other end presented no verified certificate")
		}
		got, err := clusterOf(cs.VerifiedChains[0][0])
		if err != nil {
			return fmt.Errorf("raftconn: the other end's certificate: %w", err)
		}
		if got != o.Cluster {
			return fmt.Errorf("raftconn: the other end belongs to cluster %q, not %q", got, o.Cluster)
		}
		return nil
	}
	server = &tls.Config{
		MinVersion:             tls.VersionTLS13,
		GetCertificate:         func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return getCert() },
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              pool,
		VerifyConnection:       sameCluster,
		NextProtos:             []string{alpnBound, alpnLegacy},
		SessionTicketsDisabled: true,
	}
	client = &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return getCert() },
		RootCAs:              pool,
		VerifyConnection:     sameCluster,
		NextProtos:           []string{alpnBound, alpnLegacy},
	}
	if o.Certificate == nil {
		client.ServerName = serverName
	} else {
		// Operator certificates name hosts, not a fixed name: the chain is
		// verified against the CA, the host name is not (nodes dial each
		// other by the addresses gossip reports), and the cluster check
		// above decides.
		client.InsecureSkipVerify = true
		client.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyPeer(cs, pool, x509.ExtKeyUsageServerAuth, clusterOf, o.Cluster)
		}
	}
	return server, client, nil
}

// verifyPeer checks the other end's chain against pool, without a host
// name, and that its certificate names cluster.
func verifyPeer(cs tls.ConnectionState, pool *x509.CertPool, usage x509.ExtKeyUsage,
	clusterOf func(*x509.Certificate) (string, error), cluster string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("raftconn: the other end presented no certificate")
	}
	if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: intermediates(cs.PeerCertificates),
		KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return err
	}
	got, err := clusterOf(cs.PeerCertificates[0])
	if err != nil {
		return fmt.Errorf("raftconn: the other end's certificate: %w", err)
	}
	if got != cluster {
		return fmt.Errorf("raftconn: the other end belongs to cluster %q, not %q", got, cluster)
	}
	return nil
}

func intermediates(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs[1:] {
		p.AddCert(c)
	}
	return p
}

// DeriveCA derives the cluster's raft CA from a gossip key: the same key
// gives the same CA key on every node, so no CA file has to be shipped.
func DeriveCA(key []byte) (*x509.Certificate, ed25519.PrivateKey, error) {
	if len(key) < 16 {
		return nil, nil, fmt.Errorf("raftconn: gossip key of %d bytes, want at least 16", len(key))
	}
	return deriveCA(key, "replicator raft CA v1", "replicator raft CA (derived from the gossip key)", 1)
}

// deriveCA makes a self-signed Ed25519 CA whose key is HKDF(key, info).
func deriveCA(key []byte, info, name string, serial int64) (*x509.Certificate, ed25519.PrivateKey, error) {
	seed, err := hkdf.Key(sha256.New, key, nil, info, ed25519.SeedSize)
	if err != nil {
		return nil, nil, err
	}
	priv := ed25519.NewKeyFromSeed(seed)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Unix(0, 0),
		NotAfter:              time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, priv.Public(), priv)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, priv, err
}

// serverNameRaftKey is the name a node of the raft-key scheme asks for:
// one that also holds the older scheme's certificate (AcceptGossipKey)
// shows the raft key's to it, and the older one to a node of the older
// build, which asks for serverName.
const serverNameRaftKey = "replicator-raft-2"

// DeriveClusterCA derives the CA of a cluster's raft key (Options.RaftKey).
// The cluster is part of the derivation, so a key reused by mistake for
// two clusters still makes two CAs.
func DeriveClusterCA(key []byte, cluster string) (*x509.Certificate, ed25519.PrivateKey, error) {
	if len(key) < 16 {
		return nil, nil, fmt.Errorf("raftconn: raft key of %d bytes, want at least 16", len(key))
	}
	return deriveCA(key, "replicator raft CA v2 "+cluster, "replicator raft CA of cluster "+cluster+" (its raft key)", 2)
}

// derivedConfigs builds the TLS configurations of the raft-key scheme:
// the node's certificate is signed by its cluster's raft-key CA, and the
// other end's must be. With AcceptGossipKey, the node also holds a
// certificate of the gossip key's CA and trusts that CA: it shows that
// certificate to a node that asks for the older scheme's name (as a server)
// or lists only the older CA (as a client), so that the two schemes talk
// while a cluster moves to the raft key; the older CA is dropped with
// AcceptGossipKey once every node has the raft key.
func derivedConfigs(o Options) (server, client *tls.Config, err error) {
	ca, caKey, err := DeriveClusterCA(o.RaftKey, o.Cluster)
	if err != nil {
		return nil, nil, err
	}
	leaf, err := issue(ca, caKey, o.Cluster, o.Node, serverNameRaftKey)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	var legacy *tls.Certificate
	if o.AcceptGossipKey {
		if len(o.GossipKey) == 0 {
			return nil, nil, errors.New("raftconn: accepting the gossip key's credential needs the gossip key")
		}
		lca, lkey, err := DeriveCA(o.GossipKey)
		if err != nil {
			return nil, nil, err
		}
		if legacy, err = issue(lca, lkey, o.Cluster, o.Node, serverName); err != nil {
			return nil, nil, err
		}
		pool.AddCert(lca)
	}
	caSubject := ca.RawSubject
	// The chain, against this cluster's CA (and the older one while
	// accepted); no host name: every certificate of a derived CA names the
	// cluster, which decides.
	verify := func(cs tls.ConnectionState, usage x509.ExtKeyUsage) error {
		return verifyPeer(cs, pool, usage, clusterOfDerived, o.Cluster)
	}
	server = &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if legacy != nil && h.ServerName != serverNameRaftKey {
				return legacy, nil // a node of the older scheme asks
			}
			return leaf, nil
		},
		// The chain is verified in VerifyConnection (against both CAs
		// while the older one is accepted); ClientCAs only tells the
		// client which CAs this node takes.
		ClientAuth:             tls.RequireAnyClientCert,
		ClientCAs:              pool,
		VerifyConnection:       func(cs tls.ConnectionState) error { return verify(cs, x509.ExtKeyUsageClientAuth) },
		NextProtos:             []string{alpnBound, alpnLegacy},
		SessionTicketsDisabled: true,
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if legacy == nil {
				return leaf, nil
			}
			for _, s := range cri.AcceptableCAs {
				if bytes.Equal(s, caSubject) {
					return leaf, nil
				}
			}
			return legacy, nil // a node of the older scheme takes only its CA
		},
		ServerName:         serverNameRaftKey,
		InsecureSkipVerify: true, // verified in VerifyConnection, without a host name
		VerifyConnection:   func(cs tls.ConnectionState) error { return verify(cs, x509.ExtKeyUsageServerAuth) },
		NextProtos:         []string{alpnBound, alpnLegacy},
	}
	return server, client, nil
}

// issue makes this node's certificate, signed by the derived CA, naming its
// cluster and node in a URI: replicator-raft://CLUSTER/NODE, and the name
// the dialling side asks for.
func issue(ca *x509.Certificate, caKey ed25519.PrivateKey, cluster, node, name string) (*tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	u := &url.URL{Scheme: "replicator-raft", Host: cluster, Path: "/" + node}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cluster + "/" + node},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(10 * 365 * 24 * time.Hour),
		DNSNames:     []string{name},
		URIs:         []*url.URL{u},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv, Leaf: leaf}, nil
}

// clusterOfDerived reads the cluster from a derived certificate's URI.
func clusterOfDerived(c *x509.Certificate) (string, error) {
	for _, u := range c.URIs {
		if u.Scheme == "replicator-raft" && u.Host != "" && strings.HasPrefix(u.Path, "/") {
			return u.Host, nil
		}
	}
	return "", errors.New("no replicator-raft:// URI naming a cluster")
}

// BlockList is a test's partition (Options.Blocked): the addresses listed
// in the file at path, one per field, read again at most every 20 ms.
func BlockList(path string) func(string) bool {
	var mu sync.Mutex
	var read time.Time
	var set map[string]bool
	return func(addr string) bool {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(read) > 20*time.Millisecond {
			read, set = time.Now(), map[string]bool{}
			if b, err := os.ReadFile(path); err == nil {
				for _, l := range strings.Fields(string(b)) {
					set[l] = true
				}
			}
		}
		return set[addr]
	}
}

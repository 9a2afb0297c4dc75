package raftconn

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftfsm"
)

var (
	keyA = bytes.Repeat([]byte{0xa}, 32)
	keyB = bytes.Repeat([]byte{0xb}, 32)
)

func listen(t *testing.T, o Options) *Layer {
	t.Helper()
	l, err := Listen("127.0.0.1:0", nil, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// echo accepts one connection and answers what it reads; the error of the
// accepted side (its handshake) is reported on the channel.
func echo(l *Layer) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil {
			done <- err
			return
		}
		_, err = c.Write(buf)
		done <- err
	}()
	return done
}

func roundTrip(from *Layer, to *Layer) error {
	c, err := from.Dial(raft.ServerAddress(to.Addr().String()), 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hello")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "hello" {
		return fmt.Errorf("echo %q", buf)
	}
	return nil
}

func TestGossipKeyConnects(t *testing.T) {
	a := listen(t, Options{Cluster: "a", Node: "a1", GossipKey: keyA})
	b := listen(t, Options{Cluster: "a", Node: "a2", GossipKey: keyA})
	done := echo(b)
	if err := roundTrip(a, b); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestOtherCredentialsRefused: another gossip key, another cluster with the
// same key, or plain TCP: no handshake completes, and the accepting side
// reads nothing.
func TestOtherCredentialsRefused(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to Options
	}{
		{"other key dials", Options{Cluster: "a", Node: "x", GossipKey: keyB}, Options{Cluster: "a", Node: "a1", GossipKey: keyA}},
		{"dials other key", Options{Cluster: "a", Node: "a1", GossipKey: keyA}, Options{Cluster: "a", Node: "x", GossipKey: keyB}},
		{"other cluster dials", Options{Cluster: "b", Node: "b1", GossipKey: keyA}, Options{Cluster: "a", Node: "a1", GossipKey: keyA}},
		{"dials other cluster", Options{Cluster: "a", Node: "a1", GossipKey: keyA}, Options{Cluster: "b", Node: "b1", GossipKey: keyA}},
		{"plain TCP dials", Options{Cluster: "a", Insecure: true}, Options{Cluster: "a", Node: "a1", GossipKey: keyA}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from, to := listen(t, tc.from), listen(t, tc.to)
			done := echo(to)
			if err := roundTrip(from, to); err == nil {
				t.Fatal("a round trip completed")
			}
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the accepting side read and answered")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the accepting side is still waiting")
			}
		})
	}
}

func TestNoCredentialsRefused(t *testing.T) {
	if _, err := Listen("127.0.0.1:0", nil, Options{Cluster: "a"}); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("no certificates, no key: %v", err)
	}
}

// TestSilentClientTimesOut: a connection that never sends its hello is cut
// after the handshake timeout instead of holding raft's handler.
func TestSilentClientTimesOut(t *testing.T) {
	l := listen(t, Options{Cluster: "a", Node: "a1", GossipKey: keyA, HandshakeTimeout: 200 * time.Millisecond})
	done := echo(l)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a silent client was served")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a silent client still holds the handler after 5 s")
	}
}

// pki is a CA and node certificates naming their cluster in a URI, as an
// operator's would.
type pki struct {
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newPKI(t *testing.T) *pki {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &pki{ca: ca, key: key, pool: pool}
}

func (p *pki) node(t *testing.T, cluster string) *tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cluster},
		DNSNames: []string{cluster + ".example"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func clusterFromCN(c *x509.Certificate) (string, error) { return c.Subject.CommonName, nil }

func TestMutualTLS(t *testing.T) {
	p, other := newPKI(t), newPKI(t)
	opts := func(p *pki, cluster string) Options {
		cert := p.node(t, cluster)
		return Options{Cluster: cluster, Certificate: func() (*tls.Certificate, error) { return cert, nil }, CA: p.pool, ClusterOf: clusterFromCN}
	}
	a1, a2 := listen(t, opts(p, "a")), listen(t, opts(p, "a"))
	done := echo(a2)
	if err := roundTrip(a1, a2); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for name, from := range map[string]*Layer{"another CA": listen(t, opts(other, "a")), "another cluster": listen(t, opts(p, "b"))} {
		done := echo(a2)
		if err := roundTrip(from, a2); err == nil {
			t.Fatalf("%s: a round trip completed", name)
		}
		if err := <-done; err == nil {
			t.Fatalf("%s: the accepting side answered", name)
		}
	}
}

type member struct {
	id    raft.ServerID
	layer *Layer
	trans *raft.NetworkTransport
	raft  *raft.Raft
	fsm   *raftfsm.Recorder
}

// startRaft starts a raft node over the layer; timeout is its heartbeat and
// election timeout.
func startRaft(t *testing.T, id string, o Options, timeout time.Duration) *member {
	t.Helper()
	l, err := Listen("127.0.0.1:0", nil, o)
	if err != nil {
		t.Fatal(err)
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: l, MaxPool: 2, Timeout: time.Second,
		Logger: hclog.NewNullLogger()})
	cfg := raft.DefaultConfig()
	cfg.LocalID = raft.ServerID(id)
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = timeout, timeout, timeout/2
	cfg.Logger = hclog.NewNullLogger()
	store := raft.NewInmemStore()
	f := &raftfsm.Recorder{}
	r, err := raft.NewRaft(cfg, f, store, store, raft.NewInmemSnapshotStore(), trans)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{id: cfg.LocalID, layer: l, trans: trans, raft: r, fsm: f}
	t.Cleanup(func() {
		r.Shutdown().Error()
		trans.Close()
	})
	return m
}

func (m *member) server() raft.Server {
	return raft.Server{ID: m.id, Address: raft.ServerAddress(m.layer.Addr().String())}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
	}
}

// TestWrongCredentialsCannotJoinOrAppend: a real raft pair over the layer;
// a node holding another gossip key that claims membership can neither get
// its vote requests heard nor append to a member, while the pair keeps its
// leader, its term and exactly its own commands.
func TestWrongCredentialsCannotJoinOrAppend(t *testing.T) {
	good := func(n string) Options { return Options{Cluster: "a", Node: n, GossipKey: keyA} }
	// The pair's timeouts are long enough that a loaded machine does not
	// make it change leaders by itself (the test checks its term).
	a1, a2 := startRaft(t, "a1", good("a1"), time.Second), startRaft(t, "a2", good("a2"), time.Second)
	cfg := raft.Configuration{Servers: []raft.Server{a1.server(), a2.server()}}
	if err := a1.raft.BootstrapCluster(cfg).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a leader", func() bool { _, id := a1.raft.LeaderWithID(); return id != "" })
	leader := a1
	if _, id := a1.raft.LeaderWithID(); id == a2.id {
		leader = a2
	}
	for i := 0; i < 3; i++ {
		if err := leader.raft.Apply([]byte(fmt.Sprint("good-", i)), time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both applied", func() bool { return len(a1.fsm.Applied()) == 3 && len(a2.fsm.Applied()) == 3 })
	term := leader.raft.Stats()["term"]

	// The intruder believes it belongs: it is bootstrapped with the pair in
	// its configuration, campaigns, and as leader of its own group of one
	// tries to add a member and append to it.
	x := startRaft(t, "x", Options{Cluster: "a", Node: "x", GossipKey: keyB}, 200*time.Millisecond)
	if err := x.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{x.server()}}).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the intruder leads its own group", func() bool { return x.raft.State() == raft.Leader })
	if err := x.raft.Apply([]byte("evil"), time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	// Adding a1 as a voter makes the intruder replicate (and campaign) to it.
	x.raft.AddVoter(a1.id, a1.server().Address, 0, time.Second)
	x.raft.AddVoter(a2.id, a2.server().Address, 0, time.Second)
	time.Sleep(1500 * time.Millisecond) // several heartbeat and election timeouts of the intruder
	for _, m := range []*member{a1, a2} {
		if got := m.fsm.Applied(); strings.Join(got, ",") != "good-0,good-1,good-2" {
			t.Fatalf("%s applied %v", m.id, got)
		}
		if got := m.raft.Stats()["term"]; got != term {
			t.Fatalf("%s: term moved from %s to %s", m.id, term, got)
		}
	}
	if _, id := a1.raft.LeaderWithID(); id != leader.id {
		t.Fatalf("the pair's leader changed to %q", id)
	}
	// And the pair still commits.
	if err := leader.raft.Apply([]byte("good-3"), time.Second).Error(); err != nil {
		t.Fatal(err)
	}
}

// Without credentials the port is loopback only: it will not listen on
// another address, dial one, or be advertised as one; and a test partition
// cuts a link both at the dial and on a connection already open.
func TestLoopbackOnlyAndBlocked(t *testing.T) {
	if _, err := Listen("0.0.0.0:0", nil, Options{Cluster: "a", Loopback: true}); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("a wildcard raft port without credentials: %v", err)
	}
	if _, err := Listen("127.0.0.1:0", advertised("192.0.2.1:7500"), Options{Cluster: "a", Loopback: true}); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("advertised off loopback without credentials: %v", err)
	}
	var blocked atomic.Bool
	a := listen(t, Options{Cluster: "a", Loopback: true, Blocked: func(string) bool { return blocked.Load() }})
	b := listen(t, Options{Cluster: "a", Loopback: true})
	if _, err := a.Dial("192.0.2.1:7500", time.Second); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("a dial off loopback: %v", err)
	}
	done := echo(b)
	if err := roundTrip(a, b); err != nil {
		t.Fatalf("loopback round trip: %v", err)
	}
	<-done
	// an open connection fails its next write once blocked
	echo(b)
	c, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	blocked.Store(true)
	if _, err := c.Write([]byte("hello")); err == nil {
		t.Fatal("a write on a blocked link went through")
	}
	if _, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second); err == nil {
		t.Fatal("a dial on a blocked link went through")
	}
}

type advertised string

func (a advertised) Network() string { return "tcp" }
func (a advertised) String() string  { return string(a) }

// Issue 25, finding 4: the raft CA derived from the gossip key alone, and a
// mesh may share one gossip key among its clusters: anyone holding it could
// mint a certificate naming any cluster. A cluster's raft key is its own.
// While a cluster moves to it (a rolling upgrade), a node with the raft key
// and AcceptGossipKey talks both ways with nodes of the older scheme and
// with nodes of the raft key alone; once every node has the raft key, a
// holder of the gossip key (another cluster of the mesh) reaches none.
func TestRaftKeySchemes(t *testing.T) {
	raftKey := bytes.Repeat([]byte{0x5}, 32)
	old := func(node string) Options { return Options{Cluster: "a", Node: node, GossipKey: keyA} }
	mixed := func(node string) Options {
		return Options{Cluster: "a", Node: node, RaftKey: raftKey, GossipKey: keyA, AcceptGossipKey: true}
	}
	strict := func(node string) Options { return Options{Cluster: "a", Node: node, RaftKey: raftKey} }
	for _, c := range []struct {
		name  string
		from  Options
		to    Options
		talks bool
	}{
		{"older scheme to mixed", old("a1"), mixed("a2"), true},
		{"mixed to older scheme", mixed("a2"), old("a1"), true},
		{"mixed to raft key", mixed("a2"), strict("a3"), true},
		{"raft key to mixed", strict("a3"), mixed("a2"), true},
		{"raft key to raft key", strict("a3"), strict("a4"), true},
		{"older scheme to raft key", old("a1"), strict("a3"), false},
		{"raft key to older scheme", strict("a3"), old("a1"), false},
		// Another cluster of the mesh holds the gossip key and names
		// cluster a in the certificate it mints: the raft key keeps it out.
		{"gossip key holder to raft key", Options{Cluster: "a", Node: "evil", GossipKey: keyA}, strict("a3"), false},
		// The raft key of another cluster, even the same bytes, makes
		// another CA.
		{"raft key of cluster b", Options{Cluster: "b", Node: "b1", RaftKey: raftKey}, strict("a3"), false},
		{"wrong raft key", Options{Cluster: "a", Node: "x", RaftKey: bytes.Repeat([]byte{0x6}, 32)}, strict("a3"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := listen(t, c.from), listen(t, c.to)
			done := echo(b)
			err := roundTrip(a, b)
			if c.talks {
				if err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("the two schemes talked")
			}
		})
	}
}

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/testpki"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/wire"
)

// pki is a throwaway CA whose certificates name a cluster as the node
// expects: URI SAN replicator://cluster/<id>.
type pki struct{ *testpki.PKI }

func newPKI(t *testing.T, name string) *pki { return &pki{testpki.New(t, name)} }

// issue signs a certificate for a cluster (and 127.0.0.1, so it also
// serves on loopback): its cert and key files and the loaded pair.
func (p *pki) issue(t *testing.T, cluster string) (string, string, tls.Certificate) {
	return p.Issue(t, cluster, node.ClusterURI(cluster))
}

// tlsMesh runs a and b linked over mutual TLS on separate peer listeners,
// without shared secrets; c is a configured peer of a that is never started.
func tlsMesh(t *testing.T, ca *pki) (*mesh, map[string]string) {
	m := &mesh{t: t, nodes: map[string]*proc{}, names: []string{"a", "b"}}
	peerURL := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		peerURL[n] = fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	}
	for _, n := range m.names {
		cert, key, _ := ca.issue(t, n)
		p := newProc(t, n, n, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca.CAFile,
			"--peer-listen", strings.TrimPrefix(peerURL[n], "https://"))
		p.url = strings.Replace(p.url, "http://", "https://", 1)
		for _, o := range []string{"a", "b", "c"} {
			if o != n {
				p.args = append(p.args, "--peer", o+"="+peerURL[o])
			}
		}
		m.nodes[n] = p
	}
	return m, peerURL
}

func tlsClient(t *testing.T, p *proc, pool *x509.CertPool) *client.Client {
	return client.New(p.url, &client.Options{HTTPClient: &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}})
}

// TestMutualTLSLinks: clusters replicate over mutual TLS on their peer
// listeners; the client API is TLS without client certificates; a peer
// presenting a valid certificate for b but claiming c (header, body or
// entry) is refused, as are a connection without a client certificate and
// one with a certificate of another CA; nothing is applied.
func TestMutualTLSLinks(t *testing.T) {
	ca := newPKI(t, "replicator test CA")
	m, peerURL := tlsMesh(t, ca)
	for _, n := range m.names {
		m.nodes[n].start()
	}
	pool := ca.Pool()
	a, b := m.nodes["a"], m.nodes["b"]
	for _, p := range []*proc{a, b} {
		eventually(t, 20*time.Second, func() (bool, string) {
			err := tlsClient(t, p, pool).Healthy(bg())
			return err == nil, fmt.Sprint(err)
		})
	}
	ca2, cb := tlsClient(t, a, pool), tlsClient(t, b, pool)
	if _, err := ca2.Put(bg(), "over-tls", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Put(bg(), "over-tls-b", []byte("b")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		v1, e1 := cb.Get(bg(), "over-tls")
		v2, e2 := ca2.Get(bg(), "over-tls-b")
		return e1 == nil && e2 == nil && string(v1.Value) == "a" && string(v2.Value) == "b", fmt.Sprint(e1, e2)
	})

	var before api.DigestReport
	ca2.Do(bg(), http.MethodGet, "/admin/digest", nil, nil, &before)

	_, _, bCert := ca.issue(t, "b")
	withCert := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}}
	}
	batch := func(sender, origin string) []byte {
		e := entry.Entry{Index: 1, Origin: origin, Stream: entry.StreamID{7}, Commit: hlc.Timestamp{Wall: time.Now().UnixNano()},
			Op: entry.OpSet, Key: "spoofed", Value: []byte("evil")}
		e.Stamp = e.Commit
		return wire.EncodeBatch(&wire.Batch{Header: wire.Header{Sender: sender, Stream: entry.StreamID{7}}, Entries: []entry.Entry{e}})
	}
	post := func(c *http.Client, header string, body []byte) (int, error) {
		req, _ := http.NewRequest("POST", peerURL["a"]+"/v1/replicate", bytes.NewReader(body))
		req.Header.Set("Content-Type", wire.ContentType)
		req.Header.Set(wire.HeaderOrigin, header)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for _, tc := range []struct {
		name           string
		header, sender string
		origin         string
	}{
		{"b's certificate claiming c in the header", "c", "c", "c"},
		{"b's certificate, header b, body claims c", "b", "c", "c"},
		{"b's certificate, entries of origin c", "b", "b", "c"},
	} {
		status, err := post(withCert(bCert), tc.header, batch(tc.sender, tc.origin))
		if err != nil || status != http.StatusForbidden {
			t.Fatalf("%s: %d %v, want 403", tc.name, status, err)
		}
	}
	// The very same certificate, honest, is accepted (the test is not
	// refusing everything).
	if status, err := post(withCert(bCert), "b", batch("b", "b")); err != nil || status != 200 {
		t.Fatalf("honest batch with b's certificate: %d %v", status, err)
	}
	// Without a client certificate, or with one of another CA, the TLS
	// handshake itself is refused.
	if _, err := post(withCert(), "b", batch("b", "b")); err == nil {
		t.Fatal("the peer listener accepted a connection without a client certificate")
	}
	other := newPKI(t, "another CA")
	_, _, foreign := other.issue(t, "b")
	if _, err := post(withCert(foreign), "b", batch("b", "b")); err == nil {
		t.Fatal("the peer listener accepted a certificate of another CA")
	}
	v, err := ca2.Get(bg(), "spoofed")
	if err != nil || string(v.Value) != "evil" || v.Origin != "b" {
		// only the honest batch may have landed, under b's origin
		t.Fatalf("after the refused batches: %+v %v", v, err)
	}
	var after api.DigestReport
	ca2.Do(bg(), http.MethodGet, "/admin/digest", nil, nil, &after)
	if after.Keys != before.Keys+1 {
		t.Fatalf("keys %d -> %d: a refused batch applied something", before.Keys, after.Keys)
	}
	// The API listener does not serve the peer endpoint.
	resp, err := withCert(bCert).Post(a.url+"/v1/replicate", wire.ContentType, bytes.NewReader(batch("b", "b")))
	if err != nil || resp.StatusCode != 404 {
		t.Fatalf("peer endpoint on the API listener: %v %v", resp, err)
	}
	resp.Body.Close()
	// The refusals are counted by reason in /metrics (403 forbidden: the
	// spoofed claims above), and the certificate's expiry is there.
	metrics := scrapeTLS(t, a.url, ca.Pool())
	if v := metricValue(metrics, `replicator_replicate_refusals_total{cluster="a",reason="forbidden"}`); v < 1 {
		t.Fatalf("forbidden refusals in /metrics: %v\n%s", v, metrics)
	}
	leaf, _ := x509.ParseCertificate(bCert.Certificate[0])
	if v := metricValue(metrics, `replicator_tls_certificate_expiry_timestamp_seconds{cluster="a"}`); v < float64(time.Now().Unix()) || v > float64(leaf.NotAfter.Unix()+3600) {
		t.Fatalf("certificate expiry in /metrics: %v", v)
	}
}

// scrapeTLS reads a node's /metrics over TLS.
func scrapeTLS(t *testing.T, url string, pool *x509.CertPool) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := c.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue is a series' value in a scrape (-1 when absent).
func metricValue(scrape, series string) float64 {
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestCertificateOfAnotherCluster: a node given a certificate that names
// another cluster refuses it at start, saying which, instead of meeting
// its peers' 403s; a reload to one keeps the certificate in use.
func TestCertificateOfAnotherCluster(t *testing.T) {
	ca := newPKI(t, "replicator test CA")
	certB, keyB, _ := ca.issue(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "serve", "--cluster-id", "a", "--data", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--tls-cert", certB, "--tls-key", keyB, "--tls-client-ca", ca.CAFile, "--insecure-peers")
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), `names cluster "b"`) || !strings.Contains(string(out), `cluster "a"`) {
		t.Fatalf("a start with b's certificate: %v (deadline %v)\n%s", err, ctx.Err(), out)
	}
	// With mutual TLS, one that names no cluster is refused too: peers
	// and the raft port read the cluster from it.
	bare, bareKey := ca.IssueUnnamed(t)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	out, err = exec.CommandContext(ctx2, binPath, "serve", "--cluster-id", "a", "--data", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--tls-cert", bare, "--tls-key", bareKey, "--tls-client-ca", ca.CAFile, "--insecure-peers").CombinedOutput()
	if err == nil || ctx2.Err() != nil || !strings.Contains(string(out), `must name this cluster "a"`) {
		t.Fatalf("a start with a certificate naming no cluster, under mutual TLS: %v\n%s", err, out)
	}
	// Started with its own, then b's put in its place and reloaded: refused,
	// logged, and its own still served.
	certA, keyA, pairA := ca.issue(t, "a")
	p := newProc(t, "a", "a", "--tls-cert", certA, "--tls-key", keyA, "--tls-client-ca", ca.CAFile, "--insecure-peers")
	p.url = strings.Replace(p.url, "http://", "https://", 1)
	p.start()
	pool := ca.Pool()
	eventually(t, 20*time.Second, func() (bool, string) {
		err := tlsClient(t, p, pool).Healthy(bg())
		return err == nil, fmt.Sprint(err)
	})
	b, _ := os.ReadFile(certB)
	k, _ := os.ReadFile(keyB)
	os.WriteFile(certA, b, 0o644)
	os.WriteFile(keyA, k, 0o600)
	p.signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, func() (bool, string) {
		logb, _ := os.ReadFile(p.log)
		return strings.Contains(string(logb), "TLS certificate reload failed") && strings.Contains(string(logb), `names cluster \"b\"`), "no refusal logged"
	})
	leaf, _ := x509.ParseCertificate(pairA.Certificate[0])
	if s, err := servedSerial(t, strings.TrimPrefix(p.url, "https://"), pool); err != nil || s != leaf.SerialNumber.String() {
		t.Fatalf("after a reload to b's certificate, a serves %s (%v), want its own %s", s, err, leaf.SerialNumber)
	}
}

// TestAPIToken: with --api-token-file, clients and admin endpoints need the
// token; health and readiness stay open.
func TestAPIToken(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("  s3cr3t-token\n"), 0o600)
	p := newProc(t, "a", "a", "--api-token-file", tok)
	p.startReady()
	anon := client.New(p.url, nil)
	authed := client.New(p.url, &client.Options{Token: "s3cr3t-token"})
	if _, err := anon.Put(bg(), "k", []byte("v")); !isStatus(err, 401) {
		t.Fatalf("put without token: %v", err)
	}
	if _, err := anon.Do(bg(), http.MethodGet, "/admin/wal", nil, nil, nil); !isStatus(err, 401) {
		t.Fatalf("admin without token: %v", err)
	}
	if _, err := client.New(p.url, &client.Options{Token: "wrong"}).Get(bg(), "k"); !isStatus(err, 401) {
		t.Fatalf("wrong token: %v", err)
	}
	if _, err := authed.Put(bg(), "k", []byte("v")); err != nil {
		t.Fatalf("put with token: %v", err)
	}
	if err := anon.Healthy(bg()); err != nil {
		t.Fatalf("healthz needs no token: %v", err)
	}
	if err := anon.Ready(bg()); err != nil {
		t.Fatalf("readyz needs no token: %v", err)
	}
	// The three 401s above are counted.
	var metrics string
	req, _ := http.NewRequest(http.MethodGet, p.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer s3cr3t-token")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		metrics = string(b)
	}
	if v := metricValue(metrics, `replicator_api_refusals_total{cluster="a",code="unauthenticated"}`); v != 3 {
		t.Fatalf("unauthenticated refusals in /metrics: %v, want 3", v)
	}
	// the token never shows in the admin documents or the log
	var w map[string]any
	authed.Do(bg(), http.MethodGet, "/admin/wal", nil, nil, &w)
	logb, _ := os.ReadFile(p.log)
	if strings.Contains(fmt.Sprint(w), "s3cr3t") || strings.Contains(string(logb), "s3cr3t") {
		t.Fatal("the token leaked into admin output or logs")
	}
}

func isStatus(err error, status int) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == status
}

// servedSerial is the serial number of the certificate a TLS listener
// presents to a new connection.
func servedSerial(t *testing.T, hostport string, pool *x509.CertPool, certs ...tls.Certificate) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", hostport,
		&tls.Config{RootCAs: pool, Certificates: certs})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// TestTLSCertificateRotation: a rotated certificate (cert-manager rewriting
// the files) is served by new connections on both listeners without a
// restart, on SIGHUP (a) or by the file watcher (b); a pair that does not
// load leaves the current certificate serving; replication goes on.
func TestTLSCertificateRotation(t *testing.T) {
	ca := newPKI(t, "replicator test CA")
	m, peerURL := tlsMesh(t, ca)
	m.nodes["b"].args = append(m.nodes["b"].args, "--tls-reload-interval", "200ms")
	m.nodes["a"].args = append(m.nodes["a"].args, "--tls-reload-interval", "1h")
	for _, n := range m.names {
		m.nodes[n].start()
	}
	pool := ca.Pool()
	a, b := m.nodes["a"], m.nodes["b"]
	hostport := func(u string) string { return strings.TrimPrefix(strings.TrimPrefix(u, "https://"), "http://") }
	for _, p := range []*proc{a, b} {
		eventually(t, 20*time.Second, func() (bool, string) {
			err := tlsClient(t, p, pool).Healthy(bg())
			return err == nil, fmt.Sprint(err)
		})
	}
	serial := func(p *proc) string {
		s, err := servedSerial(t, hostport(p.url), pool)
		if err != nil {
			t.Fatalf("dial %s: %v", p.name, err)
		}
		return s
	}
	oldA, oldB := serial(a), serial(b)

	// A broken pair on SIGHUP: logged, the old certificate keeps serving.
	certA := filepath.Join(ca.Dir, "a.pem")
	good, _ := os.ReadFile(certA)
	os.WriteFile(certA, []byte("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n"), 0o644)
	a.signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, func() (bool, string) {
		logb, _ := os.ReadFile(a.log)
		return strings.Contains(string(logb), "TLS certificate reload failed"), "no reload failure logged"
	})
	if s := serial(a); s != oldA {
		t.Fatalf("a serves %s after a broken reload, want the old %s", s, oldA)
	}
	os.WriteFile(certA, good, 0o644)

	// Rotate both: a by SIGHUP (its watcher is an hour away), b by its watcher.
	_, _, newA := ca.issue(t, "a")
	_, _, newB := ca.issue(t, "b")
	a.signal(syscall.SIGHUP)
	want := func(c tls.Certificate) string {
		x, _ := x509.ParseCertificate(c.Certificate[0])
		return x.SerialNumber.String()
	}
	for _, tc := range []struct {
		p        *proc
		old, new string
	}{{a, oldA, want(newA)}, {b, oldB, want(newB)}} {
		eventually(t, 10*time.Second, func() (bool, string) {
			s := serial(tc.p)
			return s == tc.new, fmt.Sprintf("%s serves %s, want %s (old %s)", tc.p.name, s, tc.new, tc.old)
		})
		// the peer listener too, to a peer presenting its own new certificate
		other := newB
		if tc.p == b {
			other = newA
		}
		s, err := servedSerial(t, hostport(peerURL[tc.p.name]), pool, other)
		if err != nil || s != tc.new {
			t.Fatalf("%s peer listener serves %s %v, want %s", tc.p.name, s, err, tc.new)
		}
	}
	// Replication goes on across the rotation, both ways.
	ca2, cb := tlsClient(t, a, pool), tlsClient(t, b, pool)
	if _, err := ca2.Put(bg(), "after-rotation-a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Put(bg(), "after-rotation-b", []byte("b")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		v1, e1 := cb.Get(bg(), "after-rotation-a")
		v2, e2 := ca2.Get(bg(), "after-rotation-b")
		return e1 == nil && e2 == nil && string(v1.Value) == "a" && string(v2.Value) == "b", fmt.Sprint(e1, e2)
	})
}

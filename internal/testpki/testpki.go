// Package testpki makes throwaway certificate authorities, and the
// certificates they sign, as PEM files for tests: a node's TLS flags take
// files, and a client takes the CA's pool.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA whose files live in Dir, a test's temporary directory.
type PKI struct {
	Dir    string
	CA     *x509.Certificate
	Key    *ecdsa.PrivateKey
	CAFile string // the CA's certificate, PEM
}

// New makes a CA named name.
func New(t testing.TB, name string) *PKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &PKI{Dir: t.TempDir(), CA: ca, Key: key}
	p.CAFile = filepath.Join(p.Dir, "ca.pem")
	if err := os.WriteFile(p.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue signs a server and client certificate for 127.0.0.1 and localhost,
// with uris as URI SANs (a cluster's identity), and writes it and its key
// as Dir/name.pem and Dir/name-key.pem.
func (p *PKI) Issue(t testing.TB, name string, uris ...*url.URL) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	return p.issue(t, name, []string{"localhost"}, uris)
}

// IssueUnnamed is Issue of a certificate for 127.0.0.1 only: no DNS name,
// no URI, so it names no cluster whatever the SAN mode.
func (p *PKI) IssueUnnamed(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, _ = p.issue(t, "unnamed", nil, nil)
	return certFile, keyFile
}

func (p *PKI) issue(t testing.TB, name string, dns []string, uris []*url.URL) (certFile, keyFile string, pair tls.Certificate) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: dns, URIs: uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA, &key.PublicKey, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	certFile, keyFile = filepath.Join(p.Dir, name+".pem"), filepath.Join(p.Dir, name+"-key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if pair, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pair
}

// Pool is a pool holding only the CA.
func (p *PKI) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.CA)
	return pool
}

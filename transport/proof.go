package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/replicator/replicator/wire"
)

// provenURL is a peer URL whose node proved the secret.
type provenURL struct {
	at     time.Time
	legacy bool // a build before proofs, let through by Peer.AllowUnproven
}

// proofTTL is how long a node's proof of the secret stands for its URL:
// every answer is authenticated besides (HeaderMAC), and the proof is what
// lets the secret go there at all.
const proofTTL = time.Minute

// prove makes the node at base prove it holds the secret before anything
// is sent there (proof.go). It reports whether the node runs a build
// before proofs (let through by Peer.AllowUnproven).
func (s *Shipper) prove(ctx context.Context, base, sec, keyID string) (legacy bool, err error) {
	// A proof holds for the secret it was made with: a rotated one is
	// proved again.
	proven := base + "\x00" + keyID
	s.mu.Lock()
	if p, ok := s.mu.proven[proven]; ok && time.Since(p.at) < proofTTL {
		s.mu.Unlock()
		return p.legacy, nil
	}
	s.mu.Unlock()
	nonce := wire.NewNonce()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+wire.PathProve, http.NoBody)
	if err != nil {
		return false, err
	}
	req.Header.Set(wire.HeaderOrigin, s.opts.Local)
	req.Header.Set(wire.HeaderNonce, nonce)
	req.Header.Set(wire.HeaderKeyID, keyID)
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return false, unreached(s.peer.Name, base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return false, fmt.Errorf("transport: read the proof of %s at %s: %w", s.peer.Name, base, err)
	}
	var p wire.Proof
	switch {
	case resp.StatusCode == http.StatusNotFound && s.peer.AllowUnproven:
		s.opts.Logger.Warn("a node of the peer runs a build that cannot prove it holds the secret: sending it the secret unproven (--peer-allow-unproven); remove that once the peer is upgraded",
			"peer", s.peer.Name, "url", base)
		legacy = true
	case resp.StatusCode != http.StatusOK:
		return false, fmt.Errorf("%w: %s at %s answered %d to the proof request (nothing sent there): %s",
			ErrUnproven, s.peer.Name, base, resp.StatusCode, strings.TrimSpace(string(b)))
	case json.Unmarshal(b, &p) != nil:
		return false, fmt.Errorf("%w: %s at %s answered the proof request with %q (nothing sent there)", ErrUnproven, s.peer.Name, base, b)
	case p.Cluster != s.peer.Name:
		return false, fmt.Errorf("%w: the node at %s is of cluster %q, not %s (nothing sent there)", ErrUnproven, base, p.Cluster, s.peer.Name)
	case !wire.VerifyMAC(p.Proof, wire.ProofMAC(sec, s.opts.Local, s.peer.Name, nonce)):
		return false, fmt.Errorf("%w: the node at %s does not hold the secret shared with %s (nothing sent there)", ErrUnproven, base, s.peer.Name)
	}
	s.mu.Lock()
	if s.mu.proven == nil || len(s.mu.proven) > 64 {
		s.mu.proven = map[string]provenURL{}
	}
	s.mu.proven[proven] = provenURL{at: time.Now(), legacy: legacy}
	s.mu.Unlock()
	return legacy, nil
}

// unproven forgets base's proof and points the link at the next node: its
// answer did not verify.
func (s *Shipper) unproven(base string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.mu.proven {
		if strings.HasPrefix(k, base+"\x00") {
			delete(s.mu.proven, k) // under every secret
		}
	}
	if s.mu.url == base {
		s.rotateLocked()
	}
}

// ErrUnproven: the peer node did not prove it holds the shared secret, or
// its answer did not carry a valid HeaderMAC.
var ErrUnproven = errors.New("transport: the peer node did not prove it holds the shared secret")

// unreached says in words why a request to peer at base got no answer: a
// link's last error is read by an operator, who must tell a peer that is
// down from a certificate that does not verify or a secret that differs
// (ErrUnproven, which only an answer can show).
func unreached(peer, base string, err error) error {
	var dns *net.DNSError
	var cert *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var record tls.RecordHeaderError
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("transport: %s at %s refused the connection (not running, or not listening at this address): %w", peer, base, err)
	case errors.As(err, &dns):
		return fmt.Errorf("transport: %s's address %s does not resolve: %w", peer, base, err)
	case errors.As(err, &cert), errors.As(err, &unknownCA), errors.As(err, &host):
		return fmt.Errorf("transport: TLS with %s at %s failed: its certificate does not verify against this node's CA or name: %w", peer, base, err)
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		// net/http turns the record header error into a string of its own.
		return fmt.Errorf("transport: TLS with %s at %s failed: it does not speak TLS (an http:// peer given as https://?): %w", peer, base, err)
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return fmt.Errorf("transport: %s at %s did not answer in time (down, or a network that drops): %w", peer, base, err)
	}
	return fmt.Errorf("transport: %s at %s could not be reached: %w", peer, base, err)
}

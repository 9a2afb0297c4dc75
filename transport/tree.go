package transport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/replicator/replicator/wire"
)

// AskTree posts an anti-entropy request to the node of the peer the link
// points at (after it proved the secret, as a batch is) and decodes its
// answer, which must carry a valid MAC when the link has a secret. It
// reports the bytes that crossed the wire both ways (bodies as sent).
// The bandwidth limit of the link applies to the answer's bytes too: a
// comparison shares the link with replication.
func (s *Shipper) AskTree(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, int64, error) {
	body, err := wire.EncodeTree(req)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 4*s.opts.RequestTimeout)
	defer cancel()
	s.mu.Lock()
	base := s.mu.url
	s.mu.Unlock()
	var nonce string
	sec, keyID := s.secret()
	if sec != "" {
		legacy, err := s.prove(ctx, base, sec, keyID)
		if err != nil {
			s.unproven(base)
			return nil, 0, err
		}
		if !legacy {
			nonce = wire.NewNonce()
		}
	}
	// The request counts against the link's limit as the answer does.
	if err := s.throttle(ctx, len(body)); err != nil {
		return nil, 0, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+wire.PathTree, bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	hr.Header.Set("Content-Type", wire.ContentType)
	hr.Header.Set(wire.HeaderOrigin, s.opts.Local)
	if sec != "" {
		hr.Header.Set("Authorization", "Bearer "+sec)
		hr.Header.Set(wire.HeaderKeyID, keyID)
	}
	if nonce != "" {
		hr.Header.Set(wire.HeaderNonce, nonce)
	}
	resp, err := s.opts.Client.Do(hr)
	if err != nil {
		return nil, int64(len(body)), fmt.Errorf("transport: ask %s for its tree: %w", s.peer.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, wire.MaxTreeBody+1))
	n := int64(len(body) + len(b))
	if err != nil {
		return nil, n, fmt.Errorf("transport: read the tree answer of %s: %w", s.peer.Name, err)
	}
	if err := s.throttle(ctx, len(b)); err != nil {
		return nil, n, err
	}
	if nonce != "" && !wire.VerifyMAC(resp.Header.Get(wire.HeaderMAC), wire.AnswerMAC(sec, nonce, resp.StatusCode, b)) {
		s.unproven(base)
		return nil, n, fmt.Errorf("%w: %s at %s answered the tree request %d without a valid %s", ErrUnproven, s.peer.Name, base, resp.StatusCode, wire.HeaderMAC)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, n, fmt.Errorf("transport: %s answered the tree request %d: %s", s.peer.Name, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if len(b) > wire.MaxTreeBody {
		return nil, n, fmt.Errorf("transport: %s answered the tree request with more than %d bytes", s.peer.Name, wire.MaxTreeBody)
	}
	ans, err := wire.DecodeTreeAnswer(b)
	if err != nil {
		return nil, n, fmt.Errorf("transport: the tree answer of %s: %w", s.peer.Name, err)
	}
	return ans, n, nil
}

// Name is the peer cluster the link ships to.
func (s *Shipper) Name() string { return s.peer.Name }

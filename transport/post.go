package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/replicator/replicator/wire"
)

// errGap carries the receiver's high-water mark from a 409 refusal.
type errGap struct{ hwm uint64 }

func (e *errGap) Error() string { return fmt.Sprintf("receiver is at index %d: rewinding", e.hwm) }

// errConflict is the receiver's proof that it applied another write under
// one of this stream's identities.
type errConflict struct{ msg string }

func (e *errConflict) Error() string { return e.msg }

var errNoPermit = errors.New("transport: receiver has no replay permit free (429)")

// errTooLarge is a 413 answer: the batch was over the receiver's body limit.
type errTooLarge struct {
	limit int64 // 0 when the receiver did not say
	msg   string
}

func (e *errTooLarge) Error() string { return "transport: batch too large for the receiver: " + e.msg }

// post sends one batch and decodes the answer.
func (s *Shipper) post(ctx context.Context, body []byte) (wire.Ack, error) {
	// A node of the peer cluster that does not lead names the one that
	// does: the batch goes there at once (a redirect is never a failure).
	for hop := 0; ; hop++ {
		ack, err := s.postOnce(ctx, body)
		var nl *errNotLeader
		if !errors.As(err, &nl) || nl.leader == "" || hop == 2 {
			return ack, err
		}
		s.mu.Lock()
		from := s.mu.url
		s.mu.url = nl.leader
		s.mu.Unlock()
		s.opts.Logger.Info("peer node does not lead: following its leader", "peer", s.peer.Name, "from", from, "to", nl.leader)
	}
}

// errNotLeader is a 503 not_leader answer: a node of a cluster of several
// that does not lead now, naming the one that does when it knows.
type errNotLeader struct {
	leader string
	msg    string
}

func (e *errNotLeader) Error() string { return "transport: " + e.msg }

// postOnce posts body once to the peer node the link points at (after that
// node proved it holds the secret) and decodes the answer.
func (s *Shipper) postOnce(ctx context.Context, body []byte) (wire.Ack, error) {
	var ack wire.Ack
	s.mu.Lock()
	base := s.mu.url
	if s.mu.firstTry.IsZero() {
		s.mu.firstTry = time.Now()
	}
	s.mu.Unlock()
	// The limit is charged with the bytes that go on the wire, so the body
	// is compressed first: a ratio guessed from earlier traffic let
	// incompressible values through at 4-7x the limit after compressible
	// ones. The wait comes before the request's deadline: a large body at
	// a low limit may wait longer than a request may take.
	sent, encoding := s.encode(base, body)
	if err := s.throttle(ctx, len(sent)); err != nil {
		return ack, fmt.Errorf("transport: waiting for the link's bandwidth to %s: %w", s.peer.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	var nonce string
	sec, keyID := s.secret()
	if sec != "" {
		legacy, err := s.prove(ctx, base, sec, keyID)
		if err != nil {
			s.unproven(base)
			return ack, err
		}
		if !legacy {
			nonce = wire.NewNonce()
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+wire.PathReplicate, bytes.NewReader(sent))
	if err != nil {
		return ack, err
	}
	req.Header.Set("Content-Type", wire.ContentType)
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	req.Header.Set(wire.HeaderOrigin, s.opts.Local)
	if sec != "" {
		req.Header.Set("Authorization", "Bearer "+sec)
		req.Header.Set(wire.HeaderKeyID, keyID)
	}
	if nonce != "" {
		req.Header.Set(wire.HeaderNonce, nonce)
	}
	req.Header.Set(wire.HeaderSent, strconv.FormatInt(time.Now().UnixNano(), 10))
	if ctx.Value(entriesKey{}) != nil {
		// The pause gate, as late as it can be: a Pause that returned
		// before this point sends nothing of this batch.
		if !s.beginSend() {
			return ack, errPaused
		}
		defer s.endSend()
	}
	s.mu.Lock()
	s.mu.bytesRaw += uint64(len(body))
	s.mu.bytesWire += uint64(len(sent))
	s.mu.Unlock()
	// The clock's skew is measured from here, after the bandwidth limit's
	// wait and the proof: a send the limiter held read as seconds of skew.
	departed := s.opts.Now()
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// This node of the peer is unreachable or too slow: the next try
			// goes to another (a follower there names the leader).
			s.mu.Lock()
			if s.mu.url == base {
				s.rotateLocked()
			}
			s.mu.Unlock()
		}
		return ack, unreached(s.peer.Name, base, err)
	}
	defer resp.Body.Close()
	s.learnEncodings(base, resp.Header.Get(wire.HeaderAcceptEncoding), resp.StatusCode)
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return ack, fmt.Errorf("transport: read answer of %s: %w", s.peer.Name, err)
	}
	// An answer that moves anything (the cursor, the URL, the batch's
	// size) must come from a holder of the secret.
	// (A 503 moves the URL only when it is a not_leader answer; another
	// one, such as a node shutting down, is a failure like any.)
	moves := resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusRequestEntityTooLarge ||
		(resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(b, []byte(`"not_leader"`)))
	if moves && nonce != "" && !wire.VerifyMAC(resp.Header.Get(wire.HeaderMAC), wire.AnswerMAC(sec, nonce, resp.StatusCode, b)) {
		s.unproven(base)
		return ack, fmt.Errorf("%w: %s at %s answered %d without a valid %s: ignored", ErrUnproven, s.peer.Name, base, resp.StatusCode, wire.HeaderMAC)
	}
	ack, err = s.decodeAnswer(base, resp.StatusCode, b)
	if err == nil && ack.Now != 0 {
		s.mu.Lock()
		s.mu.skew = time.Duration(ack.Now - (departed + (s.opts.Now()-departed)/2))
		s.mu.Unlock()
	}
	return ack, err
}

// encode is the body to send to the node at base, and its
// Content-Encoding: compressed when the link compresses, the node said it
// decodes zstd, the body is worth it, and compression made it smaller.
func (s *Shipper) encode(base string, body []byte) ([]byte, string) {
	sent, encoding := body, ""
	if s.compression() == CompressionZstd && len(body) >= compressAbove {
		s.mu.Lock()
		decodes := s.mu.decodes[base]
		s.mu.Unlock()
		if decodes {
			if z, err := wire.Compress(nil, body); err == nil && len(z) < len(body) {
				sent, encoding = z, wire.EncodingZstd
			}
		}
	}
	return sent, encoding
}

// learnEncodings records whether the node at base decodes zstd, from every
// answer of its replicate endpoint: an older build says nothing (plain
// bodies), and a 415 (a node rolled back to such a build) turns compression
// off until an answer says zstd again.
func (s *Shipper) learnEncodings(base, accept string, status int) {
	ok := false
	for rest := accept; rest != "" && !ok; {
		var enc string
		enc, rest, _ = strings.Cut(rest, ",")
		ok = strings.TrimSpace(enc) == wire.EncodingZstd
	}
	ok = ok && status != http.StatusUnsupportedMediaType
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.decodes[base] == ok {
		return
	}
	if s.mu.decodes == nil {
		s.mu.decodes = map[string]bool{}
	}
	s.mu.decodes[base] = ok
}

// decodeAnswer turns the answer of the node at base (its status and body
// b) into an ack, or into the error it stands for.
func (s *Shipper) decodeAnswer(base string, status int, b []byte) (wire.Ack, error) {
	var ack wire.Ack
	switch status {
	case http.StatusOK:
		if err := json.Unmarshal(b, &ack); err != nil {
			return ack, fmt.Errorf("transport: ack of %s: %w", s.peer.Name, err)
		}
		return ack, nil
	case http.StatusConflict:
		var e struct {
			Error struct {
				Code    string  `json:"code"`
				HWM     *uint64 `json:"hwm"`
				Version string  `json:"version"`
				Message string  `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code == "identity_conflict" {
			return ack, &errConflict{msg: e.Error.Message}
		}
		if json.Unmarshal(b, &e) == nil && e.Error.HWM != nil {
			return ack, &errGap{hwm: *e.Error.HWM}
		}
	case http.StatusTooManyRequests:
		return ack, fmt.Errorf("%w: %s", errNoPermit, strings.TrimSpace(string(b)))
	case http.StatusServiceUnavailable:
		var e struct {
			Error struct {
				Code    string   `json:"code"`
				Message string   `json:"message"`
				Leader  string   `json:"leader"`
				Nodes   []string `json:"nodes"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code == "not_leader" {
			s.mu.Lock()
			if len(e.Error.Nodes) > 0 {
				s.learnNodesLocked(e.Error.Nodes)
			}
			s.mu.Unlock()
			return ack, &errNotLeader{leader: e.Error.Leader, msg: fmt.Sprintf("%s at %s does not lead: %s", s.peer.Name, base, e.Error.Message)}
		}
	case http.StatusRequestEntityTooLarge:
		var e struct {
			Error struct {
				Limit int64 `json:"limit"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		return ack, &errTooLarge{limit: e.Error.Limit, msg: strings.TrimSpace(string(b))}
	}
	return ack, fmt.Errorf("transport: %s answered %d: %s", s.peer.Name, status, strings.TrimSpace(string(b)))
}

// compression is the link's compression: the cluster's log's once it set
// one (replicator compression), else the peer's flags.
func (s *Shipper) compression() string {
	if ls := s.settings(); ls.Compression != "" {
		return ls.Compression
	}
	return s.peer.Compression
}

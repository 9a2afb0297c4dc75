package acceptor

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/replicator/replicator/internal/httpjson"
	secretpkg "github.com/replicator/replicator/internal/secret"
	"github.com/replicator/replicator/wire"
)

// authenticate resolves the sender's cluster from its credentials, never
// from the body.
func (a *Acceptor) authenticate(r *http.Request) (string, error) {
	sender := r.Header.Get(wire.HeaderOrigin)
	if sender == "" {
		return "", fmt.Errorf("%w: no %s header", ErrUnauthenticated, wire.HeaderOrigin)
	}
	a.mu.Lock()
	pair, known := a.mu.secrets[sender]
	a.mu.Unlock()
	// The secret the request names (a rotation holds two: secret.Pair).
	secret, named := pair.For(r.Header.Get(wire.HeaderKeyID), a.opts.Now())
	if a.opts.CertCluster != nil {
		certID, presented, err := a.opts.CertCluster(r.TLS)
		switch {
		case presented && err != nil:
			return "", fmt.Errorf("%w: client certificate: %v", ErrUnauthenticated, err)
		case presented && certID != sender:
			return "", fmt.Errorf("%w: the client certificate is for cluster %q, the request claims %q", ErrForbidden, certID, sender)
		case presented && !known:
			return "", fmt.Errorf("%w: %q is not a configured peer", ErrUnauthenticated, sender)
		case presented:
			return sender, nil
		}
	}
	if !known {
		return "", fmt.Errorf("%w: %q is not a configured peer", ErrUnauthenticated, sender)
	}
	if secret == "" && a.opts.Insecure {
		return sender, nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", fmt.Errorf("%w: no bearer credential for %q", ErrUnauthenticated, sender)
	}
	if !named {
		return "", fmt.Errorf("%w: %q names a secret (key %s) this node does not hold, or no longer takes: rotate both sides in order "+
			"(docs/OPERATIONS.md \"Rotating a link's secret\")", ErrUnauthenticated, sender, r.Header.Get(wire.HeaderKeyID))
	}
	if secret == "" || !secretpkg.Equal(token, secret) {
		return "", fmt.Errorf("%w: wrong credential for %q", ErrUnauthenticated, sender)
	}
	return sender, nil
}

// ServeHTTP implements POST /v1/replicate: authenticate, bound, read the
// body (within a slot of the bounded body budget), decode, and only then
// take a replay permit to apply. A slow body holds a body slot, never a
// permit, and no peer holds more than its share of either.
func (a *Acceptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == wire.PathProve {
		a.ServeProve(w, r)
		return
	}
	if r.URL.Path == wire.PathTree {
		if a.opts.Tree == nil {
			httpjson.WriteError(w, http.StatusNotFound, httpjson.Error{Code: "not_found", Message: "this node does not answer tree requests"})
			return
		}
		a.ServeTree(w, r, a.opts.Tree)
		return
	}
	// Every answer says which body encodings this node decodes, so that a
	// sender learns it from its first heartbeat (wire/compress.go).
	w.Header().Set(wire.HeaderAcceptEncoding, wire.Encodings)
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		w.Header().Set("Connection", "close")
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.Error{Code: "method_not_allowed", Message: "POST a msgpack batch"})
		return
	}
	sender, err := a.authenticate(r)
	if err != nil {
		a.refuseUnread(w, "", err)
		return
	}
	w, finish := a.signed(w, r, sender)
	defer finish()
	if a.opts.Leadership != nil {
		if leading, leader, nodes := a.opts.Leadership(); !leading {
			a.refuseUnread(w, sender, &NotLeaderError{Leader: leader, Nodes: nodes})
			return
		}
	}
	left := a.arrive(sender)
	defer left()
	body, err := a.readBody(w, r, sender)
	if err != nil {
		a.refuseUnread(w, sender, err)
		return
	}
	b, err := wire.DecodeBatch(body)
	if err != nil {
		a.refuse(w, sender, fmt.Errorf("%w: %w", ErrBadBatch, err))
		return
	}
	if a.opts.Now != nil {
		b.ReceivedAt = a.opts.Now()
		b.SentAt, _ = strconv.ParseInt(r.Header.Get(wire.HeaderSent), 10, 64)
	}
	done, err := a.acquire(r, sender)
	if err != nil {
		a.refuse(w, sender, err)
		return
	}
	defer done()
	ack, err := a.applyInOrder(r, sender, b)
	if err != nil {
		a.refuse(w, sender, err)
		return
	}
	if a.opts.Nodes != nil {
		ack.Nodes = a.opts.Nodes()
	}
	httpjson.Write(w, http.StatusOK, ack)
}

// readBody checks the batch's content type and length and reads its body
// within a body slot. An error refuses the request unread.
func (a *Acceptor) readBody(w http.ResponseWriter, r *http.Request, sender string) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" && ct != wire.ContentType {
		return nil, fmt.Errorf("%w: content type %q, want %s", ErrBadBatch, ct, wire.ContentType)
	}
	if r.ContentLength > a.opts.MaxBodyBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, r.ContentLength, a.opts.MaxBodyBytes)
	}
	release, err := a.bodySlot(sender)
	if err != nil {
		return nil, err
	}
	// The body is read and decoded inside the sender's body slot: its
	// decoding is charged to its share (a sender of small compressed
	// bodies cannot make the node decode without bound beside it).
	defer release()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, a.opts.MaxBodyBytes)
		} else {
			err = fmt.Errorf("%w: reading the body: %v", ErrBadBatch, err)
		}
		return nil, err
	}
	// MaxBodyBytes bounds the body on the wire (above) and the batch it
	// decodes to: a compressed bomb is refused having cost the bound.
	body, err = a.decomp.Decode(r.Header.Get("Content-Encoding"), body)
	switch {
	case errors.Is(err, wire.ErrDecodedTooLarge):
		return nil, fmt.Errorf("%w: %w", ErrTooLarge, err)
	case errors.Is(err, wire.ErrEncoding):
		return nil, fmt.Errorf("%w: %w", ErrEncoding, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrBadBatch, err)
	}
	return body, nil
}

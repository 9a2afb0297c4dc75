package acceptor

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/wire"
)

// Proofs (issue 25, transport/proof.go): the node proves to a shipper that
// it holds the secret the two clusters share before the shipper sends it
// the secret or a batch, and every answer to an authenticated post carries
// its MAC.

// secretOf is the secret shared with sender that the request r names
// ("" when none: unknown, or a key ID this node does not take).
func (a *Acceptor) secretOf(sender string, r *http.Request) string {
	a.mu.Lock()
	p := a.mu.secrets[sender]
	a.mu.Unlock()
	s, _ := p.For(r.Header.Get(wire.HeaderKeyID), a.opts.Now())
	return s
}

// ServeProve answers a shipper's proof request (wire.PathProve): the
// MAC of its nonce under the secret shared with the cluster it names, so
// that it sends its secret and its batches only to a node that holds the
// secret too. A cluster with no secret here (unknown, or authenticated by
// certificate) gets 401: there is nothing to prove with.
func (a *Acceptor) ServeProve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.Error{Code: "method_not_allowed", Message: "POST a nonce"})
		return
	}
	sender, nonce := r.Header.Get(wire.HeaderOrigin), r.Header.Get(wire.HeaderNonce)
	if !wire.ValidNonce(nonce) {
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.Error{Code: "bad_request",
			Message: fmt.Sprintf("%s must be 64 hex digits", wire.HeaderNonce)})
		return
	}
	secret := a.secretOf(sender, r)
	if secret == "" {
		a.refusals.unauthenticated.Add(1)
		httpjson.WriteError(w, http.StatusUnauthorized, httpjson.Error{Code: "unauthenticated",
			Message: fmt.Sprintf("no secret is shared with %q here", sender)})
		return
	}
	httpjson.Write(w, http.StatusOK, wire.Proof{Cluster: a.opts.Local, Proof: wire.ProofMAC(secret, sender, a.opts.Local, nonce)})
}

// signed makes every answer to an authenticated request say it came from
// a holder of the sender's secret, when the request carries a nonce
// (transport/proof.go): the writer to answer with, and finish, which sends
// the answer with its MAC (call it once, after the answer).
func (a *Acceptor) signed(w http.ResponseWriter, r *http.Request, sender string) (http.ResponseWriter, func()) {
	nonce := r.Header.Get(wire.HeaderNonce)
	if nonce == "" || !wire.ValidNonce(nonce) {
		return w, func() {}
	}
	secret := a.secretOf(sender, r)
	if secret == "" {
		return w, func() {}
	}
	mw := &macWriter{ResponseWriter: w, secret: secret, nonce: nonce}
	return mw, mw.finish
}

// macWriter holds an answer until it is whole, then sends it with its MAC
// (wire.AnswerMAC). Answers to posts are small (an ack, an error).
type macWriter struct {
	http.ResponseWriter
	secret, nonce string
	status        int
	body          bytes.Buffer
}

func (m *macWriter) WriteHeader(code int) {
	if m.status == 0 {
		m.status = code
	}
}

func (m *macWriter) Write(b []byte) (int, error) {
	if m.status == 0 {
		m.status = http.StatusOK
	}
	return m.body.Write(b)
}

func (m *macWriter) finish() {
	if m.status == 0 {
		m.status = http.StatusOK
	}
	m.ResponseWriter.Header().Set(wire.HeaderMAC, wire.AnswerMAC(m.secret, m.nonce, m.status, m.body.Bytes()))
	m.ResponseWriter.WriteHeader(m.status)
	m.ResponseWriter.Write(m.body.Bytes())
}

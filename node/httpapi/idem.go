package httpapi

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/httpjson"
)

// Idempotency headers.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
	// HeaderAttempt is sent by clients that retry (1 for the first call);
	// it only goes to the logs.
	HeaderAttempt = "X-Replicator-Attempt"
	pathIdem      = "/v1/idempotency/{key...}"
)

// Fingerprint identifies a request: the same key with another fingerprint
// is a different request and is refused. It covers what decides the write,
// and nothing cluster-specific, so every cluster computes the same.
func Fingerprint(r *http.Request, key string, body []byte) []byte {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(r.Method), []byte(key), body,
		[]byte(r.Header.Get("If-Match")), []byte(r.Header.Get("If-None-Match"))} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	// An expiry as the request asked for it (a TTL is the same string on
	// every retry), only when it did: the fingerprints of requests
	// without one are as before.
	for _, name := range []string{HeaderTTL, HeaderExpires} {
		if v := r.Header.Get(name); v != "" {
			fmt.Fprintf(h, "%s:%d:%s", name, len(v), v)
		}
	}
	return h.Sum(nil)
}

// idemFor returns the keyed request of r, or nil when it carries no key.
func idemFor(r *http.Request, key string, body []byte, answer api.AnswerKind) (*api.Keyed, error) {
	k := r.Header.Get(HeaderIdempotencyKey)
	if k == "" {
		return nil, nil
	}
	if len(k) > entry.MaxIdemKey {
		return nil, fmt.Errorf("%w: Idempotency-Key of %d bytes, limit %d", api.ErrBadRequest, len(k), entry.MaxIdemKey)
	}
	for _, c := range []byte(k) {
		if c < 0x21 || c > 0x7e {
			return nil, fmt.Errorf("%w: Idempotency-Key must be printable ASCII without spaces", api.ErrBadRequest)
		}
	}
	return &api.Keyed{Key: k, Fingerprint: Fingerprint(r, key, body), Answer: answer}, nil
}

// answerWrite writes the answer of a (possibly keyed, possibly replayed)
// write and logs keyed outcomes.
func (a *API) answerWrite(w http.ResponseWriter, r *http.Request, idem *api.Keyed, res api.WriteResult, err error) {
	a.finishWrite(w, r, idem, res, err, func() {
		httpjson.WriteBody(w, http.StatusOK, api.AppendWriteAnswer(make([]byte, 0, 128), res.Key, res.Version, res.Origin))
	})
}

// logKeyed logs the outcome of a keyed request: key, attempt, category.
// (Keys go to logs only, never to metric labels.)
func (a *API) logKeyed(r *http.Request, idem *api.Keyed, res api.WriteResult, err error) {
	if idem == nil {
		return
	}
	outcome := "written"
	switch {
	case errors.Is(err, api.ErrIdempotencyConflict):
		outcome = "conflict"
	case errors.Is(err, api.ErrUnknownOutcome):
		outcome = "unknown"
	case err != nil:
		outcome = "failed"
	case res.Replay != nil:
		outcome = "replayed"
	}
	a.log.Debug("keyed write", "idempotency_key", idem.Key, "attempt", r.Header.Get(HeaderAttempt), "outcome", outcome)
}

func (a *API) handleIdem(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, "GET, HEAD")
		return
	}
	rep, err := a.node.Idempotency(r.PathValue("key"))
	if err != nil {
		WriteErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

package node

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
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

// fingerprint identifies a request: the same key with another fingerprint
// is a different request and is refused. It covers what decides the write,
// and nothing cluster-specific, so every cluster computes the same.
func fingerprint(r *http.Request, key string, body []byte) []byte {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(r.Method), []byte(key), body,
		[]byte(r.Header.Get("If-Match")), []byte(r.Header.Get("If-None-Match"))} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	return h.Sum(nil)
}

// idemFor returns the keyed request of r, or nil when it carries no key.
func idemFor(r *http.Request, key string, body []byte, answer machine.AnswerKind) (*idemRequest, error) {
	k := r.Header.Get(HeaderIdempotencyKey)
	if k == "" {
		return nil, nil
	}
	if len(k) > entry.MaxIdemKey {
		return nil, fmt.Errorf("%w: Idempotency-Key of %d bytes, limit %d", errBadRequest, len(k), entry.MaxIdemKey)
	}
	for _, c := range []byte(k) {
		if c < 0x21 || c > 0x7e {
			return nil, fmt.Errorf("%w: Idempotency-Key must be printable ASCII without spaces", errBadRequest)
		}
	}
	return &idemRequest{key: k, fingerprint: fingerprint(r, key, body), answer: answer}, nil
}

var errBadRequest = errors.New("node: bad request")

// answerWrite writes the answer of a (possibly keyed, possibly replayed)
// write and logs keyed outcomes.
func (n *Node) answerWrite(w http.ResponseWriter, r *http.Request, idem *idemRequest, res WriteResult, err error) {
	n.finishWrite(w, r, idem, res, err, func() {
		httpjson.WriteBody(w, http.StatusOK, machine.AppendWriteAnswer(make([]byte, 0, 128), res.Key, res.Version, res.Origin))
	})
}

// logKeyed logs the outcome of a keyed request: key, attempt, category.
// (Keys go to logs only, never to metric labels.)
func (n *Node) logKeyed(r *http.Request, idem *idemRequest, res WriteResult, err error) {
	if idem == nil {
		return
	}
	outcome := "written"
	switch {
	case errors.Is(err, ErrIdempotencyConflict):
		outcome = "conflict"
	case errors.Is(err, ErrUnknownOutcome):
		outcome = "unknown"
	case err != nil:
		outcome = "failed"
	case res.Replay != nil:
		outcome = "replayed"
	}
	n.log.Debug("keyed write", "idempotency_key", idem.key, "attempt", r.Header.Get(HeaderAttempt), "outcome", outcome)
}

// IdemReport is GET /v1/idempotency/{key}: what a keyed request was answered.
type IdemReport struct {
	Key     string          `json:"key"`
	Status  int             `json:"status"`
	Body    json.RawMessage `json:"body"`
	Version string          `json:"version"`
	Origin  string          `json:"origin"`
	Expires time.Time       `json:"expires"`
}

// Idempotency looks up the record of an Idempotency-Key, so a caller whose
// call timed out can learn its outcome instead of retrying blindly.
func (n *Node) Idempotency(key string) (IdemReport, error) {
	if err := n.readable(); err != nil {
		return IdemReport{}, err
	}
	rec, ok, err := n.store.Idem(key)
	if err != nil {
		return IdemReport{}, err
	}
	if !ok || rec.Expires <= n.clock.Physical() {
		return IdemReport{}, fmt.Errorf("%w: no record of idempotency key %q on cluster %s", ErrNotFound, key, n.cluster)
	}
	return idemReport(&rec), nil
}

func idemReport(rec *store.IdemRecord) IdemReport {
	body := json.RawMessage(rec.Body)
	if !json.Valid(body) {
		body, _ = json.Marshal(rec.Body)
	}
	return IdemReport{Key: rec.Key, Status: rec.Status, Body: body, Version: rec.Stamp.String(),
		Origin: rec.Stamp.Origin, Expires: time.Unix(0, rec.Expires).UTC()}
}

func (n *Node) handleIdem(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, "GET, HEAD")
		return
	}
	rep, err := n.Idempotency(r.PathValue("key"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

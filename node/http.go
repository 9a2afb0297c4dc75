package node

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// API paths; every route is registered on one mux in Handler.
const (
	pathKV      = "/v1/kv"
	pathKVKey   = "/v1/kv/{key...}"
	pathHealthz = "/healthz"
	pathReadyz  = "/readyz"
)

// PeerHandler serves the peer endpoint alone (on --peer-listen).
func (n *Node) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(pathReplicate, n.acceptor)
	mux.Handle(wire.PathProve, n.acceptor)
	mux.HandleFunc(pathHealthz, n.handleHealthz)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "the peer listener serves " + pathReplicate + " and " + wire.PathProve + " only"})
	})
	return mux
}

// Handler returns the node's HTTP API (and the peer endpoint, unless it has
// a listener of its own).
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(pathKVKey, n.handleKey)
	mux.HandleFunc(pathKV, n.handleRange)
	mux.HandleFunc(pathHealthz, n.handleHealthz)
	mux.HandleFunc(pathReadyz, n.handleReadyz)
	mux.HandleFunc(pathIdem, n.handleIdem)
	mux.HandleFunc(pathCounters, n.handleCounter)
	mux.HandleFunc(pathBatch, n.handleBatch)
	mux.HandleFunc(pathBulk, n.handleBulk)
	n.registerAdmin(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "no such endpoint: " + r.URL.Path})
	})
	return n.route(mux)
}

type apiError = httpjson.Error

var (
	writeJSON  = httpjson.Write
	writeError = httpjson.WriteError
)

// writeErr maps an error of the Go API to its HTTP answer.
func writeErr(w http.ResponseWriter, err error) {
	var se *SaturatedError
	var pe *machine.PreconditionError
	var nf *NotFoundError
	switch {
	case errors.As(err, &se):
		writeSaturated(w, se)
	case errors.As(err, &pe):
		e := apiError{Code: "precondition_failed", Message: err.Error(), Version: pe.Current}
		if pe.Current != "" {
			w.Header().Set("ETag", `"`+pe.Current+`"`)
		} else if pe.Deleted != "" {
			e.Version, e.Deleted = pe.Deleted, true
		}
		writeError(w, http.StatusPreconditionFailed, e)
	case errors.Is(err, machine.ErrKindConflict):
		writeError(w, http.StatusConflict, apiError{Code: "kind_conflict", Message: err.Error()})
	case errors.Is(err, ErrInvalidKey):
		writeError(w, http.StatusBadRequest, apiError{Code: "bad_key", Message: err.Error()})
	case errors.Is(err, ErrKeyTooLarge), errors.Is(err, ErrValueTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, apiError{Code: "too_large", Message: err.Error()})
	case errors.Is(err, machine.ErrCounterRange):
		writeError(w, http.StatusBadRequest, apiError{Code: "out_of_range", Message: err.Error()})
	case errors.Is(err, errBadRequest):
		writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: err.Error()})
	case errors.Is(err, ErrIdempotencyConflict):
		writeError(w, http.StatusUnprocessableEntity, apiError{Code: "idempotency_key_reused",
			Message: err.Error() + ": an Idempotency-Key names one request; use a new key for a new request"})
	case errors.Is(err, ErrPinOutOfWindow):
		writeError(w, http.StatusBadRequest, apiError{Code: "pin_out_of_window", Message: err.Error()})
	case errors.As(err, &nf):
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: err.Error(), Version: nf.Deleted, Deleted: nf.Deleted != "",
			CollectedBelow: nf.CollectedBelow})
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: err.Error()})
	case errors.Is(err, ErrUnknownOutcome):
		// The write may have happened: say so instead of guessing.
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unknown_outcome", Retryable: true, Outcome: "unknown",
			Message: err.Error() + "; the write may or may not have taken effect: read it back, or retry under the same Idempotency-Key"})
	case errors.Is(err, ErrClosed):
		// A write refused as the node shuts down says whether it happened.
		e := apiError{Code: "unavailable", Retryable: true, Message: err.Error()}
		if errors.Is(err, ErrNotWritten) {
			e.Outcome, e.Message = "not_written", err.Error()+"; nothing was written"
		}
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, e)
	case errors.Is(err, ErrCatchingUp):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "catching_up", Retryable: true, Message: err.Error()})
	case errors.Is(err, ErrNotWritten):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "not_written", Retryable: true, Outcome: "not_written", Message: err.Error()})
	default:
		writeError(w, http.StatusInternalServerError, apiError{Code: "internal", Message: err.Error()})
	}
}

func (n *Node) handleKey(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		rec, err := n.Get(key)
		if err != nil {
			writeErr(w, err)
			return
		}
		h := w.Header()
		h.Set("ETag", `"`+rec.Stamp.String()+`"`)
		h.Set("X-Replicator-Origin", rec.Stamp.Origin)
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.Itoa(len(rec.Value)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(rec.Value)
		}
	case http.MethodPut, http.MethodDelete:
		if err := n.checkKey(key); err != nil {
			writeErr(w, err)
			return
		}
		e := entry.Entry{Op: entry.OpDelete, Key: key}
		if r.Method == http.MethodPut {
			value, err := readBody(w, r, n.opts.MaxValueBytes)
			if err != nil {
				writeErr(w, err)
				return
			}
			e = entry.Entry{Op: entry.OpSet, Key: key, Value: value}
		}
		if err := n.checkValue(key, len(e.Value)); err != nil {
			writeErr(w, err)
			return
		}
		cond, err := parseConditions(r)
		if err != nil {
			writeErr(w, err)
			return
		}
		idem, err := idemFor(r, key, e.Value, machine.AnswerWrite)
		if err != nil {
			writeErr(w, err)
			return
		}
		res, err := n.propose(r.Context(), &proposal{entry: e, idem: idem, cond: condPtr(cond)})
		n.answerWrite(w, r, idem, res, err)
	default:
		methodNotAllowed(w, r, "GET, HEAD, PUT, DELETE")
	}
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, apiError{Code: "method_not_allowed",
		Message: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow)})
}

// exactReadMax is the largest declared body readBody allocates before it
// arrives.
const exactReadMax = 16 << 10

// readBody reads at most limit bytes, refusing a larger body before reading
// it when Content-Length says so, and after limit+1 bytes otherwise.
func readBody(w http.ResponseWriter, r *http.Request, limit int) ([]byte, error) {
	if r.ContentLength > int64(limit) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, r.ContentLength, limit)
	}
	if n := r.ContentLength; n >= 0 && n <= exactReadMax {
		// The length is known and small: one exact allocation instead of
		// ReadAll's growth from 512 bytes. (A large declared length is read
		// as it arrives, so that headers alone cannot make the node
		// allocate a megabyte per connection.) The buffer has room for one
		// byte more so that the last read sees the end of the body (which
		// also clears the body-rate deadline, see rateBody).
		b := make([]byte, n+1)
		got, err := io.ReadFull(r.Body, b)
		if int64(got) == n && (err == io.ErrUnexpectedEOF || n == 0 && err == io.EOF) {
			return b[:n:n], nil
		}
		if err == nil {
			err = errors.New("body longer than its Content-Length")
		}
		return nil, fmt.Errorf("%w: reading the body: %w", ErrNotWritten, err)
	}
	body := http.MaxBytesReader(w, r.Body, int64(limit))
	b, err := io.ReadAll(body)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrValueTooLarge, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the body: %w", ErrNotWritten, err)
	}
	return b, nil
}

type scanItem struct {
	Key     string `json:"key"`
	Value   []byte `json:"value"` // base64 in JSON
	Version string `json:"version"`
	Origin  string `json:"origin"`
}

type scanPage struct {
	Items []scanItem `json:"items"`
	Next  string     `json:"next"`
}

func (n *Node) handleRange(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodDelete {
		n.handleDeleteRange(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, "GET, HEAD, DELETE")
		return
	}
	q := r.URL.Query()
	o := store.ScanOptions{Prefix: q.Get("prefix"), Start: q.Get("start"), End: q.Get("end"), After: q.Get("after")}
	if s := q.Get("limit"); s != "" {
		l, err := strconv.Atoi(s)
		if err != nil || l < 1 || l > store.MaxScanLimit {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_request",
				Message: fmt.Sprintf("limit %q: want an integer in [1, %d]", s, store.MaxScanLimit)})
			return
		}
		o.Limit = l
	}
	for name, v := range map[string]string{"prefix": o.Prefix, "start": o.Start, "end": o.End, "after": o.After} {
		if len(v) > n.opts.MaxKeyBytes || !utf8.ValidString(v) {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_key", Message: name + " is not a valid key bound"})
			return
		}
	}
	items, next, err := n.Scan(o)
	if err != nil {
		writeErr(w, err)
		return
	}
	page := scanPage{Items: make([]scanItem, 0, len(items)), Next: next}
	for _, it := range items {
		page.Items = append(page.Items, scanItem{Key: it.Key, Value: it.Value, Version: it.Stamp.String(), Origin: it.Stamp.Origin})
	}
	writeJSON(w, http.StatusOK, page)
}

func (n *Node) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "cluster": n.cluster})
}

func (n *Node) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if err := n.Ready(); err != nil {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

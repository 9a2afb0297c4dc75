package httpapi

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/wire"
)

// API paths; every route is registered on one mux in Handler.
const (
	pathKV    = "/v1/kv"
	pathKVKey = "/v1/kv/{key...}"
	// PathHealthz, PathReadyz and PathUI stay open behind a token (the
	// page's data calls carry it).
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathUI      = "/admin/ui"
)

// PeerHandler serves the peer endpoint, peer, alone (on --peer-listen),
// with the health check.
func (a *API) PeerHandler(peer http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(wire.PathReplicate, peer)
	mux.Handle(wire.PathProve, peer)
	mux.Handle(wire.PathTree, peer)
	mux.HandleFunc(PathHealthz, a.handleHealthz)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "the peer listener serves " + wire.PathReplicate + ", " + wire.PathProve + " and " + wire.PathTree + " only"})
	})
	return mux
}

// Handler returns the node's HTTP API (and the peer endpoint, unless it has
// a listener of its own): the mux, which also tells each route's pattern
// (RouteScope).
func (a *API) Handler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc(pathKVKey, a.handleKey)
	mux.HandleFunc(pathKV, a.handleRange)
	mux.HandleFunc(PathHealthz, a.handleHealthz)
	mux.HandleFunc(PathReadyz, a.handleReadyz)
	mux.HandleFunc(pathIdem, a.handleIdem)
	mux.HandleFunc(pathCounters, a.handleCounter)
	mux.HandleFunc(pathBatch, a.handleBatch)
	mux.HandleFunc(pathBulk, a.handleBulk)
	mux.HandleFunc(PathHeld, getOnly(a.handleHeld))
	a.registerAdmin(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: "no such endpoint: " + r.URL.Path})
	})
	return mux
}

type apiError = httpjson.Error

var (
	writeJSON  = httpjson.Write
	writeError = httpjson.WriteError
)

// WriteErr maps an error of the node's Go API to its HTTP answer.
func WriteErr(w http.ResponseWriter, err error) {
	var se *api.SaturatedError
	var pe *api.PreconditionError
	var nf *api.NotFoundError
	switch {
	case errors.Is(err, api.ErrRemoved):
		// Before the other classes: a removed node's refusal of a write
		// also says not written, and its reads must not look transient.
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "removed", Outcome: "not_written",
			Message: err.Error() + "; this node takes no reads or writes: send them to another node of the cluster"})
	case errors.As(err, &se):
		writeSaturated(w, se)
	case errors.Is(err, api.ErrCrossGroup):
		// Before not_written: it is not worth retrying as it is.
		writeError(w, http.StatusBadRequest, apiError{Code: "cross_group", Outcome: "not_written", Message: err.Error()})
	case errors.As(err, &pe):
		e := apiError{Code: "precondition_failed", Message: err.Error(), Version: pe.Current}
		if pe.Current != "" {
			w.Header().Set("ETag", `"`+pe.Current+`"`)
		} else if pe.Deleted != "" {
			e.Version, e.Deleted = pe.Deleted, true
		}
		writeError(w, http.StatusPreconditionFailed, e)
	case errors.Is(err, api.ErrKindConflict):
		writeError(w, http.StatusConflict, apiError{Code: "kind_conflict", Message: err.Error()})
	case errors.Is(err, api.ErrNotInteger):
		writeError(w, http.StatusConflict, apiError{Code: "not_integer", Message: err.Error()})
	case errors.Is(err, api.ErrRestored):
		writeError(w, http.StatusConflict, apiError{Code: "restored", Message: err.Error()})
	case errors.Is(err, api.ErrInvalidKey):
		writeError(w, http.StatusBadRequest, apiError{Code: "bad_key", Message: err.Error()})
	case errors.Is(err, api.ErrKeyTooLarge), errors.Is(err, api.ErrValueTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, apiError{Code: "too_large", Message: err.Error()})
	case errors.Is(err, api.ErrCounterRange):
		writeError(w, http.StatusBadRequest, apiError{Code: "out_of_range", Message: err.Error()})
	case errors.Is(err, api.ErrBadRequest):
		writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: err.Error()})
	case errors.Is(err, api.ErrIdempotencyConflict):
		writeError(w, http.StatusUnprocessableEntity, apiError{Code: "idempotency_key_reused",
			Message: err.Error() + ": an Idempotency-Key names one request; use a new key for a new request"})
	case errors.Is(err, api.ErrPinOutOfWindow):
		writeError(w, http.StatusBadRequest, apiError{Code: "pin_out_of_window", Message: err.Error()})
	case errors.As(err, &nf):
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: err.Error(), Version: nf.Deleted, Deleted: nf.Deleted != "",
			CollectedBelow: nf.CollectedBelow})
	case errors.Is(err, api.ErrNotFound):
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: err.Error()})
	case errors.Is(err, api.ErrUnknownOutcome):
		// The write may have happened: say so instead of guessing.
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unknown_outcome", Retryable: true, Outcome: "unknown",
			Message: err.Error() + "; the write may or may not have taken effect: read it back, or retry under the same Idempotency-Key"})
	case errors.Is(err, api.ErrClosed):
		// A write refused as the node shuts down says whether it happened.
		e := apiError{Code: "unavailable", Retryable: true, Message: err.Error()}
		if errors.Is(err, api.ErrNotWritten) {
			e.Outcome, e.Message = "not_written", err.Error()+"; nothing was written"
		}
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, e)
	case errors.Is(err, api.ErrCatchingUp):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "catching_up", Retryable: true, Message: err.Error()})
	case errors.Is(err, api.ErrNotWritten):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "not_written", Retryable: true, Outcome: "not_written", Message: err.Error()})
	default:
		writeError(w, http.StatusInternalServerError, apiError{Code: "internal", Message: err.Error()})
	}
}

func (a *API) handleKey(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		rec, err := a.node.Get(key)
		if err != nil {
			WriteErr(w, err)
			return
		}
		h := w.Header()
		h.Set("ETag", `"`+rec.Stamp.String()+`"`)
		h.Set("X-Replicator-Origin", rec.Stamp.Origin)
		if rec.Expires != 0 {
			h.Set(HeaderExpires, time.Unix(0, rec.Expires).UTC().Format(time.RFC3339Nano))
		}
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.Itoa(len(rec.Value)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(rec.Value)
		}
	case http.MethodPut, http.MethodDelete:
		// The key is checked before the body is read.
		if err := api.CheckKey(key, a.opts.MaxKeyBytes); err != nil {
			WriteErr(w, err)
			return
		}
		e := entry.Entry{Op: entry.OpDelete, Key: key}
		if r.Method == http.MethodPut {
			value, err := readBody(w, r, a.opts.MaxValueBytes)
			if err != nil {
				WriteErr(w, err)
				return
			}
			e = entry.Entry{Op: entry.OpSet, Key: key, Value: value}
		}
		var err error
		if e.Expires, err = a.parseExpiry(r, e.Op); err != nil {
			WriteErr(w, err)
			return
		}
		cond, err := parseConditions(r)
		if err != nil {
			WriteErr(w, err)
			return
		}
		idem, err := idemFor(r, key, e.Value, api.AnswerWrite)
		if err != nil {
			WriteErr(w, err)
			return
		}
		res, err := a.node.Propose(r.Context(), api.Write{Entry: e, Keyed: idem, Cond: cond})
		a.answerWrite(w, r, idem, res, err)
	default:
		methodNotAllowed(w, r, "GET, HEAD, PUT, DELETE")
	}
}

// The expiry of a PUT (docs/API.md "Expiry"): a TTL from the node's clock,
// or an absolute time; a GET answers the version's in HeaderExpires.
const (
	HeaderTTL     = "X-Replicator-TTL"     // a Go duration: 30s, 1h
	HeaderExpires = "X-Replicator-Expires" // RFC 3339
)

// parseExpiry reads a write's expiry (0: none).
func (a *API) parseExpiry(r *http.Request, op entry.Op) (int64, error) {
	ttl, at := r.Header.Get(HeaderTTL), r.Header.Get(HeaderExpires)
	switch {
	case ttl == "" && at == "":
		return 0, nil
	case op != entry.OpSet:
		return 0, fmt.Errorf("%w: an expiry on a %s", api.ErrBadRequest, op)
	case ttl != "" && at != "":
		return 0, fmt.Errorf("%w: %s and %s at once", api.ErrBadRequest, HeaderTTL, HeaderExpires)
	case at != "":
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil || t.UnixNano() <= 0 {
			return 0, fmt.Errorf("%w: %s %q is not an RFC 3339 time after 1970", api.ErrBadRequest, HeaderExpires, at)
		}
		return t.UnixNano(), nil
	}
	d, err := time.ParseDuration(ttl)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: %s %q is not a positive duration (30s, 1h)", api.ErrBadRequest, HeaderTTL, ttl)
	}
	now := time.Now().UnixNano()
	if a.opts.Now != nil {
		now = a.opts.Now()
	}
	if int64(d) > math.MaxInt64-now {
		return 0, fmt.Errorf("%w: %s %q is past the clock's range", api.ErrBadRequest, HeaderTTL, ttl)
	}
	return now + int64(d), nil
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
		return nil, fmt.Errorf("%w: %d bytes, limit %d", api.ErrValueTooLarge, r.ContentLength, limit)
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
		return nil, fmt.Errorf("%w: reading the body: %w", api.ErrNotWritten, err)
	}
	body := http.MaxBytesReader(w, r.Body, int64(limit))
	b, err := io.ReadAll(body)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, fmt.Errorf("%w: more than %d bytes", api.ErrValueTooLarge, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the body: %w", api.ErrNotWritten, err)
	}
	return b, nil
}

type scanItem struct {
	Key     string `json:"key"`
	Value   []byte `json:"value"` // base64 in JSON
	Version string `json:"version"`
	Origin  string `json:"origin"`
	// Descends is the version's causal context (docs/DATAMODEL.md
	// "Conflicts"): for each cluster, the newest version of the key its
	// author had seen, its own included. Absent before command format 4.
	Descends []string `json:"descends,omitempty"`
}

type scanPage struct {
	Items []scanItem `json:"items"`
	Next  string     `json:"next"`
}

func (a *API) handleRange(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodDelete {
		a.handleDeleteRange(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, "GET, HEAD, DELETE")
		return
	}
	q := r.URL.Query()
	o := api.ScanOptions{Prefix: q.Get("prefix"), Start: q.Get("start"), End: q.Get("end"), After: q.Get("after")}
	if s := q.Get("limit"); s != "" {
		l, err := strconv.Atoi(s)
		if err != nil || l < 1 || l > api.MaxScanLimit {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_request",
				Message: fmt.Sprintf("limit %q: want an integer in [1, %d]", s, api.MaxScanLimit)})
			return
		}
		o.Limit = l
	}
	for name, v := range map[string]string{"prefix": o.Prefix, "start": o.Start, "end": o.End, "after": o.After} {
		if len(v) > a.opts.MaxKeyBytes || !utf8.ValidString(v) {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_key", Message: name + " is not a valid key bound"})
			return
		}
	}
	items, next, err := a.node.Scan(o)
	if err != nil {
		WriteErr(w, err)
		return
	}
	page := scanPage{Items: make([]scanItem, 0, len(items)), Next: next}
	for _, it := range items {
		si := scanItem{Key: it.Key, Value: it.Value, Version: it.Stamp.String(), Origin: it.Stamp.Origin}
		for _, c := range it.Ctx {
			si.Descends = append(si.Descends, entry.Stamp{HLC: c.HLC, Origin: c.Origin}.String())
		}
		page.Items = append(page.Items, si)
	}
	writeJSON(w, http.StatusOK, page)
}

func (a *API) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "cluster": a.node.ClusterID()})
}

func (a *API) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if err := a.node.Ready(); err != nil {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

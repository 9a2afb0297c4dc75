package httpapi

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
)

const (
	pathCounters = "/v1/counters/{key...}"
	pathBatch    = "/v1/batch"
	pathBulk     = "/v1/bulk"
)

// parseConditions reads If-Match and If-None-Match (nil when neither is
// set).
func parseConditions(r *http.Request) (*api.Condition, error) {
	var c api.Condition
	if v := r.Header.Get("If-Match"); v != "" {
		v = strings.TrimSpace(strings.TrimPrefix(v, "W/"))
		if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
			return nil, fmt.Errorf("%w: If-Match wants a quoted version, got %s", api.ErrBadRequest, v)
		}
		c.IfMatch = v[1 : len(v)-1]
		if c.IfMatch == "" {
			return nil, fmt.Errorf("%w: If-Match with an empty version", api.ErrBadRequest)
		}
	}
	if v := r.Header.Get("If-None-Match"); v != "" {
		if strings.TrimSpace(v) != "*" {
			return nil, fmt.Errorf("%w: If-None-Match supports only *", api.ErrBadRequest)
		}
		if r.Method != http.MethodPut {
			return nil, fmt.Errorf("%w: If-None-Match: * is for PUT", api.ErrBadRequest)
		}
		c.IfNoneMatch = true
	}
	if c.IfMatch != "" && c.IfNoneMatch {
		return nil, fmt.Errorf("%w: If-Match and If-None-Match together", api.ErrBadRequest)
	}
	if c.IfMatch == "" && !c.IfNoneMatch {
		return nil, nil
	}
	return &c, nil
}

// handleDeleteRange serves DELETE /v1/kv?start=&end= and ?prefix=.
func (a *API) handleDeleteRange(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	start, end, prefix := q.Get("start"), q.Get("end"), q.Get("prefix")
	switch {
	case prefix != "" && (start != "" || end != ""):
		WriteErr(w, fmt.Errorf("%w: give prefix, or start and end, not both", api.ErrBadRequest))
		return
	case prefix != "":
		start, end = api.PrefixRange(prefix)
	case start == "":
		WriteErr(w, fmt.Errorf("%w: a range delete needs start (and end) or prefix; deleting everything is not an API call", api.ErrBadRequest))
		return
	}
	idem, err := idemFor(r, start+"\x00"+end, nil, api.AnswerRange)
	if err != nil {
		WriteErr(w, err)
		return
	}
	res, err := a.node.Propose(r.Context(), api.Write{Entry: entry.Entry{Op: entry.OpDeleteRange, Key: start, End: end}, Keyed: idem})
	a.finishWrite(w, r, idem, res, err, func() {
		writeJSON(w, http.StatusOK, api.RangeAnswer{Start: start, End: end, Version: res.Version, Origin: res.Origin})
	})
}

// finishWrite answers a (possibly keyed) write: the error, the recorded
// answer of a replay, or the live answer.
func (a *API) finishWrite(w http.ResponseWriter, r *http.Request, idem *api.Keyed, res api.WriteResult, err error, live func()) {
	a.logKeyed(r, idem, res, err)
	switch {
	case err != nil:
		WriteErr(w, err)
	case res.Replay != nil:
		writeReplay(w, res.Replay.Status, res.Replay.Body)
	default:
		if r.Method == http.MethodDelete || res.Existed > 0 {
			// How many of the keys a delete or a batch deleted held a
			// value (decided in commit order): RESP's DEL count, when a
			// follower forwards it.
			w.Header().Set(HeaderExisted, strconv.Itoa(res.Existed))
		}
		if res.Index > 0 {
			// The write's place in the cluster's stream: RESP's WAIT at
			// a follower asks the leader which peers hold it
			// (GET /v1/held).
			w.Header().Set(HeaderIndex, strconv.FormatUint(res.Index, 10))
			w.Header().Set(HeaderStream, res.Stream.String())
		}
		live()
	}
}

// HeaderExisted answers a delete or a batch with how many of the keys it
// deleted held a live value just before it.
const HeaderExisted = "X-Replicator-Existed"

// HeaderIndex answers a write with its index in this cluster's outbound
// stream (the WAL index the links' acknowledgements count in), and
// HeaderStream with that stream.
const (
	HeaderIndex  = "X-Replicator-Index"
	HeaderStream = "X-Replicator-Stream"
)

// PathHeld answers which peer clusters hold the writes at indexes of this
// cluster's stream: GET /v1/held?stream=S&index=I[&from=F] (F..I; F is I
// when not given).
const PathHeld = "/v1/held"

// handleHeld serves GET /v1/held.
func (a *API) handleHeld(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	stream, err := entry.ParseStreamID(q.Get("stream"))
	if err != nil {
		WriteErr(w, fmt.Errorf("%w: stream: %w", api.ErrBadRequest, err))
		return
	}
	index, err := strconv.ParseUint(q.Get("index"), 10, 64)
	if err != nil || index == 0 {
		WriteErr(w, fmt.Errorf("%w: index: a write's index (X-Replicator-Index), from 1", api.ErrBadRequest))
		return
	}
	from := index
	if v := q.Get("from"); v != "" {
		if from, err = strconv.ParseUint(v, 10, 64); err != nil || from == 0 || from > index {
			WriteErr(w, fmt.Errorf("%w: from: an index from 1 to index", api.ErrBadRequest))
			return
		}
	}
	peers, err := a.node.Holding(stream, from, index)
	if err != nil {
		WriteErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.HeldReport{Stream: stream.String(), From: from, Index: index, Peers: peers})
}

// handleCounter serves POST, GET and DELETE /v1/counters/{key...}. A
// delete is the key's delete (/v1/kv): it removes the increments this
// cluster counted (docs/DATAMODEL.md "Counters").
func (a *API) handleCounter(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		c, err := a.node.Counter(key)
		if err != nil {
			WriteErr(w, err)
			return
		}
		w.Header().Set("ETag", `"`+c.Version+`"`)
		writeJSON(w, http.StatusOK, c)
	case http.MethodPost:
		body, err := readBody(w, r, 4096)
		if err != nil {
			WriteErr(w, err)
			return
		}
		delta, err := DecodeDelta(body)
		if err != nil {
			WriteErr(w, err)
			return
		}
		idem, err := idemFor(r, key, body, api.AnswerCounter)
		if err != nil {
			WriteErr(w, err)
			return
		}
		res, err := a.node.Propose(r.Context(), api.Write{Entry: entry.Entry{Op: entry.OpCounter, Key: key}, Delta: delta, Keyed: idem})
		a.finishWrite(w, r, idem, res, err, func() {
			writeJSON(w, http.StatusOK, api.CounterAnswer{Key: key, Value: res.Counter, Version: res.Version, Origin: res.Origin})
		})
	case http.MethodDelete:
		a.handleKey(w, r)
	default:
		methodNotAllowed(w, r, "GET, HEAD, POST, DELETE")
	}
}

// DecodeDelta reads a counter request body: {"delta": n}, n a non-zero
// integer.
func DecodeDelta(body []byte) (int64, error) {
	var req struct {
		Delta *json.Number `json:"delta"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		return 0, fmt.Errorf("%w: want {\"delta\": <integer>}: %v", api.ErrBadRequest, err)
	}
	if dec.More() {
		return 0, fmt.Errorf("%w: trailing data after the JSON object", api.ErrBadRequest)
	}
	if req.Delta == nil {
		return 0, fmt.Errorf("%w: want {\"delta\": <integer>}", api.ErrBadRequest)
	}
	d, err := req.Delta.Int64()
	if err != nil || d == 0 || d == -1<<63 {
		return 0, fmt.Errorf("%w: delta %s: want a non-zero 64-bit integer", api.ErrBadRequest, req.Delta.String())
	}
	return d, nil
}

// batchRequest is POST /v1/batch.
type batchRequest struct {
	Ops []struct {
		Op       string  `json:"op"`
		Key      string  `json:"key"`
		Value    *string `json:"value"`
		ValueB64 *string `json:"value_b64"`
		// TTL (a Go duration) or Expires (RFC 3339): a set's expiry, as
		// the X-Replicator-TTL and X-Replicator-Expires headers of a PUT.
		TTL     *string `json:"ttl"`
		Expires *string `json:"expires"`
	} `json:"ops"`
	OperationID string `json:"operation_id"`
}

// DecodeBatchRequest reads an atomic batch request: its ops and its
// operation id ("" when absent). A TTL counts from now.
func DecodeBatchRequest(body []byte) ([]api.BatchOp, string, error) {
	ops, ttls, id, err := decodeBatch(body)
	if err == nil {
		err = applyTTLs(ops, ttls, time.Now().UnixNano())
	}
	return ops, id, err
}

// applyTTLs sets the expiry of each op with a TTL to now plus it.
func applyTTLs(ops []api.BatchOp, ttls []time.Duration, now int64) error {
	for i, d := range ttls {
		if d == 0 {
			continue
		}
		if int64(d) > math.MaxInt64-now {
			return fmt.Errorf("%w: op %d: ttl %s is past the clock's range", api.ErrBadRequest, i, d)
		}
		ops[i].Expires = now + int64(d)
	}
	return nil
}

// decodeBatch reads a batch request, each op's TTL apart (the fingerprint
// of a keyed batch covers the TTL asked, not the time it ends at).
func decodeBatch(body []byte) ([]api.BatchOp, []time.Duration, string, error) {
	if !utf8.Valid(body) {
		// encoding/json would rewrite the bytes to U+FFFD: a key the
		// caller did not send.
		return nil, nil, "", fmt.Errorf("%w: batch: not valid UTF-8 (binary values go in value_b64)", api.ErrBadRequest)
	}
	// go-json-experiment (encoding/json/v2's implementation) decodes a
	// batch three times faster than encoding/json (a third of a leader's
	// CPU under batched load was this decode): names match exactly, a
	// name twice, an unknown member or trailing data is refused.
	var req batchRequest
	if err := jsonv2.Unmarshal(body, &req, jsonv2.RejectUnknownMembers(true)); err != nil {
		return nil, nil, "", fmt.Errorf("%w: batch: %v", api.ErrBadRequest, err)
	}
	if len(req.OperationID) > entry.MaxIdemKey-3 {
		return nil, nil, "", fmt.Errorf("%w: operation_id of %d bytes", api.ErrBadRequest, len(req.OperationID))
	}
	ops := make([]api.BatchOp, 0, len(req.Ops))
	var ttls []time.Duration
	for i, o := range req.Ops {
		op := api.BatchOp{Key: o.Key}
		if o.TTL != nil || o.Expires != nil {
			if ttls == nil {
				ttls = make([]time.Duration, len(req.Ops))
			}
			var err error
			if ttls[i], op.Expires, err = opExpiry(o.Op, o.TTL, o.Expires); err != nil {
				return nil, nil, "", fmt.Errorf("%w: op %d: %v", api.ErrBadRequest, i, err)
			}
		}
		switch o.Op {
		case "set":
			switch {
			case o.Value != nil && o.ValueB64 != nil:
				return nil, nil, "", fmt.Errorf("%w: op %d: value or value_b64, not both", api.ErrBadRequest, i)
			case o.Value != nil:
				op.Value = []byte(*o.Value)
			case o.ValueB64 != nil:
				v, err := base64.StdEncoding.DecodeString(*o.ValueB64)
				if err != nil {
					return nil, nil, "", fmt.Errorf("%w: op %d: value_b64: %v", api.ErrBadRequest, i, err)
				}
				op.Value = v
			default:
				op.Value = []byte{}
			}
		case "delete":
			if o.Value != nil || o.ValueB64 != nil {
				return nil, nil, "", fmt.Errorf("%w: op %d: a delete takes no value", api.ErrBadRequest, i)
			}
			op.Delete = true
		default:
			return nil, nil, "", fmt.Errorf("%w: op %d: op %q, want set or delete", api.ErrBadRequest, i, o.Op)
		}
		ops = append(ops, op)
	}
	return ops, ttls, req.OperationID, nil
}

// opExpiry reads a batch op's ttl or expires.
func opExpiry(op string, ttl, at *string) (time.Duration, int64, error) {
	switch {
	case op != "set":
		return 0, 0, fmt.Errorf("an expiry on a %s", op)
	case ttl != nil && at != nil:
		return 0, 0, errors.New("ttl and expires at once")
	case at != nil:
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil || t.UnixNano() <= 0 {
			return 0, 0, fmt.Errorf("expires %q is not an RFC 3339 time after 1970", *at)
		}
		return 0, t.UnixNano(), nil
	}
	d, err := time.ParseDuration(*ttl)
	if err != nil || d <= 0 {
		return 0, 0, fmt.Errorf("ttl %q is not a positive duration (30s, 1h)", *ttl)
	}
	return d, 0, nil
}

// handleBatch serves POST /v1/batch. The operation_id makes it idempotent
// like an Idempotency-Key (the header also works); reusing it for other ops
// is refused with 422.
func (a *API) handleBatch(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	body, err := readBody(w, r, int(a.opts.MaxBatchBytes))
	if err != nil {
		WriteErr(w, err)
		return
	}
	ops, ttls, opID, err := decodeBatch(body)
	if err != nil {
		WriteErr(w, err)
		return
	}
	// the fingerprint covers the ops (and the TTLs asked), not how the
	// JSON spelled them
	canon, _ := json.Marshal(ops)
	if ttls != nil {
		canon, _ = json.Marshal(struct {
			Ops  []api.BatchOp
			TTLs []time.Duration
		}{ops, ttls})
	}
	now := time.Now().UnixNano()
	if a.opts.Now != nil {
		now = a.opts.Now()
	}
	if err := applyTTLs(ops, ttls, now); err != nil {
		WriteErr(w, err)
		return
	}
	var idem *api.Keyed
	if opID != "" {
		idem = &api.Keyed{Key: "op:" + opID, Fingerprint: Fingerprint(r, "batch", canon), Answer: api.AnswerBatch, OpID: opID}
	} else if idem, err = idemFor(r, "batch", canon, api.AnswerBatch); err != nil {
		WriteErr(w, err)
		return
	}
	res, err := a.node.Propose(r.Context(), api.Write{Ops: ops, Keyed: idem})
	if errors.Is(err, api.ErrIdempotencyConflict) && opID != "" {
		a.logKeyed(r, idem, res, err)
		writeError(w, http.StatusUnprocessableEntity, apiError{Code: "operation_id_reused",
			Message: fmt.Sprintf("operation_id %q was used for a different set of operations", opID)})
		return
	}
	a.finishWrite(w, r, idem, res, err, func() {
		writeJSON(w, http.StatusOK, api.BatchAnswer{OperationID: opID, Ops: len(ops), Version: res.Version, Origin: res.Origin})
	})
}

// BulkReader reads bulk-load records: NDJSON lines {"key","value"} (or
// "value_b64"), or CSV rows key,value. Lines are bounded.
type BulkReader struct {
	csv   *csv.Reader
	lines *bufio.Scanner
	line  int
}

// NewBulkReader reads NDJSON, or CSV when csvFormat.
func NewBulkReader(r io.Reader, csvFormat bool, maxLine int) *BulkReader {
	if csvFormat {
		rb := &recordBound{r: r, max: int64(maxLine)}
		c := csv.NewReader(rb)
		c.FieldsPerRecord = 2
		c.ReuseRecord = true
		rb.csv = c
		return &BulkReader{csv: c}
	}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), maxLine)
	return &BulkReader{lines: s}
}

// recordBound feeds a CSV reader at most max bytes beyond the end of the
// last record it returned (plus its read-ahead), so one record cannot grow
// without bound in memory: a quoted field may span lines, so the bound is on
// bytes, not lines.
type recordBound struct {
	r    io.Reader
	csv  *csv.Reader
	max  int64
	read int64
}

// errRecordTooLong refuses a CSV record over the line bound.
var errRecordTooLong = errors.New("record longer than the limit")

func (b *recordBound) Read(p []byte) (int, error) {
	allowed := b.csv.InputOffset() + b.max + 64<<10 - b.read
	if allowed <= 0 {
		return 0, fmt.Errorf("%w of %d bytes", errRecordTooLong, b.max)
	}
	if int64(len(p)) > allowed {
		p = p[:allowed]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}

// Next returns the next record; io.EOF at the end.
func (b *BulkReader) Next() (api.BulkRecord, error) {
	if b.csv != nil {
		rec, err := b.csv.Read()
		b.line++
		if err != nil {
			if err == io.EOF {
				return api.BulkRecord{}, io.EOF
			}
			return api.BulkRecord{}, fmt.Errorf("%w: csv row %d: %v", api.ErrBadRequest, b.line, err)
		}
		return api.BulkRecord{Key: rec[0], Value: []byte(rec[1])}, nil
	}
	for b.lines.Scan() {
		b.line++
		line := bytes.TrimSpace(b.lines.Bytes())
		if len(line) == 0 {
			continue
		}
		rec, err := DecodeBulkLine(line)
		if err != nil {
			return rec, fmt.Errorf("line %d: %w", b.line, err)
		}
		return rec, nil
	}
	if err := b.lines.Err(); err != nil {
		return api.BulkRecord{}, fmt.Errorf("%w: line %d: %v", api.ErrBadRequest, b.line+1, err)
	}
	return api.BulkRecord{}, io.EOF
}

// DecodeBulkLine reads one NDJSON record {"key": ..., "value": ...} or
// {"key": ..., "value_b64": ...}.
func DecodeBulkLine(line []byte) (api.BulkRecord, error) {
	if rec, ok := fastBulkLine(line); ok {
		return rec, nil
	}
	return slowBulkLine(line)
}

// fastBulkLine parses the common spelling {"key":"...","value":"..."} with
// no escapes in either string, without reflection; anything else is left to
// encoding/json. (The profile of a bulk load put encoding/json first.)
func fastBulkLine(line []byte) (api.BulkRecord, bool) {
	const k1, k2 = `{"key":"`, `","value":"`
	if len(line) < len(k1)+len(k2)+2 || !bytes.HasPrefix(line, []byte(k1)) || !bytes.HasSuffix(line, []byte(`"}`)) {
		return api.BulkRecord{}, false
	}
	rest := line[len(k1) : len(line)-2]
	i := bytes.Index(rest, []byte(k2))
	if i < 0 {
		return api.BulkRecord{}, false
	}
	key, val := rest[:i], rest[i+len(k2):]
	for _, part := range [][]byte{key, val} {
		for _, c := range part {
			if c == '\\' || c == '"' || c < 0x20 {
				return api.BulkRecord{}, false
			}
		}
	}
	if !utf8.Valid(key) || !utf8.Valid(val) {
		return api.BulkRecord{}, false
	}
	return api.BulkRecord{Key: string(key), Value: bytes.Clone(val)}, true
}

func slowBulkLine(line []byte) (api.BulkRecord, error) {
	if !utf8.Valid(line) {
		// encoding/json would rewrite the bytes to U+FFFD: a key the
		// caller did not send (CSV refuses them the same way).
		return api.BulkRecord{}, fmt.Errorf("%w: not valid UTF-8 (binary values go in value_b64)", api.ErrBadRequest)
	}
	var rec struct {
		Key      *string `json:"key"`
		Value    *string `json:"value"`
		ValueB64 *string `json:"value_b64"`
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return api.BulkRecord{}, fmt.Errorf("%w: %v", api.ErrBadRequest, err)
	}
	if dec.More() {
		return api.BulkRecord{}, fmt.Errorf("%w: one JSON object per line", api.ErrBadRequest)
	}
	if rec.Key == nil || (rec.Value == nil) == (rec.ValueB64 == nil) {
		return api.BulkRecord{}, fmt.Errorf("%w: want {\"key\", \"value\"} or {\"key\", \"value_b64\"}", api.ErrBadRequest)
	}
	out := api.BulkRecord{Key: *rec.Key}
	if rec.Value != nil {
		out.Value = []byte(*rec.Value)
	} else {
		v, err := base64.StdEncoding.DecodeString(*rec.ValueB64)
		if err != nil {
			return api.BulkRecord{}, fmt.Errorf("%w: value_b64: %v", api.ErrBadRequest, err)
		}
		out.Value = v
	}
	return out, nil
}

// BulkChunk is how many records one bulk batch (one WAL entry) holds.
const BulkChunk = 1000

// Bulk loads records in chunks: each chunk is one atomic batch entry in the
// WAL, shipped to peers as normal replication. A failure stops the load;
// the chunks before it stay loaded (Loaded says how many records).
func Bulk(r interface {
	Next() (api.BulkRecord, error)
}, write func(ops []api.BatchOp) (api.WriteResult, error)) (api.BulkResult, error) {
	var res api.BulkResult
	chunk := make([]api.BatchOp, 0, BulkChunk)
	size := 0
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		wr, err := write(chunk)
		if err != nil {
			return err
		}
		res.Loaded += len(chunk)
		res.Batches++
		res.Version = wr.Version
		chunk, size = chunk[:0], 0
		return nil
	}
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return res, flush()
		}
		if err != nil {
			return res, errors.Join(flush(), err)
		}
		if !utf8.ValidString(rec.Key) {
			return res, errors.Join(flush(), fmt.Errorf("%w: key %q is not UTF-8", api.ErrInvalidKey, rec.Key))
		}
		chunk = append(chunk, api.BatchOp{Key: rec.Key, Value: rec.Value})
		size += len(rec.Key) + len(rec.Value)
		if len(chunk) == BulkChunk || size >= 1<<20 {
			if err := flush(); err != nil {
				return res, err
			}
		}
	}
}

// handleBulk serves POST /v1/bulk: an NDJSON (or, with Content-Type
// text/csv, CSV) stream of records, written as it arrives.
func (a *API) handleBulk(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	csvFormat := strings.HasPrefix(r.Header.Get("Content-Type"), "text/csv")
	maxLine := 2*a.opts.MaxValueBytes + a.opts.MaxKeyBytes + 1024
	br := NewBulkReader(r.Body, csvFormat, maxLine)
	res, err := Bulk(br, func(ops []api.BatchOp) (api.WriteResult, error) {
		return a.node.Propose(r.Context(), api.Write{Ops: ops})
	})
	if err != nil {
		loaded := int64(res.Loaded)
		e := apiError{Code: "bulk_failed", Loaded: &loaded, Message: fmt.Sprintf("%v; %d records were loaded before it", err, res.Loaded)}
		status := http.StatusBadRequest
		if !errors.Is(err, api.ErrBadRequest) && !errors.Is(err, api.ErrInvalidKey) && !errors.Is(err, api.ErrKeyTooLarge) && !errors.Is(err, api.ErrValueTooLarge) {
			status, e.Retryable = http.StatusServiceUnavailable, true
		}
		writeError(w, status, e)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func writeReplay(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set(HeaderReplayed, "true")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

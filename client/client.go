// Package client is a Go client for a replicator node's HTTP API. The CLI
// and the e2e tests use it.
package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/replicator/replicator/policy"
)

// Client talks to one node. Safe for concurrent use.
type Client struct {
	base  string
	http  *http.Client
	token string
	retry policy.RetryPolicy
}

// Options configures a Client.
type Options struct {
	// HTTPClient replaces the default client (10 s timeout, keep-alive).
	HTTPClient *http.Client
	// Token is sent as "Authorization: Bearer <token>" when set.
	Token string
	// Retry, when set, retries writes made under an idempotency scope
	// (policy.NewScope / policy.WithKey): the scope's key is sent as the
	// Idempotency-Key of every attempt, so a retry replays instead of
	// writing twice. Writes without a scope are never retried.
	Retry policy.RetryPolicy
}

// New returns a client for the node at base (e.g. "http://127.0.0.1:7400").
func New(base string, opts *Options) *Client {
	c := &Client{base: strings.TrimRight(base, "/")}
	if opts != nil {
		c.http = opts.HTTPClient
		c.token = opts.Token
		c.retry = opts.Retry
	}
	if c.http == nil {
		c.http = &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second},
		}
	}
	return c
}

// Error is an error answer of the API.
type Error struct {
	Status   int
	Code     string `json:"code"`
	Message  string `json:"message"`
	CanRetry bool   `json:"retryable"`
	// Outcome, on a failed write, is what the server knows of it:
	// "not_written" (nothing was), "unknown" (it may have been), or ""
	// (a refusal: nothing was).
	Outcome string `json:"outcome,omitempty"`
	// Source and Peer are set on saturation refusals.
	Source string `json:"source,omitempty"`
	Peer   string `json:"peer,omitempty"`
	// Loaded, on bulk_failed, is how many records were loaded before it.
	Loaded *int64 `json:"loaded,omitempty"`
	// RetryAfter is the Retry-After header, when present.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("replicator: %d %s: %s", e.Status, e.Code, e.Message)
}

// Retryable reports whether the server said a retry could succeed (it
// implements policy.Retryable, so the default classifier follows it). An
// answer without a JSON body is retryable when it is a 5xx.
func (e *Error) Retryable() bool { return e.CanRetry }

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// WriteResult is the answer to a write.
type WriteResult struct {
	Key     string `json:"key"`
	Version string `json:"version"`
	Origin  string `json:"origin"`
	// Value is a counter's value after an increment.
	Value int64 `json:"value,omitempty"`
	// Replayed is true when the server answered from its idempotency
	// record: an earlier attempt under the same key did the write.
	Replayed bool `json:"-"`
}

// Header names of keyed writes.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
	HeaderAttempt        = "X-Replicator-Attempt"
)

// write sends a mutating request. Under an idempotency scope it carries the
// scope's key and, with a retry policy, is retried on transient failures.
func (c *Client) write(ctx context.Context, method, path string, body []byte, hdr http.Header, out *WriteResult) error {
	k, scoped := policy.KeyFrom(ctx)
	op := func(ctx context.Context) error {
		h := hdr.Clone()
		if h == nil {
			h = http.Header{}
		}
		if scoped {
			h.Set(HeaderIdempotencyKey, k.ID)
			if n := policy.Attempt(ctx); n > 0 {
				h.Set(HeaderAttempt, strconv.Itoa(n))
			}
		}
		rh, err := c.Do(ctx, method, path, body, h, out)
		if err == nil {
			out.Replayed = rh.Get(HeaderReplayed) == "true"
		}
		return err
	}
	maybe := false // some attempt may have written
	attempt := func(ctx context.Context) error {
		err := op(ctx)
		if err != nil && !notWritten(err) {
			maybe = true
		}
		return err
	}
	var err error
	if scoped && c.retry != nil {
		err = c.retry.Execute(ctx, attempt)
	} else {
		err = attempt(ctx)
	}
	if err != nil {
		return &WriteError{Err: err, MayHaveWritten: maybe}
	}
	return nil
}

// WriteError is a failed write, with what is known of its effect over
// every attempt made.
type WriteError struct {
	Err error
	// MayHaveWritten: some attempt may have taken effect (it reached the
	// server and no answer says it did not). False when every attempt was
	// refused, answered "not_written", or never left (no connection).
	MayHaveWritten bool
}

func (e *WriteError) Error() string { return e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// MayHaveWritten reports whether a failed write may have taken effect: true
// unless the server said it did not, or no request reached it. An error
// that is not from a write is taken as unknown.
func MayHaveWritten(err error) bool {
	var we *WriteError
	if errors.As(err, &we) {
		return we.MayHaveWritten
	}
	return err != nil && !notWritten(err)
}

// notWritten reports an attempt that certainly did not write: a refusal
// (4xx), an answer that says so (saturated, not_written), or a request
// that never left (the connection could not be made).
func notWritten(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Status < 500 || e.Outcome == "not_written" || e.Code == "saturated"
	}
	return NotSent(err)
}

// NotSent reports a request that never left: the connection could not be
// made (refused, no route, a name that does not resolve), so the node saw
// nothing of it.
func NotSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// Value is a read value with its version.
type Value struct {
	Value   []byte
	Version string
	Origin  string
	// Expires is when the version expires (zero: never).
	Expires time.Time
}

// Item is one key of a scan page.
type Item struct {
	Key     string `json:"key"`
	Value   []byte `json:"value"`
	Version string `json:"version"`
	Origin  string `json:"origin"`
	// Descends is, for each cluster, the newest version of the key the
	// version's author had seen (its causal context); empty from a node
	// before the conflict log.
	Descends []string `json:"descends,omitempty"`
}

// Page is one scan page; Next resumes after it ("" at the end).
type Page struct {
	Items []Item `json:"items"`
	Next  string `json:"next"`
}

// ScanOptions select a range; see the API.
type ScanOptions struct {
	Prefix, Start, End, After string
	Limit                     int
}

// KeyPath is the API path of key (/v1/kv/...), each segment escaped.
func KeyPath(key string) string { return keyPath(key) }

// CounterPath is the API path of the counter at key (the RESP door's
// follower forwards increments to it).
func CounterPath(key string) string {
	return "/v1/counters/" + strings.TrimPrefix(keyPath(key), "/v1/kv/")
}

func keyPath(key string) string {
	// Escape each segment but keep the slashes: keys are paths in a tree.
	// A key with an empty, '.' or '..' segment is escaped whole (its
	// slashes too), so no proxy or server cleans it into another key.
	parts := strings.Split(key, "/")
	whole := false
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			whole = true
		}
		parts[i] = url.PathEscape(p)
	}
	if whole {
		for i, p := range parts {
			if p == "." || p == ".." {
				parts[i] = strings.ReplaceAll(p, ".", "%2E")
			}
		}
		return "/v1/kv/" + strings.Join(parts, "%2F")
	}
	return "/v1/kv/" + strings.Join(parts, "/")
}

// Do sends a request and decodes a JSON answer into out (when non-nil). It
// is exported for endpoints this client has no method for.
func (c *Client) Do(ctx context.Context, method, path string, body []byte, hdr http.Header, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return resp.Header, decodeError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Header, nil
	}
	if b, ok := out.(*[]byte); ok {
		*b, err = io.ReadAll(resp.Body)
		return resp.Header, err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.Header, fmt.Errorf("replicator: decode %s %s answer: %w", method, path, err)
	}
	return resp.Header, nil
}

func decodeError(resp *http.Response) error {
	e := &Error{Status: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Error *Error `json:"error"`
	}
	if json.Unmarshal(b, &body) == nil && body.Error != nil {
		body.Error.Status = resp.StatusCode
		e = body.Error
	} else {
		e.Code = "http_" + strconv.Itoa(resp.StatusCode)
		e.Message = strings.TrimSpace(string(b))
		e.CanRetry = resp.StatusCode >= 500
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if secs, err := strconv.Atoi(s); err == nil {
			e.RetryAfter = time.Duration(secs) * time.Second
		}
	}
	return e
}

// Put writes value at key.
func (c *Client) Put(ctx context.Context, key string, value []byte) (WriteResult, error) {
	var res WriteResult
	if value == nil {
		value = []byte{}
	}
	err := c.write(ctx, http.MethodPut, keyPath(key), value, nil, &res)
	return res, err
}

// Get reads key.
func (c *Client) Get(ctx context.Context, key string) (Value, error) {
	var b []byte
	h, err := c.Do(ctx, http.MethodGet, keyPath(key), nil, nil, &b)
	if err != nil {
		return Value{}, err
	}
	v := Value{Value: b, Version: strings.Trim(h.Get("ETag"), `"`), Origin: h.Get("X-Replicator-Origin")}
	if x := h.Get("X-Replicator-Expires"); x != "" {
		if v.Expires, err = time.Parse(time.RFC3339Nano, x); err != nil {
			return Value{}, fmt.Errorf("client: get %q: the version's expiry %q: %w", key, x, err)
		}
	}
	return v, nil
}

// Delete deletes key.
func (c *Client) Delete(ctx context.Context, key string) (WriteResult, error) {
	var res WriteResult
	err := c.write(ctx, http.MethodDelete, keyPath(key), nil, nil, &res)
	return res, err
}

// IdempotencyRecord is what a cluster recorded for an Idempotency-Key.
type IdempotencyRecord struct {
	Key     string          `json:"key"`
	Status  int             `json:"status"`
	Body    json.RawMessage `json:"body"`
	Version string          `json:"version"`
	Origin  string          `json:"origin"`
	Expires time.Time       `json:"expires"`
}

// Idempotency looks up the outcome of a keyed request (IsNotFound: this
// cluster has no record of it).
func (c *Client) Idempotency(ctx context.Context, key string) (IdempotencyRecord, error) {
	var r IdempotencyRecord
	_, err := c.Do(ctx, http.MethodGet, "/v1/idempotency/"+url.PathEscape(key), nil, nil, &r)
	return r, err
}

// Scan reads one page of live keys.
func (c *Client) Scan(ctx context.Context, o ScanOptions) (Page, error) {
	q := url.Values{}
	for k, v := range map[string]string{"prefix": o.Prefix, "start": o.Start, "end": o.End, "after": o.After} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	var p Page
	_, err := c.Do(ctx, http.MethodGet, "/v1/kv?"+q.Encode(), nil, nil, &p)
	return p, err
}

// ScanAll pages through the whole range.
func (c *Client) ScanAll(ctx context.Context, o ScanOptions) ([]Item, error) {
	var all []Item
	if o.Limit == 0 {
		o.Limit = 1000
	}
	for {
		p, err := c.Scan(ctx, o)
		if err != nil {
			return all, err
		}
		all = append(all, p.Items...)
		if p.Next == "" || len(p.Items) == 0 {
			return all, nil
		}
		o.After = p.Next
	}
}

// Healthy reports whether /healthz answers 200.
func (c *Client) Healthy(ctx context.Context) error {
	_, err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil)
	return err
}

// Ready reports whether /readyz answers 200; a 503's *Error says why not
// (the body's reason).
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.Do(ctx, http.MethodGet, "/readyz", nil, nil, nil)
	var e *Error
	if errors.As(err, &e) && strings.HasPrefix(e.Code, "http_") {
		var body struct {
			Status string `json:"status"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(e.Message), &body) == nil && body.Reason != "" {
			e.Code, e.Message = body.Status, body.Reason
		}
	}
	return err
}

// WriteOptions are the preconditions of a single-key write, and a put's
// expiry.
type WriteOptions struct {
	IfMatch     string // the version the key must hold
	IfNoneMatch bool   // the key must hold no value
	// TTL, or ExpiresAt, makes the version a put writes expire
	// (docs/DATAMODEL.md "Expiry"); the TTL counts from the node's clock.
	TTL       time.Duration
	ExpiresAt time.Time
}

func (o WriteOptions) header() http.Header {
	h := http.Header{}
	if o.TTL != 0 {
		h.Set("X-Replicator-TTL", o.TTL.String())
	}
	if !o.ExpiresAt.IsZero() {
		h.Set("X-Replicator-Expires", o.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	if o.IfMatch != "" {
		h.Set("If-Match", `"`+o.IfMatch+`"`)
	}
	if o.IfNoneMatch {
		h.Set("If-None-Match", "*")
	}
	return h
}

// PutWith writes value at key under preconditions (a 412 *Error when they
// do not hold).
func (c *Client) PutWith(ctx context.Context, key string, value []byte, o WriteOptions) (WriteResult, error) {
	var res WriteResult
	if value == nil {
		value = []byte{}
	}
	err := c.write(ctx, http.MethodPut, keyPath(key), value, o.header(), &res)
	return res, err
}

// DeleteWith deletes key under preconditions.
func (c *Client) DeleteWith(ctx context.Context, key string, o WriteOptions) (WriteResult, error) {
	var res WriteResult
	err := c.write(ctx, http.MethodDelete, keyPath(key), nil, o.header(), &res)
	return res, err
}

// DeleteRange deletes [start, end) ("" end: to the end of the key space).
func (c *Client) DeleteRange(ctx context.Context, start, end string) (WriteResult, error) {
	q := url.Values{"start": {start}}
	if end != "" {
		q.Set("end", end)
	}
	var res WriteResult
	err := c.write(ctx, http.MethodDelete, "/v1/kv?"+q.Encode(), nil, nil, &res)
	return res, err
}

// DeletePrefix deletes every key with prefix.
func (c *Client) DeletePrefix(ctx context.Context, prefix string) (WriteResult, error) {
	var res WriteResult
	err := c.write(ctx, http.MethodDelete, "/v1/kv?"+url.Values{"prefix": {prefix}}.Encode(), nil, nil, &res)
	return res, err
}

// CounterValue is a counter's state.
type CounterValue struct {
	Key     string `json:"key"`
	Value   int64  `json:"value"`
	Version string `json:"version"`
	Origin  string `json:"origin"`
	Totals  map[string]struct {
		P uint64 `json:"P"`
		N uint64 `json:"N"`
	} `json:"totals"`
	Replayed bool `json:"-"`
}

// Increment adds delta to a PN-counter (negative decrements). Under an
// idempotency scope it is keyed and retried like any write.
func (c *Client) Increment(ctx context.Context, key string, delta int64) (CounterValue, error) {
	var res CounterValue
	body, _ := json.Marshal(map[string]int64{"delta": delta})
	path := CounterPath(key)
	var wr WriteResult
	err := c.write(ctx, http.MethodPost, path, body, http.Header{"Content-Type": {"application/json"}}, &wr)
	if err != nil {
		return res, err
	}
	res.Key, res.Version, res.Origin, res.Replayed = wr.Key, wr.Version, wr.Origin, wr.Replayed
	res.Value = wr.Value
	return res, nil
}

// Counter reads a PN-counter.
func (c *Client) Counter(ctx context.Context, key string) (CounterValue, error) {
	var res CounterValue
	_, err := c.Do(ctx, http.MethodGet, CounterPath(key), nil, nil, &res)
	return res, err
}

// BatchOp is one write of an atomic batch.
type BatchOp struct {
	Op       string  `json:"op"` // "set" or "delete"
	Key      string  `json:"key"`
	Value    *string `json:"value,omitempty"`
	ValueB64 *string `json:"value_b64,omitempty"`
	// TTL (a Go duration, "30s") or Expires (RFC 3339): a set's expiry.
	TTL     string `json:"ttl,omitempty"`
	Expires string `json:"expires,omitempty"`
}

// WithTTL is op expiring ttl after the node takes it (a set's only).
func (op BatchOp) WithTTL(ttl time.Duration) BatchOp { op.TTL = ttl.String(); return op }

// ExpiringAt is op expiring at t (a set's only).
func (op BatchOp) ExpiringAt(t time.Time) BatchOp {
	op.Expires = t.UTC().Format(time.RFC3339Nano)
	return op
}

// SetOp and DeleteOp build batch ops.
func SetOp(key string, value []byte) BatchOp {
	v := base64.StdEncoding.EncodeToString(value)
	return BatchOp{Op: "set", Key: key, ValueB64: &v}
}

func DeleteOp(key string) BatchOp { return BatchOp{Op: "delete", Key: key} }

// Batch applies ops atomically. operationID ("" for none) makes the call
// idempotent: the same id with other ops is refused (422).
func (c *Client) Batch(ctx context.Context, ops []BatchOp, operationID string) (WriteResult, error) {
	body, err := json.Marshal(map[string]any{"ops": ops, "operation_id": operationID})
	if err != nil {
		return WriteResult{}, err
	}
	var res WriteResult
	err = c.write(ctx, http.MethodPost, "/v1/batch", body, http.Header{"Content-Type": {"application/json"}}, &res)
	return res, err
}

// BulkResult is the answer to a bulk load.
type BulkResult struct {
	Loaded  int    `json:"loaded"`
	Batches int    `json:"batches"`
	Version string `json:"last_version"`
}

// Bulk streams records to POST /v1/bulk: NDJSON lines {"key","value"}, or
// CSV rows key,value when csv.
func (c *Client) Bulk(ctx context.Context, r io.Reader, csv bool) (BulkResult, error) {
	ct := "application/x-ndjson"
	if csv {
		ct = "text/csv"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/bulk", r)
	if err != nil {
		return BulkResult{}, err
	}
	req.Header.Set("Content-Type", ct)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := *c.http
	hc.Timeout = 0 // a load takes as long as it takes; ctx bounds it
	resp, err := hc.Do(req)
	if err != nil {
		return BulkResult{}, &WriteError{Err: err, MayHaveWritten: MayHaveWritten(err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		// A load is not atomic: what it says it loaded before failing
		// stays written, whatever the status.
		err := decodeError(resp)
		may := MayHaveWritten(err)
		if e, ok := err.(*Error); ok && e.Loaded != nil {
			may = may || *e.Loaded > 0
		}
		return BulkResult{}, &WriteError{Err: err, MayHaveWritten: may}
	}
	var res BulkResult
	return res, json.NewDecoder(resp.Body).Decode(&res)
}

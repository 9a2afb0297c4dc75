package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/node/httpapi"
)

// Submit queues a RESP connection's write. On the leader (or a node alone)
// it goes to the committer in the connection's order. On a follower it is
// forwarded as the HTTP API's writes are, one hop through the router, when
// the connection waits for it: the writes of a connection are then sent one
// at a time, in order, and one whose pipeline already failed is not sent.
func (r respNode) Submit(ctx context.Context, w api.Write) (func() (api.WriteResult, error), bool) {
	if !r.multi() || r.lead.ready.Load() {
		return r.submitter.Submit(ctx, w), false
	}
	return func() (api.WriteResult, error) {
		if err := ctx.Err(); err != nil {
			return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrNotWritten, err)
		}
		return r.forward(ctx, w)
	}, true
}

// forward sends w through the node's own HTTP handler (no token: this node
// checked the connection's), whose router hands it to the leader.
func (r respNode) forward(ctx context.Context, w api.Write) (api.WriteResult, error) {
	var (
		method, path string
		body         []byte
		hdr          = http.Header{}
	)
	e := w.Entry
	switch {
	case w.Ops != nil:
		ops := make([]client.BatchOp, len(w.Ops))
		for i, op := range w.Ops {
			if op.Delete {
				ops[i] = client.DeleteOp(op.Key)
			} else {
				ops[i] = client.SetOp(op.Key, op.Value)
			}
		}
		method, path = http.MethodPost, "/v1/batch"
		body, _ = json.Marshal(map[string]any{"ops": ops})
		hdr.Set("Content-Type", "application/json")
	case e.Op == entry.OpSet:
		method, path, body = http.MethodPut, client.KeyPath(e.Key), e.Value
	case e.Op == entry.OpDelete:
		method, path = http.MethodDelete, client.KeyPath(e.Key)
	case e.Op == entry.OpCounter:
		method, path = http.MethodPost, client.CounterPath(e.Key)
		body, _ = json.Marshal(map[string]int64{"delta": w.Delta})
		hdr.Set("Content-Type", "application/json")
	default:
		return api.WriteResult{}, fmt.Errorf("%w: op %d is not forwarded", api.ErrBadRequest, e.Op)
	}
	if c := w.Cond; c != nil {
		if c.IfMatch != "" {
			hdr.Set("If-Match", `"`+c.IfMatch+`"`)
		}
		if c.IfNoneMatch {
			hdr.Set("If-None-Match", "*")
		}
	}
	// The connection authenticated with the API token (or none is set).
	req, err := http.NewRequestWithContext(withScope(ctx, httpapi.ScopeAPI), method, path, bytes.NewReader(body))
	if err != nil {
		return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrNotWritten, err)
	}
	req.Header = hdr
	req.RemoteAddr = "resp"
	rec := &bufferedResponse{header: http.Header{}, status: http.StatusOK}
	r.handler.ServeHTTP(rec, req)
	if rec.status != http.StatusOK {
		return api.WriteResult{}, forwardedError(rec)
	}
	var ans struct {
		Key     string `json:"key"`
		Version string `json:"version"`
		Origin  string `json:"origin"`
		Value   int64  `json:"value"`
	}
	if err := json.Unmarshal(rec.body.Bytes(), &ans); err != nil {
		return api.WriteResult{}, fmt.Errorf("%w: the leader's answer: %w", api.ErrUnknownOutcome, err)
	}
	existed, _ := strconv.Atoi(rec.header.Get(httpapi.HeaderExisted))
	// The leader's index of the write and its stream: WAIT here asks the
	// leader which peers hold it.
	index, _ := strconv.ParseUint(rec.header.Get(httpapi.HeaderIndex), 10, 64)
	stream, _ := entry.ParseStreamID(rec.header.Get(httpapi.HeaderStream))
	return api.WriteResult{Key: ans.Key, Version: ans.Version, Origin: ans.Origin, Counter: ans.Value, Existed: existed, Index: index, Stream: stream}, nil
}

// forwardedError is the node's Go error of the HTTP API's answer: the same
// classes RESP answers with (not written, unknown outcome, precondition,
// kind, bad input).
func forwardedError(rec *bufferedResponse) error {
	var ans struct {
		Error client.Error `json:"error"`
	}
	json.Unmarshal(rec.body.Bytes(), &ans)
	e := ans.Error
	msg := fmt.Sprintf("the leader answered %d %s: %s", rec.status, e.Code, e.Message)
	switch {
	case rec.status == http.StatusPreconditionFailed:
		return &api.PreconditionError{Why: msg, Current: strings.Trim(rec.header.Get("ETag"), `"`)}
	case e.Code == "kind_conflict":
		return fmt.Errorf("%w: %s", api.ErrKindConflict, msg)
	case e.Code == "out_of_range":
		return fmt.Errorf("%w: %s", api.ErrCounterRange, msg)
	case e.Outcome == "not_written", e.Code == "saturated":
		return fmt.Errorf("%w: %s", api.ErrNotWritten, msg)
	case rec.status >= 500:
		return fmt.Errorf("%w: %s", api.ErrUnknownOutcome, msg)
	}
	return fmt.Errorf("%w: %s", api.ErrBadRequest, msg)
}

// bufferedResponse keeps an in-process handler's answer.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header         { return b.header }
func (b *bufferedResponse) Write(p []byte) (int, error) { return b.body.Write(p) }
func (b *bufferedResponse) WriteHeader(s int)           { b.status = s }

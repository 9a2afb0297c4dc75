// Package httpjson writes the JSON answers every HTTP surface of the node
// shares, so that all errors have one shape:
//
//	{"error": {"code": "...", "message": "...", "retryable": false, ...}}
package httpjson

import (
	"encoding/json"
	"github.com/replicator/replicator/api"
	"net/http"
	"strconv"
	"time"
)

// Error is the body of every error answer.
type Error struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
	// Source and Peer name the cause of a saturation refusal.
	Source string `json:"source,omitempty"`
	Peer   string `json:"peer,omitempty"`
	// HWM is the receiver's high-water mark on a replication gap refusal.
	HWM *uint64 `json:"hwm,omitempty"`
	// Version is the current version on a precondition failure, and on a
	// 404 or 412 for a deleted key the delete's version (Deleted set)
	// while its tombstone is kept: a client can place the answer in a
	// history.
	Version string `json:"version,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
	// CollectedBelow, on a 404 for a key of which nothing is kept, is the
	// newest cutoff below which tombstones were collected here: a delete
	// of the key, if there was one, was stamped below it.
	CollectedBelow string `json:"collected_below,omitempty"`
	// Outcome, on a failed write, says whether it may have happened:
	// "not_written" (certainly not) or "unknown" (it may have: read it
	// back, or retry under the same Idempotency-Key).
	Outcome string `json:"outcome,omitempty"`
	// Loaded, on a bulk_failed answer, is how many records were loaded
	// before the failure (a load is not atomic: those stay).
	Loaded *int64 `json:"loaded,omitempty"`
	// Limit is the bound a too_large refusal was measured against.
	Limit int64 `json:"limit,omitempty"`
	// Leader and Nodes, on a not_leader refusal, are where the request
	// belongs: the leader's URL (empty while none is known) and every
	// node's of the cluster.
	Leader string   `json:"leader,omitempty"`
	Nodes  []string `json:"nodes,omitempty"`
}

// contentType is shared by every answer: net/http only reads header
// values, and Header.Set would allocate a new slice per answer.
var contentType = []string{"application/json"}

// Write answers status with v as JSON.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header()["Content-Type"] = contentType
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteBody answers status with body, which is JSON already, with its
// Content-Length (net/http then writes head and body in one go).
func WriteBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = contentType
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// WriteError answers status with {"error": e}, its message without the
// product's package prefixes (api.ClientText).
func WriteError(w http.ResponseWriter, status int, e Error) {
	e.Message = api.ClientText(e.Message)
	Write(w, status, map[string]Error{"error": e})
}

// RetryAfter sets the Retry-After header, rounded up to whole seconds.
func RetryAfter(w http.ResponseWriter, d time.Duration) {
	secs := int((d + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	w.Header().Set("Retry-After", strconv.Itoa(secs))
}

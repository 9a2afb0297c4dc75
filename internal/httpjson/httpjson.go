// Package httpjson writes the JSON answers every HTTP surface of the node
// shares, so that all errors have one shape:
//
//	{"error": {"code": "...", "message": "...", "retryable": false, ...}}
package httpjson

import (
	"encoding/json"
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
	// Version is the current version on a precondition failure.
	Version string `json:"version,omitempty"`
	// Limit is the bound a too_large refusal was measured against.
	Limit int64 `json:"limit,omitempty"`
}

// Write answers status with v as JSON.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError answers status with {"error": e}.
func WriteError(w http.ResponseWriter, status int, e Error) {
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

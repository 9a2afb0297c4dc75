// Package api holds the words of node's Go API: the results, reports and
// errors of a node's methods. node implements the API and re-exports these
// names; httpapi serves it over HTTP and maps each error to its answer.
// Keeping them here lets httpapi declare the node it serves as an
// interface, so node can compose the HTTP surface without a cycle.
package api

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/replicator/replicator/machine"
)

// ErrNotACluster refuses a membership action on a node alone in its cluster.
var ErrNotACluster = errors.New("node: not a cluster of several nodes")

var (
	// ErrClosed is returned for writes after shutdown began.
	ErrClosed = errors.New("node: shutting down")
	// ErrUnknownOutcome wraps failures after which a write may or may not
	// have taken effect: the caller must look or retry under the same
	// idempotency key, never assume.
	ErrUnknownOutcome = errors.New("node: outcome unknown")
	// ErrNotWritten wraps failures after which the write certainly did not
	// take effect.
	ErrNotWritten = errors.New("node: not written")
	// ErrIdempotencyConflict refuses a request whose Idempotency-Key was
	// already used by a different request.
	ErrIdempotencyConflict = machine.ErrIdempotencyConflict
	// ErrPinOutOfWindow refuses a write whose pinned stamp is older than the
	// pin window or further ahead than the max clock offset.
	ErrPinOutOfWindow = errors.New("node: pinned stamp outside the pin window")
)

// ErrRemoved refuses every read and write of a node its cluster removed
// (or lost in a recovery): it stays up, answering 503 removed, so that a
// supervisor does not restart it in a loop; its clients go to another node.
var ErrRemoved = errors.New("node: removed from its cluster")

// ErrBadRequest refuses a malformed request (400).
var ErrBadRequest = errors.New("node: bad request")

// ErrRestored refuses to restore a conflict a write already restored (409).
var ErrRestored = errors.New("node: conflict already restored")

// Validation errors of the Go API; the HTTP API maps them to 400 and 413.
var (
	ErrInvalidKey    = errors.New("node: invalid key")
	ErrKeyTooLarge   = errors.New("node: key too large")
	ErrValueTooLarge = errors.New("node: value too large")
	ErrNotFound      = errors.New("node: not found")
	// ErrCatchingUp refuses a local read while the node has not applied
	// what it may have acknowledged before it stopped, or installs the
	// leader's snapshot of the tree (it lagged behind the log).
	ErrCatchingUp = errors.New("node: catching up with the cluster's log; local reads resume once it has")
)

// Condition is a precondition of a single-key write, decided at this cluster
// in commit order.
type Condition = machine.Condition

// The write path's refusals, decided in commit order (package machine).
var (
	// ErrPrecondition refuses a conditional write whose condition does
	// not hold (412); the error is a *PreconditionError.
	ErrPrecondition = machine.ErrPrecondition
	// ErrKindConflict refuses a counter operation on a plain key, or a
	// plain write on a counter key (409).
	ErrKindConflict = machine.ErrKindConflict
	// ErrCounterRange refuses an increment that would take a counter, or
	// its totals, out of the 64-bit range (400, out_of_range).
	ErrCounterRange = machine.ErrCounterRange
)

// PreconditionError carries the key's current version ("" when absent).
type PreconditionError = machine.PreconditionError

// NotFoundError is a read of a key that holds no live value. It says what
// this node knows of why, so that a client can place the answer in a
// history: the delete's version while its tombstone is kept, or the cutoff
// below which tombstones were collected.
type NotFoundError struct {
	Key string
	// Deleted is the version of the delete the key holds ("" when none is
	// kept).
	Deleted string
	// CollectedBelow: nothing is kept of the key, and tombstones stamped
	// below this were collected ("" when none ever was: the key was never
	// written here).
	CollectedBelow string
}

func (e *NotFoundError) Error() string {
	switch {
	case e.Deleted != "":
		return fmt.Sprintf("node: not found: %q was deleted at version %s", e.Key, e.Deleted)
	case e.CollectedBelow != "":
		return fmt.Sprintf("node: not found: %q holds nothing (never written, or deleted below %s, where deletes were collected)", e.Key, e.CollectedBelow)
	}
	return fmt.Sprintf("node: not found: %q holds no value and no tombstone here", e.Key)
}

func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// ErrSaturated is the class of refusals of a local write while the node is
// saturated. Test with errors.Is; *SaturatedError carries the source.
var ErrSaturated = errors.New("node: saturated")

// SaturatedError refuses a local write: nothing was written.
type SaturatedError struct {
	Source string // acceptor.SourceOutboundBacklog
	Peer   string
	Cause  string
	Waited time.Duration
}

func (e *SaturatedError) Error() string {
	return fmt.Sprintf("node: saturated (%s, peer %s): %s; refused after waiting %s, nothing was written", e.Source, e.Peer, e.Cause, e.Waited)
}

// Is: a saturated refusal is of its own class and, as its message says, a
// write not written (RESP answers NOTWRITTEN and ends the pipeline).
func (e *SaturatedError) Is(target error) bool {
	return target == ErrSaturated || target == ErrNotWritten
}

// CheckKey refuses a key no node takes: empty, over max bytes, or not
// UTF-8. (A node also refuses keys its peers would refuse.)
func CheckKey(key string, max int) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > max:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLarge, len(key), max)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	return nil
}

// PrefixRange is the [start, end) of every key with prefix.
func PrefixRange(prefix string) (string, string) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return prefix, string(b[:i+1])
		}
	}
	return prefix, ""
}

package api

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
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
	// already used by a different request (422).
	ErrIdempotencyConflict = errors.New("machine: idempotency key reused for a different request")
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

// Condition is a precondition of a write (HTTP If-Match, If-None-Match;
// a RESP transaction's reads and WATCH), decided in commit order. It is a
// local decision: what replicates is the resulting write; it is not a lock
// across clusters (docs/DATAMODEL.md).
type Condition struct {
	// IfMatch: the key must hold exactly this version ("" = no condition).
	IfMatch string
	// IfNoneMatch: the key must hold no live value (get-or-set).
	IfNoneMatch bool
	// Keys: each key must hold exactly the version given, written or not
	// by the batch (batches only; from command format 10). All hold, or
	// nothing of the batch is written.
	Keys []KeyVersion
}

// KeyVersion is a key and the version it must hold: its live value's, else
// its counter's, or "" for a key that holds neither.
type KeyVersion struct {
	Key     string
	Version string
}

// MaxConditionKeys bounds the keys one write's condition names.
const MaxConditionKeys = 1 << 14

// The write path's refusals, decided in commit order (package machine
// decides them; the messages keep its prefix, as callers have seen them).
var (
	// ErrPrecondition refuses a conditional write whose condition does
	// not hold (412); the error is a *PreconditionError.
	ErrPrecondition = errors.New("machine: precondition failed")
	// ErrKindConflict refuses a counter operation on a plain key, or a
	// plain write on a counter key (409).
	ErrKindConflict = errors.New("machine: key holds another kind")
	// ErrCounterRange refuses an increment that would take a counter, or
	// its totals, out of the 64-bit range (400, out_of_range).
	ErrCounterRange = errors.New("machine: counter out of range")
	// ErrNotInteger refuses an increment of a key whose value is not an
	// integer (409, not_integer).
	ErrNotInteger = errors.New("value is not an integer")
)

// PreconditionError carries the key's current version ("" when absent),
// and the delete's version when the key holds a tombstone.
type PreconditionError struct {
	Key     string
	Current string
	Deleted string
	Why     string
}

func (e *PreconditionError) Error() string {
	return fmt.Sprintf("machine: precondition failed on %q: %s", e.Key, e.Why)
}

func (e *PreconditionError) Is(target error) bool { return target == ErrPrecondition }

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
	// Expired is the version the key holds, which expired.
	Expired string
}

func (e *NotFoundError) Error() string {
	switch {
	case e.Deleted != "":
		return fmt.Sprintf("node: not found: %q was deleted at version %s", e.Key, e.Deleted)
	case e.Expired != "":
		return fmt.Sprintf("node: not found: %q holds version %s, which expired", e.Key, e.Expired)
	case e.CollectedBelow != "":
		return fmt.Sprintf("node: not found: %q holds nothing (never written, or deleted below %s, where deletes were collected)", e.Key, e.CollectedBelow)
	}
	return fmt.Sprintf("node: not found: %q holds no value and no tombstone here", e.Key)
}

func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// ErrCrossGroup is the class of refusals of an atomic write (a batch, a
// RESP transaction, MSET) whose keys fall in more than one of the
// cluster's raft groups (issue 51, docs/CLUSTER.md "Writes"): nothing was
// written. Keys that share a hash tag ({...}) share a slot, and so a group.
var ErrCrossGroup = errors.New("node: an atomic write across raft groups")

// CrossGroupError names the groups an atomic write's keys fall in, and a
// key of each.
type CrossGroupError struct {
	Groups []int
	Keys   []string // Keys[i] is a key of Groups[i]
}

func (e *CrossGroupError) Error() string {
	var b strings.Builder
	for i, g := range e.Groups {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q in group %d", e.Keys[i], g)
	}
	return fmt.Sprintf("node: an atomic write across raft groups (%s); nothing was written: keys that share a hash tag ({...}) share a group", b.String())
}

// Is: a write across groups is of its own class, and not written.
func (e *CrossGroupError) Is(target error) bool {
	return target == ErrCrossGroup || target == ErrNotWritten
}

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

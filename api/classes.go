package api

import (
	"errors"
	"time"
)

// The error classes of a write, by name: what crosses a hop between two
// nodes of a cluster (package forward) is the class and the message, never
// an HTTP status or an error code to parse back. The order matters: the
// first class an error is of names it (a removed node's refusal is also
// not written; a saturated refusal is also not written).
var classes = []struct {
	name string
	err  error
}{
	{"removed", ErrRemoved},
	{"saturated", ErrSaturated},
	{"precondition", ErrPrecondition},
	{"kind_conflict", ErrKindConflict},
	{"restored", ErrRestored},
	{"invalid_key", ErrInvalidKey},
	{"key_too_large", ErrKeyTooLarge},
	{"value_too_large", ErrValueTooLarge},
	{"counter_range", ErrCounterRange},
	{"not_integer", ErrNotInteger},
	{"bad_request", ErrBadRequest},
	{"idempotency_conflict", ErrIdempotencyConflict},
	{"pin_out_of_window", ErrPinOutOfWindow},
	{"not_found", ErrNotFound},
	{"unknown_outcome", ErrUnknownOutcome},
	{"closed", ErrClosed},
	{"catching_up", ErrCatchingUp},
	{"cross_group", ErrCrossGroup},
	{"not_leader", ErrNotLeader},
	{"not_written", ErrNotWritten},
}

// ClassInternal names an error of no class: its outcome is not known.
const ClassInternal = "internal"

// ClassOf names err's class (ClassInternal when it is of none).
func ClassOf(err error) string {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return ClassInternal
}

// ClassError is the error a class names (nil for an unknown name).
func ClassError(name string) error {
	for _, c := range classes {
		if c.name == name {
			return c.err
		}
	}
	return nil
}

// RemoteError is an error another node answered, rebuilt from its class:
// errors.Is matches the class, and ErrNotWritten when the answering node
// said nothing was written. An error of no class (or of a class this build
// does not know) is an unknown outcome: the write may have happened.
type RemoteError struct {
	Class      string
	NotWritten bool
	Message    string
}

func (e *RemoteError) Error() string { return e.Message }

// Is matches the class, ErrNotWritten when nothing was written, and
// ErrUnknownOutcome for an error of no known class.
func (e *RemoteError) Is(target error) bool {
	c := ClassError(e.Class)
	switch {
	case c == nil:
		return target == ErrUnknownOutcome
	case target == c:
		return true
	case e.NotWritten && target == ErrNotWritten:
		return true
	}
	return errors.Is(c, target)
}

// RemoteFailure is an error as it crosses between nodes: its class, whether
// nothing was written, its message, and what the precondition and
// saturation classes carry (the key's version, the refusal's source).
type RemoteFailure struct {
	Class      string `msgpack:"class"`
	NotWritten bool   `msgpack:"nw,omitempty"`
	Message    string `msgpack:"msg"`
	// A precondition's key, current version, delete and why.
	Key     string `msgpack:"key,omitempty"`
	Why     string `msgpack:"why,omitempty"`
	Current string `msgpack:"cur,omitempty"`
	Deleted string `msgpack:"del,omitempty"`
	// A saturated refusal's source, peer, cause and wait.
	Source string        `msgpack:"src,omitempty"`
	Peer   string        `msgpack:"peer,omitempty"`
	Cause  string        `msgpack:"cause,omitempty"`
	Waited time.Duration `msgpack:"waited,omitempty"`
}

// FailureOf describes err for another node.
func FailureOf(err error) *RemoteFailure {
	f := &RemoteFailure{Class: ClassOf(err), NotWritten: errors.Is(err, ErrNotWritten), Message: err.Error()}
	var pe *PreconditionError
	var se *SaturatedError
	switch {
	case errors.As(err, &pe):
		f.Key, f.Current, f.Deleted, f.Why = pe.Key, pe.Current, pe.Deleted, pe.Why
	case errors.As(err, &se):
		f.Source, f.Peer, f.Cause, f.Waited = se.Source, se.Peer, se.Cause, se.Waited
	}
	return f
}

// Err rebuilds the error f describes, of the same class: a precondition is
// a *PreconditionError and a saturated refusal a *SaturatedError again.
func (f *RemoteFailure) Err() error {
	switch f.Class {
	case "precondition":
		return &PreconditionError{Key: f.Key, Current: f.Current, Deleted: f.Deleted, Why: f.Why}
	case "saturated":
		return &SaturatedError{Source: f.Source, Peer: f.Peer, Cause: f.Cause, Waited: f.Waited}
	}
	return &RemoteError{Class: f.Class, NotWritten: f.NotWritten, Message: f.Message}
}

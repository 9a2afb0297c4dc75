package acceptor

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/wire"
)

// Refusal classes; every refusal wraps one, and the HTTP status follows it.
var (
	ErrUnauthenticated = errors.New("acceptor: unauthenticated")
	ErrForbidden       = errors.New("acceptor: forbidden")
	ErrBadBatch        = errors.New("acceptor: bad batch")
	ErrTooLarge        = errors.New("acceptor: batch too large")
	ErrClockOffset     = errors.New("acceptor: stamp beyond the max clock offset")
	// ErrEncoding refuses a body in an encoding this node does not decode
	// (415; the answer's HeaderAcceptEncoding says which it does).
	ErrEncoding = errors.New("acceptor: unsupported body encoding")
)

// GapError refuses a batch that does not continue the stream: the sender
// must rewind to HWM and resend from HWM+1 (decided by the state machine).
type GapError = wire.GapError

// ConflictError refuses a batch whose entry at this node's high-water mark
// was committed at another HLC than the one applied here.
type ConflictError = wire.ConflictError

// ErrNotLeader refuses a batch sent to a node that does not lead its
// cluster (NotLeaderError names the one that does).
var ErrNotLeader = errors.New("acceptor: this node does not lead its cluster")

// NotLeaderError is ErrNotLeader with where to go instead.
type NotLeaderError struct {
	Leader string   // the leader's replicate URL ("" while none is known)
	Nodes  []string // every node's
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return ErrNotLeader.Error() + ", and no leader is known yet"
	}
	return ErrNotLeader.Error() + "; the leader is at " + e.Leader
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// refuseUnread refuses a request whose body was not (wholly) read: the
// connection closes after the answer instead of draining the body at the
// sender's pace.
func (a *Acceptor) refuseUnread(w http.ResponseWriter, sender string, err error) {
	w.Header().Set("Connection", "close")
	a.refuse(w, sender, err)
}

func (a *Acceptor) refuse(w http.ResponseWriter, sender string, err error) {
	e := httpjson.Error{Message: err.Error()}
	var status int
	var gap *GapError
	var conflict *ConflictError
	var nl *NotLeaderError
	switch {
	case errors.As(err, &nl):
		status, e.Code, e.Retryable, e.Leader, e.Nodes = http.StatusServiceUnavailable, "not_leader", true, nl.Leader, nl.Nodes
		httpjson.RetryAfter(w, time.Second)
	case errors.Is(err, ErrNoPermit):
		status, e.Code, e.Source, e.Retryable = http.StatusTooManyRequests, "saturated", SourceReplayPermit, true
		httpjson.RetryAfter(w, time.Second)
		a.refusals.permit.Add(1)
	case errors.As(err, &gap):
		status, e.Code, e.HWM, e.Retryable = http.StatusConflict, "gap", &gap.HWM, true
		a.refusals.gap.Add(1)
	case errors.As(err, &conflict):
		status, e.Code, e.HWM, e.Version = http.StatusConflict, "identity_conflict", &conflict.HWM, conflict.HWMCommit.String()
		a.refusals.conflict.Add(1)
	case errors.Is(err, ErrUnauthenticated):
		status, e.Code = http.StatusUnauthorized, "unauthenticated"
		a.refusals.unauthenticated.Add(1)
	case errors.Is(err, ErrForbidden):
		status, e.Code = http.StatusForbidden, "forbidden"
		a.refusals.forbidden.Add(1)
	case errors.Is(err, ErrTooLarge):
		status, e.Code, e.Limit = http.StatusRequestEntityTooLarge, "too_large", a.opts.MaxBodyBytes
		a.refusals.tooLarge.Add(1)
	case errors.Is(err, ErrClockOffset):
		status, e.Code, e.Retryable = http.StatusBadRequest, "clock_offset", true
		a.refusals.offset.Add(1)
	case errors.Is(err, ErrEncoding):
		status, e.Code = http.StatusUnsupportedMediaType, "unsupported_encoding"
		a.refusals.bad.Add(1)
	case errors.Is(err, ErrBadBatch):
		status, e.Code = http.StatusBadRequest, "bad_batch"
		if errors.Is(err, wire.ErrVersion) {
			e.Code = "unsupported_version"
		}
		a.refusals.bad.Add(1)
	default:
		status, e.Code, e.Retryable = http.StatusInternalServerError, "internal", true
	}
	if sender != "" {
		a.mu.Lock()
		a.countsLocked(sender).Refused++
		a.mu.Unlock()
	}
	if (status != http.StatusConflict || conflict != nil) && status != http.StatusTooManyRequests && nl == nil {
		if n, ok := a.logs.allow(sender, a.opts.Now()); ok {
			a.opts.Logger.Warn("replicate: batch refused", "sender", sender, "status", status, "err", err, "unlogged_since", n)
		}
	}
	httpjson.WriteError(w, status, e)
}

// Refusals returns refusal counts by reason.
func (a *Acceptor) Refusals() map[string]uint64 {
	return map[string]uint64{
		"unauthenticated":   a.refusals.unauthenticated.Load(),
		"forbidden":         a.refusals.forbidden.Load(),
		"bad_batch":         a.refusals.bad.Load(),
		"too_large":         a.refusals.tooLarge.Load(),
		"clock_offset":      a.refusals.offset.Load(),
		"gap":               a.refusals.gap.Load(),
		"no_permit":         a.refusals.permit.Load(),
		"identity_conflict": a.refusals.conflict.Load(),
	}
}

// refusalLogs bounds the WARN lines of refused requests: one per sender
// per logEvery, saying how many went unlogged since (each is counted in
// the metrics all the same). A hostile or broken peer must not fill the
// disk with log lines.
type refusalLogs struct {
	mu   sync.Mutex
	last map[string]refusalLog
}

type refusalLog struct {
	at       int64 // unix nanoseconds of the last line
	unlogged int
}

// logEvery is the least time between two refusal lines of one sender.
const logEvery = int64(10 * time.Second)

// allow reports whether a refusal of sender at now is logged, and how many
// went unlogged before it.
func (l *refusalLogs) allow(sender string, now int64) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]refusalLog{}
	}
	if len(l.last) > 1024 {
		clear(l.last) // senders that are not peers: forget them all
	}
	r, seen := l.last[sender]
	if seen && now-r.at < logEvery {
		r.unlogged++
		l.last[sender] = r
		return 0, false
	}
	l.last[sender] = refusalLog{at: now}
	return r.unlogged, true
}

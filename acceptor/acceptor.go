// Package acceptor takes replication batches from peers: it authenticates
// the sender, bounds and decodes the body, drops every entry it already
// applied by the entry's WAL identity, merges the rest last-writer-wins and
// raises the stream's high-water mark in one synced Pebble batch, then acks.
//
// The transport is at-least-once; the acceptor makes the apply at-most-once:
// a retried, duplicated or re-shipped batch changes nothing the second time.
package acceptor

import (
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/httpjson"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Store is what the acceptor needs of the tree.
type Store interface {
	NewBatch() *store.Batch
}

// Clock is what the acceptor needs of the hybrid logical clock.
type Clock interface {
	CheckOffset(hlc.Timestamp) error
	Observe(hlc.Timestamp)
	Last() hlc.Timestamp
}

// Refusal classes; every refusal wraps one, and the HTTP status follows it.
var (
	ErrUnauthenticated = errors.New("acceptor: unauthenticated")
	ErrForbidden       = errors.New("acceptor: forbidden")
	ErrBadBatch        = errors.New("acceptor: bad batch")
	ErrTooLarge        = errors.New("acceptor: batch too large")
	ErrClockOffset     = errors.New("acceptor: stamp beyond the max clock offset")
)

// GapError refuses a batch that does not continue the stream: the sender
// must rewind to HWM and resend from HWM+1 (decided by the state machine).
type GapError = machine.GapError

// ConflictError refuses a batch whose entry at this node's high-water mark
// was committed at another HLC than the one applied here.
type ConflictError = machine.ConflictError

// Log commits an admitted batch through the cluster's log and returns what
// the state machine decided of it (the node's group; machine.Direct in
// tests). raw is the batch as it arrived (nil: encoded again).
type Log interface {
	ApplyInbound(in *machine.Inbound, raw []byte) (*machine.InboundResult, error)
	// UpdateRecord changes a peer's record (machine.RecordReseed: the
	// re-seed request flags) to f of what it holds, returning what it held.
	UpdateRecord(peer string, record byte, f func(byte) byte) (byte, error)
}

// Defaults of Options.Permits and Options.PermitQueue.
const (
	DefaultPermits     = 4
	DefaultPermitQueue = 16
)

// Options configures an Acceptor.
type Options struct {
	// Local is this node's cluster ID. Entries of this origin are dropped.
	Local string
	// Secrets maps each peer cluster to the shared secret it authenticates
	// with. A sender not in the map is refused.
	Secrets map[string]string
	// Insecure accepts peers without a secret (their header alone names
	// them). For tests and closed networks only; --insecure-peers.
	Insecure bool
	// CertCluster resolves the cluster named by a verified client
	// certificate (mutual TLS); presented is false without one. A verified
	// certificate authenticates the sender instead of its secret.
	CertCluster func(*tls.ConnectionState) (cluster string, presented bool, err error)
	// MaxBodyBytes bounds a batch before decoding. Default 16 MiB.
	MaxBodyBytes int64
	// MaxKeyBytes and MaxValueBytes bound each entry, as for local writes.
	MaxKeyBytes, MaxValueBytes int
	// PinWindow bounds how far an entry's LWW stamp may lie behind its
	// commit HLC (0: unchecked).
	PinWindow time.Duration
	// ObserveLag, when set, is told the replication lag of each entry a
	// batch applied, once per batch: the local physical clock at apply minus
	// the entry's commit HLC, and its stages when the sender said when it
	// sent the batch.
	ObserveLag func(origin string, lags []Lag)
	// ObserveApply, when set, is told how long each applied batch took.
	ObserveApply func(d time.Duration)
	// Now reads the physical clock (nanoseconds) for ObserveLag and acks.
	Now func() int64
	// Version is this build's version, told to senders in every ack.
	Version string
	// Permits bounds the batches applied at once (default 4); PermitQueue
	// bounds the batches waiting for a permit (default 16) and PermitWait
	// how long one waits (default 2s). Past those a batch is refused with
	// 429, source replay_permit_admission, and the sender retries.
	Permits     int
	PermitQueue int
	PermitWait  time.Duration
	// MaxStreams bounds the streams of one peer cluster this node keeps a
	// high-water mark for (default 4096): a peer cannot grow this node's
	// state by inventing streams. A cluster begins a new stream only when
	// it loses data (and each re-seed uses one, forgotten at its end).
	MaxStreams int
	// MaxBodies bounds the batches being read at once (default 16): with
	// MaxBodyBytes, the acceptor's memory bound, whatever the number of
	// peers or their pace. Each sender reads at most a quarter of them.
	MaxBodies int
	// OnReseedRequest, when set, is told that a peer asked for a re-seed
	// (owed true: it lost its data) or no longer needs one (false); the
	// store already says so.
	OnReseedRequest func(sender string, owed bool)
	// OnTrailer, when set, is told that a re-seed from sender ended here:
	// requested says it was one this node asked for (its rejoin moves on),
	// rejoin that it ended the sender's own rejoin.
	OnTrailer func(sender string, requested, rejoin bool)
	// Leadership, when set (a cluster of several nodes), says whether this
	// node takes batches now: only the leader does. A follower refuses an
	// authenticated batch unread with 503 not_leader naming the leader's
	// replicate URL and every node's, and the sender follows.
	Leadership func() (leading bool, leader string, nodes []string)
	// Nodes, when set, lists the replicate URLs of every node of this
	// cluster in each ack, so that senders fail over without
	// configuration.
	Nodes  func() []string
	Logger *slog.Logger
}

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

// Saturation sources of a refusal. Values appear in error bodies and
// metrics; never rename them.
const (
	SourceReplayPermit    = "replay_permit_admission"
	SourceOutboundBacklog = "outbound_backlog"
)

// ErrNoPermit refuses a batch when every replay permit is taken and the
// wait queue is full (or the wait ran out).
var ErrNoPermit = errors.New("acceptor: no replay permit free")

// PermitStats describe the replay permits.
type PermitStats struct {
	Capacity int    `json:"capacity"`
	InUse    int    `json:"in_use"`
	Queued   int    `json:"queued"`
	QueueCap int    `json:"queue_capacity"`
	Refused  uint64 `json:"refused"`
	State    string `json:"state"` // healthy, throttled, saturated
}

// Counts are the acceptor's outcome counters, per origin cluster.
type Counts struct {
	Batches    uint64 `json:"batches"`
	Applied    uint64 `json:"applied"`    // newly applied and won LWW
	Stale      uint64 `json:"stale"`      // newly applied, lost LWW
	Duplicates uint64 `json:"duplicates"` // already applied (hwm or equal stamp)
	DroppedOwn uint64 `json:"dropped_own"`
	Refused    uint64 `json:"refused"`
	// DeadLettered entries broke this node's limits and were set aside.
	DeadLettered uint64 `json:"dead_lettered"`
	// DroppedUnknown are snapshot entries of clusters this node does not
	// know, not taken.
	DroppedUnknown uint64 `json:"dropped_unknown"`
}

// Acceptor serves POST /v1/replicate. Safe for concurrent use.
type Acceptor struct {
	opts  Options
	store Store
	log   Log
	clock Clock

	mu struct {
		sync.Mutex
		counts    map[string]*Counts
		secrets   map[string]string
		permitsOf map[string]int // permits held per sender
		bodies    int            // bodies being read
		bodiesOf  map[string]int // per sender
		// arrivals are each sender's requests in progress: a batch that
		// finds a gap waits for them to move (a shipper keeps up to two
		// batches of a stream on the wire).
		arrivals map[string]*arrivals
	}
	refusals struct {
		unauthenticated, forbidden, bad, tooLarge, offset, gap, permit, conflict atomic.Uint64
	}
	permits chan struct{}
	queued  atomic.Int32
}

// New returns an acceptor that reads st and applies batches through log.
func New(st Store, log Log, clock Clock, opts Options) *Acceptor {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 16 << 20
	}
	if opts.MaxKeyBytes <= 0 {
		opts.MaxKeyBytes = 4096
	}
	if opts.MaxValueBytes <= 0 {
		opts.MaxValueBytes = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Permits <= 0 {
		opts.Permits = DefaultPermits
	}
	if opts.PermitQueue <= 0 {
		opts.PermitQueue = DefaultPermitQueue
	}
	if opts.PermitWait <= 0 {
		opts.PermitWait = 2 * time.Second
	}
	if opts.MaxBodies <= 0 {
		opts.MaxBodies = 16
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = 4096
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return time.Now().UnixNano() }
	}
	a := &Acceptor{opts: opts, store: st, log: log, clock: clock, permits: make(chan struct{}, opts.Permits)}
	a.mu.counts = map[string]*Counts{}
	a.mu.secrets = map[string]string{}
	a.mu.permitsOf = map[string]int{}
	a.mu.bodiesOf = map[string]int{}
	a.mu.arrivals = map[string]*arrivals{}
	for k, v := range opts.Secrets {
		a.mu.secrets[k] = v
	}
	return a
}

// Peers lists every cluster this acceptor takes writes from, with or
// without a link back to it.
func (a *Acceptor) Peers() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.mu.secrets))
	for k := range a.mu.secrets {
		out = append(out, k)
	}
	return out
}

// Limits are what this acceptor takes, as acks tell senders.
func (a *Acceptor) Limits() wire.Limits {
	// Two batches of a sender on the wire need two of its permits and two
	// of its body slots; a batch that arrives before the one it follows
	// waits for it (awaitSender) instead of being refused as a gap.
	pipe := min(max(1, a.opts.Permits/2), max(1, a.opts.MaxBodies/4), 2)
	return wire.Limits{MaxBody: a.opts.MaxBodyBytes, MaxKey: a.opts.MaxKeyBytes, MaxValue: a.opts.MaxValueBytes, Pipeline: pipe}
}

// SetPeer allows (or updates) a peer cluster and its secret: peers found by
// gossip whose secret is configured.
func (a *Acceptor) SetPeer(cluster, secret string) {
	a.mu.Lock()
	a.mu.secrets[cluster] = secret
	a.mu.Unlock()
}

// Counts returns a copy of the per-origin counters.
func (a *Acceptor) Counts() map[string]Counts {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]Counts, len(a.mu.counts))
	for k, v := range a.mu.counts {
		out[k] = *v
	}
	return out
}

// REQUIRES: a.mu held.
func (a *Acceptor) countsLocked(origin string) *Counts {
	c := a.mu.counts[origin]
	if c == nil {
		c = &Counts{}
		a.mu.counts[origin] = c
	}
	return c
}

// authenticate resolves the sender's cluster from its credentials, never
// from the body.
func (a *Acceptor) authenticate(r *http.Request) (string, error) {
	sender := r.Header.Get(wire.HeaderOrigin)
	if sender == "" {
		return "", fmt.Errorf("%w: no %s header", ErrUnauthenticated, wire.HeaderOrigin)
	}
	a.mu.Lock()
	secret, known := a.mu.secrets[sender]
	a.mu.Unlock()
	if a.opts.CertCluster != nil {
		certID, presented, err := a.opts.CertCluster(r.TLS)
		switch {
		case presented && err != nil:
			return "", fmt.Errorf("%w: client certificate: %v", ErrUnauthenticated, err)
		case presented && certID != sender:
			return "", fmt.Errorf("%w: the client certificate is for cluster %q, the request claims %q", ErrForbidden, certID, sender)
		case presented && !known:
			return "", fmt.Errorf("%w: %q is not a configured peer", ErrUnauthenticated, sender)
		case presented:
			return sender, nil
		}
	}
	if !known {
		return "", fmt.Errorf("%w: %q is not a configured peer", ErrUnauthenticated, sender)
	}
	if secret == "" && a.opts.Insecure {
		return sender, nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", fmt.Errorf("%w: no bearer credential for %q", ErrUnauthenticated, sender)
	}
	if secret == "" || subtle.ConstantTimeCompare([]byte(token), []byte(secret)) != 1 {
		return "", fmt.Errorf("%w: wrong credential for %q", ErrUnauthenticated, sender)
	}
	return sender, nil
}

// ServeHTTP implements POST /v1/replicate: authenticate, bound, read the
// body (within a slot of the bounded body budget), decode, and only then
// take a replay permit to apply. A slow body holds a body slot, never a
// permit, and no peer holds more than its share of either.
func (a *Acceptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == wire.PathProve {
		a.ServeProve(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		w.Header().Set("Connection", "close")
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.Error{Code: "method_not_allowed", Message: "POST a msgpack batch"})
		return
	}
	sender, err := a.authenticate(r)
	if err != nil {
		a.refuseUnread(w, "", err)
		return
	}
	if nonce := r.Header.Get(wire.HeaderNonce); nonce != "" {
		// Every answer to an authenticated post says it came from a
		// holder of the secret (transport/proof.go).
		if secret := a.secretOf(sender); secret != "" && wire.ValidNonce(nonce) {
			mw := &macWriter{ResponseWriter: w, secret: secret, nonce: nonce}
			defer mw.finish()
			w = mw
		}
	}
	if a.opts.Leadership != nil {
		if leading, leader, nodes := a.opts.Leadership(); !leading {
			a.refuseUnread(w, sender, &NotLeaderError{Leader: leader, Nodes: nodes})
			return
		}
	}
	left := a.arrive(sender)
	defer left()
	if ct := r.Header.Get("Content-Type"); ct != "" && ct != wire.ContentType {
		a.refuseUnread(w, sender, fmt.Errorf("%w: content type %q, want %s", ErrBadBatch, ct, wire.ContentType))
		return
	}
	if r.ContentLength > a.opts.MaxBodyBytes {
		a.refuseUnread(w, sender, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, r.ContentLength, a.opts.MaxBodyBytes))
		return
	}
	release, err := a.bodySlot(sender)
	if err != nil {
		a.refuseUnread(w, sender, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.opts.MaxBodyBytes))
	release()
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, a.opts.MaxBodyBytes)
		} else {
			err = fmt.Errorf("%w: reading the body: %v", ErrBadBatch, err)
		}
		a.refuseUnread(w, sender, err)
		return
	}
	b, err := wire.DecodeBatch(body)
	if err != nil {
		a.refuse(w, sender, fmt.Errorf("%w: %w", ErrBadBatch, err))
		return
	}
	if a.opts.Now != nil {
		b.ReceivedAt = a.opts.Now()
		b.SentAt, _ = strconv.ParseInt(r.Header.Get(wire.HeaderSent), 10, 64)
	}
	done, err := a.acquire(r, sender)
	if err != nil {
		a.refuse(w, sender, err)
		return
	}
	defer done()
	// start is the last attempt's: a wait for the batch before this one
	// is neither the apply's time (metrics) nor the receiver's share of
	// the round trip (apply_us, which opens the sender's window).
	moved := a.movedOf(sender)
	start := time.Now()
	ack, err := a.Apply(sender, b)
	for deadline := time.Now().Add(a.opts.PermitWait); ; {
		// A gap may be the batch before this one still on its way (sent
		// on another connection, being read, or waiting for a permit):
		// decide again each time the sender's requests move.
		var gap *GapError
		if !errors.As(err, &gap) {
			break
		}
		var again bool
		if moved, again = a.awaitSender(r, sender, moved, deadline); !again {
			break
		}
		start = time.Now()
		ack, err = a.Apply(sender, b)
	}
	if err == nil {
		took := time.Since(start)
		a.senderMoved(sender)
		ack.ApplyMicros = max(1, took.Microseconds())
		if a.opts.ObserveApply != nil {
			a.opts.ObserveApply(took)
		}
	}
	if err != nil {
		a.refuse(w, sender, err)
		return
	}
	if a.opts.Nodes != nil {
		ack.Nodes = a.opts.Nodes()
	}
	httpjson.Write(w, http.StatusOK, ack)
}

// arrivals are one sender's requests in progress.
type arrivals struct {
	active  int
	waiting int // of them, batches waiting in awaitSender
	// moved is closed (and replaced) when one of the sender's requests
	// arrives, ends or applies.
	moved chan struct{}
}

// gapGrace is how long a batch that finds a gap, with none of its sender's
// other requests in progress (or all of them waiting too), waits for the
// one before it to arrive: a sender keeps two batches on the wire, and on
// two connections the second can arrive first.
const gapGrace = 100 * time.Millisecond

// arrive counts a request of sender in; left counts it out.
func (a *Acceptor) arrive(sender string) (left func()) {
	a.mu.Lock()
	ar := a.mu.arrivals[sender]
	if ar == nil {
		ar = &arrivals{moved: make(chan struct{})}
		a.mu.arrivals[sender] = ar
	}
	ar.active++
	a.movedLocked(ar)
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		ar.active--
		a.movedLocked(ar)
		if ar.active == 0 {
			delete(a.mu.arrivals, sender)
		}
	}
}

func (a *Acceptor) movedLocked(ar *arrivals) {
	close(ar.moved)
	ar.moved = make(chan struct{})
}

// movedOf is the sender's current moved channel (nil if none in progress).
func (a *Acceptor) movedOf(sender string) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ar := a.mu.arrivals[sender]; ar != nil {
		return ar.moved
	}
	return nil
}

// senderMoved tells waiting batches of sender that one of its batches
// applied.
func (a *Acceptor) senderMoved(sender string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ar := a.mu.arrivals[sender]; ar != nil {
		a.movedLocked(ar)
	}
}

// awaitSender is for a batch that found a gap: it returns at once if the
// sender's requests moved since before that attempt (moved, taken then, is
// closed), else it waits until they move. With none of the sender's other
// requests in progress, or all of them waiting too, it waits at most
// gapGrace: nothing else will fill the gap, and a real one is refused
// soon. It never waits past deadline nor the request's life, and it reports
// whether to try again, with the channel to wait on next.
func (a *Acceptor) awaitSender(r *http.Request, sender string, moved chan struct{}, deadline time.Time) (chan struct{}, bool) {
	a.mu.Lock()
	ar := a.mu.arrivals[sender]
	if ar == nil || moved == nil {
		a.mu.Unlock()
		return nil, false
	}
	others := ar.active-ar.waiting-1 > 0
	ar.waiting++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		ar.waiting--
		a.mu.Unlock()
	}()
	wait := time.Until(deadline)
	if !others {
		wait = min(wait, gapGrace)
	}
	if wait <= 0 {
		return nil, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-moved:
		return a.movedOf(sender), true
	case <-t.C:
		return nil, false
	case <-r.Context().Done():
		return nil, false
	}
}

// Lag is one applied entry's replication lag and, when Staged, its parts:
// Ship, on the sender's clock, from the entry's commit to the batch leaving
// (the local fsync, the shipper's wait for the link, encoding); Wire, from
// the sender's clock to this one once the body was read (the network, and
// any clock skew between the two); Apply, on this clock, from then to the
// synced apply (the permit queue, the apply lock, the fsync).
type Lag struct {
	Total, Ship, Wire, Apply time.Duration
	Staged                   bool
}

// refuseUnread refuses a request whose body was not (wholly) read: the
// connection closes after the answer instead of draining the body at the
// sender's pace.
func (a *Acceptor) refuseUnread(w http.ResponseWriter, sender string, err error) {
	w.Header().Set("Connection", "close")
	a.refuse(w, sender, err)
}

// bodySlot takes one of the slots for reading a body, within the sender's
// share (a quarter of them, at least one); it does not wait.
func (a *Acceptor) bodySlot(sender string) (release func(), err error) {
	share := max(1, a.opts.MaxBodies/4)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.bodies >= a.opts.MaxBodies || a.mu.bodiesOf[sender] >= share {
		a.refusals.permit.Add(1)
		return nil, fmt.Errorf("%w: %d batches being read (%d from %s, its share %d)", ErrNoPermit,
			a.mu.bodies, a.mu.bodiesOf[sender], sender, share)
	}
	a.mu.bodies++
	a.mu.bodiesOf[sender]++
	return func() {
		a.mu.Lock()
		a.mu.bodies--
		a.mu.bodiesOf[sender]--
		a.mu.Unlock()
	}, nil
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
		a.opts.Logger.Warn("replicate: batch refused", "sender", sender, "status", status, "err", err)
	}
	httpjson.WriteError(w, status, e)
}

// acquire takes a replay permit, waiting in the bounded queue if need be.
// No sender holds more than its share of the permits (half, at least one),
// so a peer whose batches are slow to apply cannot stall every other.
func (a *Acceptor) acquire(r *http.Request, sender string) (release func(), err error) {
	share := max(1, a.opts.Permits/2)
	a.mu.Lock()
	if a.mu.permitsOf[sender] >= share {
		a.mu.Unlock()
		a.refusals.permit.Add(1)
		return nil, fmt.Errorf("%w: %s holds its share of %d permits", ErrNoPermit, sender, share)
	}
	a.mu.permitsOf[sender]++
	a.mu.Unlock()
	release = func() {
		<-a.permits
		a.mu.Lock()
		a.mu.permitsOf[sender]--
		a.mu.Unlock()
	}
	unshare := func() {
		a.mu.Lock()
		a.mu.permitsOf[sender]--
		a.mu.Unlock()
	}
	select {
	case a.permits <- struct{}{}:
		return release, nil
	default:
	}
	if int(a.queued.Add(1)) > a.opts.PermitQueue {
		a.queued.Add(-1)
		unshare()
		return nil, fmt.Errorf("%w: %d applying, %d waiting", ErrNoPermit, a.opts.Permits, a.opts.PermitQueue)
	}
	defer a.queued.Add(-1)
	t := time.NewTimer(a.opts.PermitWait)
	defer t.Stop()
	select {
	case a.permits <- struct{}{}:
		return release, nil
	case <-t.C:
		unshare()
		return nil, fmt.Errorf("%w: waited %s", ErrNoPermit, a.opts.PermitWait)
	case <-r.Context().Done():
		unshare()
		return nil, fmt.Errorf("%w: %v", ErrNoPermit, r.Context().Err())
	}
}

// Permits reports the replay permits and the pressure they are under.
func (a *Acceptor) Permits() PermitStats {
	st := PermitStats{Capacity: a.opts.Permits, InUse: len(a.permits), Queued: int(a.queued.Load()),
		QueueCap: a.opts.PermitQueue, Refused: a.refusals.permit.Load()}
	st.State = a.pressure(st)
	return st
}

func (a *Acceptor) pressure(st PermitStats) string {
	switch {
	case st.Queued*2 >= st.QueueCap:
		return "saturated"
	case st.Queued > 0 || st.InUse >= st.Capacity:
		return "throttled"
	}
	return "healthy"
}

// hints fills the ack's flow hints from the permits' pressure: throttled
// halves the sender's batches and pauses it briefly; saturated asks for
// batches of one and a longer pause.
func (a *Acceptor) hints(ack *wire.Ack, batchLen int) {
	switch a.pressure(PermitStats{Capacity: a.opts.Permits, InUse: len(a.permits) - 1, Queued: int(a.queued.Load()), QueueCap: a.opts.PermitQueue}) {
	case "saturated":
		ack.SuggestedBatch, ack.PauseMS = 1, 200
	case "throttled":
		ack.SuggestedBatch, ack.PauseMS = max(1, batchLen/2), 20
	}
}

// Apply runs the acceptor's steps on a decoded batch from an authenticated
// sender. Nothing is applied unless everything is: a refusal leaves the store
// as it was.
func (a *Acceptor) Apply(sender string, b *wire.Batch) (wire.Ack, error) {
	lim := a.Limits()
	ack := wire.Ack{Accepted: len(b.Entries), Now: a.opts.Now(), Limits: &lim, Version: a.opts.Version}
	a.hints(&ack, len(b.Entries))
	if b.Sender != sender {
		return ack, fmt.Errorf("%w: batch declares sender %q, credentials are for %q", ErrForbidden, b.Sender, sender)
	}
	var maxTS hlc.Timestamp
	var deadReasons map[uint64]string
	ents := make([]*entry.Entry, 0, len(b.Entries))
	// own marks snapshot entries authored by this cluster: applied only in
	// a re-seed this node asked for.
	var own, unknown map[uint64]bool
	dropped := 0
	for i := range b.Entries {
		e := &b.Entries[i]
		switch {
		case e.StampOrigin != "" && !b.Snapshot:
			return ack, fmt.Errorf("%w: entry %d carries a stamp of %q outside a re-seed snapshot", ErrForbidden, e.Index, e.StampOrigin)
		case e.Origin == a.opts.Local:
			// Our own write, shipped back: it is here already.
			dropped++
			continue
		case e.Origin != sender:
			return ack, fmt.Errorf("%w: entry %d claims origin %q, sender is %q", ErrForbidden, e.Index, e.Origin, sender)
		case e.Stream != b.Stream:
			return ack, fmt.Errorf("%w: entry %d is of stream %s, batch of %s", ErrBadBatch, e.Index, e.Stream, b.Stream)
		case e.CtrComp != "" && !b.Snapshot && entry.ComponentCluster(e.CtrComp) != sender:
			return ack, fmt.Errorf("%w: entry %d carries totals of %q, sender is %q", ErrForbidden, e.Index, e.CtrComp, sender)
		}
		if b.Snapshot && a.authoredHere(e) {
			if own == nil {
				own = map[uint64]bool{}
			}
			own[e.Index] = true
		} else if b.Snapshot && !a.known(a.author(e)) {
			// A snapshot relays writes of the clusters of this mesh; one
			// of a cluster this node does not know is nobody's it can
			// check, and is not taken.
			if unknown == nil {
				unknown = map[uint64]bool{}
			}
			unknown[e.Index] = true
		}
		if err := a.checkEntry(e, b.Snapshot); err != nil {
			// The entry is well-formed but breaks one of this node's own
			// limits: set it aside for an operator rather than wedge the
			// link behind it.
			if deadReasons == nil {
				deadReasons = map[uint64]string{}
			}
			deadReasons[e.Index] = err.Error()
		}
		for _, ts := range []hlc.Timestamp{e.Commit, e.Stamp} {
			if err := a.clock.CheckOffset(ts); err != nil {
				return ack, fmt.Errorf("%w: entry %d: %w", ErrClockOffset, e.Index, err)
			}
			if maxTS.Less(ts) {
				maxTS = ts
			}
		}
		if n := len(ents); n > 0 && e.Index != ents[n-1].Index+1 {
			return ack, fmt.Errorf("%w: entry indexes %d then %d are not consecutive", ErrBadBatch, ents[n-1].Index, e.Index)
		}
		ents = append(ents, e)
	}
	if b.End != nil {
		if err := a.clock.CheckOffset(b.End.Commit); err != nil {
			return ack, fmt.Errorf("%w: snapshot end: %w", ErrClockOffset, err)
		}
	}
	ack.Duplicates = dropped
	if len(ents) == 0 && b.End == nil {
		// A heartbeat (or a batch of our own entries only): report where
		// the stream stands here, and record a request for a re-seed.
		return a.heartbeat(sender, b, ack, dropped)
	}
	// A batch that does not continue the stream here is refused without
	// a command of the log (the machine would refuse it the same way, at
	// the cost of an append): the batch before it is often still on its
	// way, and ServeHTTP asks again as the sender's requests move.
	if len(ents) > 0 && !b.Snapshot {
		rd := a.store.NewBatch()
		hwm, err := rd.HWM(sender, b.Stream)
		rd.Close()
		if err != nil {
			return ack, err
		}
		if first := ents[0].Index; hwm.Index > 0 && first > hwm.Index+1 {
			return ack, &GapError{Origin: sender, Stream: b.Stream, HWM: hwm.Index, Got: first}
		}
	}
	// Local writes stamped after this batch must sort above it.
	a.clock.Observe(maxTS)
	in := &machine.Inbound{Sender: sender, Batch: b, Own: own, Unknown: unknown, Dead: deadReasons, At: a.opts.Now(),
		HLC: a.clock.Last(), MaxStreams: a.opts.MaxStreams}
	if b.End != nil {
		in.KnownMarks = make([]bool, len(b.Marks))
		for i, m := range b.Marks {
			in.KnownMarks[i] = a.known(m.Origin)
		}
	}
	res, err := a.log.ApplyInbound(in, b.Raw)
	if err != nil {
		return ack, err
	}
	var gap *GapError
	var conflict *ConflictError
	switch {
	case res.Err == nil:
	case errors.As(res.Err, &gap), errors.As(res.Err, &conflict):
		return ack, res.Err
	case errors.Is(res.Err, machine.ErrForbidden):
		return ack, fmt.Errorf("%w: %w", ErrForbidden, res.Err)
	default:
		return ack, fmt.Errorf("%w: %w", ErrBadBatch, res.Err)
	}
	if res.Resent {
		ack.Duplicates += res.Duplicates
		ack.HWM = res.HWM
		a.count(sender, func(c *Counts) { c.Batches++; c.Duplicates += uint64(res.Duplicates) })
		return ack, nil
	}
	start := res.Start
	if a.opts.ObserveLag != nil && a.opts.Now != nil && !b.Snapshot && res.HWM > start {
		now := a.opts.Now()
		staged := b.SentAt > 0 && b.ReceivedAt > 0
		lags := make([]Lag, 0, res.HWM-start)
		for _, e := range ents {
			if e.Index > start {
				l := Lag{Total: time.Duration(now - e.Commit.Wall)}
				if staged {
					l.Staged = true
					l.Ship = time.Duration(b.SentAt - e.Commit.Wall)
					l.Wire = time.Duration(b.ReceivedAt - b.SentAt)
					l.Apply = time.Duration(now - b.ReceivedAt)
				}
				lags = append(lags, l)
			}
		}
		a.opts.ObserveLag(sender, lags)
	}
	if b.End != nil && a.opts.OnTrailer != nil {
		a.opts.OnTrailer(sender, res.Requested, res.Rejoin)
	}
	ack.Applied = res.Applied + res.Stale
	ack.Duplicates += res.Duplicates
	ack.HWM = res.HWM
	if !res.HWMCommit.IsZero() {
		ack.HWMCommit = res.HWMCommit.String()
	}
	if !res.OriginFrontier.IsZero() {
		ack.OriginFrontier = res.OriginFrontier.String()
	}
	a.count(sender, func(c *Counts) {
		c.Batches++
		c.Applied += uint64(res.Applied)
		c.Stale += uint64(res.Stale)
		c.Duplicates += uint64(res.Duplicates)
		c.DroppedOwn += uint64(dropped + res.DroppedOwn)
		c.DroppedUnknown += uint64(res.DroppedUnknown)
		c.DeadLettered += uint64(res.DeadLettered)
	})
	return ack, nil
}

// heartbeat answers an empty batch: where the sender's stream stands here,
// whether this node holds other streams of the sender's cluster (a sender
// that starts empty learns it lost its data), and it records a request for
// a re-seed.
func (a *Acceptor) heartbeat(sender string, b *wire.Batch, ack wire.Ack, dropped int) (wire.Ack, error) {
	batch := a.store.NewBatch()
	defer batch.Close()
	hwm, err := batch.HWM(sender, b.Stream)
	if err != nil {
		return ack, err
	}
	ack.HWM = hwm.Index
	if !hwm.Commit.IsZero() {
		ack.HWMCommit = hwm.Commit.String()
	}
	if ack.OriginFrontier, err = a.originFrontier(batch, sender, b.Stream); err != nil {
		return ack, err
	}
	batch.Close()
	// The sender's rejoin phase with this node, told in every heartbeat,
	// is what the R record must say: asking (owed a re-seed, and awaited),
	// seeding (awaited), or nothing (a record left from a rejoin that
	// ended, or rolled back by a restore of either side, goes).
	want := byte(0)
	switch b.Rejoining {
	case wire.RejoinRequesting:
		want = store.ReseedRequested | store.AwaitRejoin
	case wire.RejoinSeeding:
		want = store.AwaitRejoin
	}
	flags, err := a.log.UpdateRecord(sender, machine.RecordReseed, func(byte) byte { return want })
	if err != nil {
		return ack, err
	}
	if want != flags {
		a.opts.Logger.Warn("replicate: peer's rejoin recorded", "sender", sender, "phase", b.Rejoining,
			"owed", want&store.ReseedRequested != 0, "awaiting", want&store.AwaitRejoin != 0)
	}
	ack.ReseedRecorded = want&store.ReseedRequested != 0
	if (want^flags)&store.ReseedRequested != 0 && a.opts.OnReseedRequest != nil {
		a.opts.OnReseedRequest(sender, want&store.ReseedRequested != 0)
	}
	a.count(sender, func(c *Counts) { c.Batches++; c.DroppedOwn += uint64(dropped) })
	return ack, nil
}

// originFrontier is the highest commit HLC of the sender's cluster this
// node applied, over its streams other than this one ("" when none): the
// sender's current stream is its own business (a conflict there is caught
// by index and commit); a later write on another stream than the sender
// remembers means it lost that stream.
func (a *Acceptor) originFrontier(batch *store.Batch, sender string, current entry.StreamID) (string, error) {
	hs, err := batch.HWMsOfExcept(sender, current)
	var f hlc.Timestamp
	for _, h := range hs {
		if h.Stream != current && f.Less(h.Commit) {
			f = h.Commit
		}
	}
	if f.IsZero() {
		return "", err
	}
	return f.String(), err
}

// author is the cluster whose write a snapshot entry relays.
func (a *Acceptor) author(e *entry.Entry) string {
	if e.Op == entry.OpCounter {
		return entry.ComponentCluster(e.CounterComponent())
	}
	return e.LWW().Origin
}

// authoredHere reports whether a snapshot entry relays a write of this
// cluster.
func (a *Acceptor) authoredHere(e *entry.Entry) bool { return a.author(e) == a.opts.Local }

// known reports whether cluster is a peer this node takes writes from.
func (a *Acceptor) known(cluster string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.mu.secrets[cluster]
	return ok
}

func (a *Acceptor) count(origin string, f func(*Counts)) {
	a.mu.Lock()
	f(a.countsLocked(origin))
	a.mu.Unlock()
}

func (a *Acceptor) checkEntry(e *entry.Entry, snapshot bool) error {
	if e.Oversize > 0 {
		return fmt.Errorf("%w: entry %d of %d bytes was over this node's batch limit of %d bytes; "+
			"the sender sent a stub (the write is only at %s)", ErrTooLarge, e.Index, e.Oversize, a.opts.MaxBodyBytes, e.Origin)
	}
	keys := []string{e.Key}
	if e.End != "" {
		keys = append(keys, e.End)
	}
	for _, op := range e.Ops {
		keys = append(keys, op.Key)
		if len(op.Value) > a.opts.MaxValueBytes {
			return fmt.Errorf("%w: entry %d: a batch value of %d bytes, limit %d", ErrBadBatch, e.Index, len(op.Value), a.opts.MaxValueBytes)
		}
	}
	for _, k := range keys[1:] {
		if len(k) > a.opts.MaxKeyBytes || !utf8.ValidString(k) {
			return fmt.Errorf("%w: entry %d: key of %d bytes (limit %d) or not UTF-8", ErrBadBatch, e.Index, len(k), a.opts.MaxKeyBytes)
		}
	}
	switch {
	case len(e.Key) > a.opts.MaxKeyBytes:
		return fmt.Errorf("%w: entry %d: key of %d bytes, limit %d", ErrBadBatch, e.Index, len(e.Key), a.opts.MaxKeyBytes)
	case !utf8.ValidString(e.Key):
		return fmt.Errorf("%w: entry %d: key is not valid UTF-8", ErrBadBatch, e.Index)
	case len(e.Value) > a.opts.MaxValueBytes:
		return fmt.Errorf("%w: entry %d: value of %d bytes, limit %d", ErrBadBatch, e.Index, len(e.Value), a.opts.MaxValueBytes)
	case !snapshot && a.opts.PinWindow > 0 && e.Stamp.Wall < e.Commit.Wall-int64(a.opts.PinWindow):
		// A stamp that old could resurrect a tombstone already collected.
		return fmt.Errorf("%w: entry %d: stamp %s is older than its commit %s by more than the pin window %s",
			ErrBadBatch, e.Index, e.Stamp, e.Commit, a.opts.PinWindow)
	}
	return nil
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

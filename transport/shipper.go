// Package transport is the outbound half of replication: one shipper per
// (local stream, peer) reads the WAL after the peer's acknowledged cursor,
// packs msgpack batches, POSTs them to the peer's acceptor, and advances the
// cursor on each ack. Delivery is at-least-once: a failure resends the very
// same entries (same WAL identities, never re-stamped) after a jittered
// exponential backoff, and the acceptor drops what it already has.
//
// A peer that misses entries the WAL no longer holds (detached on overflow,
// or behind a truncated or replaced WAL) is re-seeded: a snapshot of the whole
// tree streamed through the same acceptor, after which shipping resumes.
package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/policy"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
	"github.com/replicator/replicator/wire"
)

// Log is what a shipper reads: the local WAL.
type Log interface {
	Stream() entry.StreamID
	First() uint64
	Last() uint64
	ReadRaw(index uint64) ([]byte, error)
	Notify() <-chan struct{}
	BytesAfter(index uint64) int64
}

// Cursors persists shippers' positions.
type Cursors interface {
	Cursor(peer string) (entry.Cursor, bool, error)
	SetCursor(peer string, c entry.Cursor) error
	// InitCursor stores a new link's first cursor, synced.
	InitCursor(peer string, c entry.Cursor) error
}

// Snapshots opens consistent views of the tree, for re-seeds.
type Snapshots interface {
	NewSnapshot() (*store.Snapshot, error)
}

// Peer is one configured peer cluster.
type Peer struct {
	Name   string // its cluster ID
	URL    string // base URL of its replicate endpoint
	Secret string // shared secret; "" with insecure peers
	// AllowUnproven sends the secret to a node of this peer that cannot
	// prove it holds it because it runs a build before proofs (its proof
	// endpoint answers 404): for the window of an upgrade only (proof.go).
	AllowUnproven bool
}

// Options configure shippers. Zero fields take defaults.
type Options struct {
	// Local is this node's cluster ID, the batches' sender.
	Local string
	// MaxBatchEntries bounds the entries of one batch. Default 2048.
	MaxBatchEntries int
	// MaxBatchBytes bounds the encoded entries of one batch. Default 4 MiB.
	MaxBatchBytes int
	// Linger, when positive, is how long a shipper waits for a batch to
	// fill once it has something to send. Default none: a link has one
	// batch in flight, so while it is on the wire the next one fills by
	// itself; a trickle ships at once (a fixed linger was most of the lag
	// at 1,000 writes/s) and a flood still fills batches.
	Linger time.Duration
	// BackoffMin and BackoffMax bound the retry delay, which doubles per
	// consecutive failure. Defaults 100ms and 30s.
	BackoffMin, BackoffMax time.Duration
	// Jitter spreads each delay by up to this fraction either way.
	// Default 0.2.
	Jitter float64
	// CursorFlush is how often an advanced cursor is persisted. Default
	// 100ms. A crash loses at most this much progress, which the peer then
	// receives again and drops as duplicates.
	CursorFlush time.Duration
	// RequestTimeout bounds one POST. Default 30s.
	RequestTimeout time.Duration
	// Client sends the batches (keep-alive). Tests wrap its transport to
	// lose, delay or duplicate batches.
	Client *http.Client
	// Now reads the physical clock in nanoseconds (ages, skew, snapshot
	// stamps).
	Now func() int64
	// Applied returns the last local WAL index applied to the store; a
	// re-seed resumes shipping after it.
	Applied func() uint64
	// Snapshots opens views of the tree for re-seeds (nil: re-seeds are
	// impossible and a peer that needs one stays marked).
	Snapshots Snapshots
	// AutoReseed starts a re-seed by itself when the peer needs one.
	AutoReseed bool
	// StoreHasData: the tree holds data the WAL may not (writes replicated
	// from other clusters, or of a stream this node replaced), so a peer
	// with no cursor yet is re-seeded rather than fed the WAL alone.
	StoreHasData bool
	// Heartbeat is how often an idle link sends an empty batch: it keeps
	// the link's health current, measures clock skew, and learns the
	// receiver's high-water mark (a peer that lost its data is noticed and
	// re-seeded). Default 1s.
	Heartbeat time.Duration
	// ObserveShip, when set, is told each acknowledged batch's round trip.
	ObserveShip func(peer string, d time.Duration, entries int)
	// OnAck, when set, is told every answer the peer gives to a batch or a
	// heartbeat of the current stream (the node learns from it whether its
	// cluster existed before, and when every link has answered once).
	OnAck func(peer string, ack *wire.Ack)
	// OnConflict, when set, is told that the peer holds an entry of this
	// stream that the local WAL does not (a higher index, or another commit
	// HLC at an index): the data directory was restored from a backup or
	// copied. The shipper stops shipping the stream until Rebase.
	OnConflict func(peer string, stream entry.StreamID, why string)
	// OnReseedDone, when set, is told that a re-seed's trailer was
	// acknowledged, and whether it answered a request and ended a rejoin.
	OnReseedDone func(peer string, requested, rejoin bool)
	Logger       *slog.Logger
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.MaxBatchEntries == 0 {
		o.MaxBatchEntries = 2048
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = 4 << 20
	}
	if o.BackoffMin == 0 {
		o.BackoffMin = 100 * time.Millisecond
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 30 * time.Second
	}
	if o.Jitter == 0 {
		o.Jitter = 0.2
	}
	if o.CursorFlush == 0 {
		o.CursorFlush = 100 * time.Millisecond
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixNano() }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every problem at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Local == "" {
		errs = append(errs, errors.New("transport: Local is required"))
	}
	if o.MaxBatchEntries < 1 {
		errs = append(errs, fmt.Errorf("transport: MaxBatchEntries %d is below 1", o.MaxBatchEntries))
	}
	if o.MaxBatchBytes < 1024 {
		errs = append(errs, fmt.Errorf("transport: MaxBatchBytes %d is below 1024", o.MaxBatchBytes))
	}
	if o.BackoffMin <= 0 || o.BackoffMax < o.BackoffMin {
		errs = append(errs, fmt.Errorf("transport: backoff [%s, %s] is not a range", o.BackoffMin, o.BackoffMax))
	}
	if o.Jitter < 0 || o.Jitter >= 1 {
		errs = append(errs, fmt.Errorf("transport: Jitter %g out of [0, 1)", o.Jitter))
	}
	return errors.Join(errs...)
}

// Link states, as /admin/peers shows them.
const (
	StateUnknown     = "unknown" // nothing tried yet, or the first attempt under way
	StateHealthy     = "healthy"
	StateLagging     = "lagging"
	StateStalled     = "stalled"
	StateNeedsReseed = "needs_reseed"
	StateReseeding   = "reseeding"
	StatePaused      = "paused"
	StateDead        = "dead" // gossip: the peer stopped answering probes
	StateLeft        = "left" // gossip: the peer left gracefully
	// StateConflict: the peer holds entries of this stream the WAL does
	// not; the node is replacing the stream.
	StateConflict = "identity_conflict"
	// StateFollower: this node does not lead its cluster (of several
	// nodes); the leader ships, and this node only shows the cursor.
	StateFollower = "follower"
)

// ReseedStatus is the progress of a re-seed.
type ReseedStatus struct {
	Running  bool      `json:"running"`
	Sent     int       `json:"sent_keys"`
	Total    int       `json:"total_keys"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
	Runs     int       `json:"runs"`
	Error    string    `json:"error,omitempty"`
	// LastReason is why the last re-seed ran (an operator's request, a
	// detach, a peer that asked after losing data, ...).
	LastReason string `json:"last_reason,omitempty"`
	// Requested: the last re-seed answered the peer's own request.
	Requested bool `json:"requested,omitempty"`
}

// Status is a link's figures.
type Status struct {
	Peer              string       `json:"peer"`
	URL               string       `json:"url"`
	State             string       `json:"state"`
	Acked             uint64       `json:"acked_index"`
	Last              uint64       `json:"last_index"`
	EntriesBehind     uint64       `json:"entries_behind"`
	BytesBehind       int64        `json:"bytes_behind"`
	OldestUnackedAge  float64      `json:"oldest_unacked_age_seconds"`
	LastContact       time.Time    `json:"last_contact,omitzero"`
	ConsecutiveErrors int          `json:"consecutive_errors"`
	LastError         string       `json:"last_error,omitempty"`
	InFlight          int          `json:"in_flight_batches"`
	Shipped           uint64       `json:"shipped_entries"`
	Resent            uint64       `json:"resent_entries"`
	Batches           uint64       `json:"batches"`
	Rewinds           uint64       `json:"rewinds"`
	PermitRefusals    uint64       `json:"permit_refusals"`
	Paused            bool         `json:"paused"`
	Detached          bool         `json:"detached"`
	NeedsReseed       bool         `json:"needs_reseed"`
	Reseed            ReseedStatus `json:"reseed"`
	ClockSkewMS       float64      `json:"clock_skew_ms"`
	Thresholds        Thresholds   `json:"thresholds"`
	// Conflict is set when the peer holds entries of this stream the WAL
	// does not have (a restored or copied data directory).
	Conflict string `json:"identity_conflict,omitempty"`
	// ReseedOwed: the peer asked for a re-seed (it lost data), not sent yet.
	ReseedOwed bool `json:"reseed_owed,omitempty"`
	// Limits are what the peer said it accepts.
	Limits *wire.Limits `json:"peer_limits,omitempty"`
	// SendFailures counts every failed send or heartbeat, ever.
	SendFailures uint64 `json:"send_failures"`
	// Liveness is what gossip says of the peer (empty without gossip).
	Liveness string `json:"liveness,omitempty"`
	// Nodes are the peer cluster's nodes its answers listed (a cluster
	// of several): where the link fails over to.
	Nodes []string `json:"peer_nodes,omitempty"`
	// PeerVersion is the build the peer last answered with (empty before
	// its first answer, or from a build that does not tell).
	PeerVersion string `json:"peer_version,omitempty"`
}

// Shipper ships one local stream to one peer.
type Shipper struct {
	peer    Peer
	log     Log
	cursors Cursors
	opts    Options
	rng     *rand.Rand
	// backoff is the shipper's retry policy: it retries without end (a
	// batch is never dropped), 100ms doubling to 30s, ±20%.
	backoff policy.Backoff
	kick    chan struct{} // wakes Run after pause/resume/reseed requests

	mu struct {
		sync.Mutex
		// proven are the peer URLs whose node proved the secret lately,
		// and when (legacy: an older build, let through by AllowUnproven).
		proven      map[string]provenURL
		acked       uint64 // the peer has every entry up to here
		persisted   uint64
		lastFlush   time.Time
		lastContact time.Time
		// wireShare says the last ack's round trip was mostly wire (the
		// rest beyond the receiver's apply at least as long as the apply):
		// then a second batch on the wire pays off.
		wireShare   bool
		errors      int
		lastErr     string
		inFlight    int
		shipped     uint64
		resent      uint64
		batches     uint64
		rewinds     uint64
		permitRefs  uint64
		highShipped uint64 // highest index ever sent, to count resends
		needsReseed bool
		detached    bool // the WAL is not retained for this peer
		paused      bool
		wantReseed  bool
		reseed      ReseedStatus
		suggested   int
		pauseUntil  time.Time
		skew        time.Duration
		url         string
		// nodes are the replicate URLs of the peer cluster's nodes, as its
		// answers list them: a post that cannot reach one tries the next.
		nodes      []string
		liveness   string // from gossip: alive, suspect, dead, left ("" without gossip)
		oldestIdx  uint64 // oldestWall is the commit wall of entry oldestIdx
		oldestWall int64
		// ackedCommit is the commit HLC of entry acked, as the peer said
		// (zero: not known since the cursor last moved back).
		ackedCommit hlc.Timestamp
		limits      *wire.Limits
		peerVersion string    // the build of the peer's last answer
		stubs       uint64    // oversize entries sent as stubs
		failures    uint64    // failed sends, ever (a metric)
		firstTry    time.Time // the first send or heartbeat began
		// owed: the peer asked for a re-seed; rejoinSeed: this node owes the
		// peer the re-seed that ends its own rejoin.
		owed, rejoinSeed bool
		// rejoining is this node's rejoin phase with the peer, told in
		// every heartbeat; phaseSent is the last one the peer confirmed.
		rejoining, phaseSent uint8
		lastHeartbeat        time.Time
		reseedWhy            string // why wantReseed was set
		conflict             string // non-empty: stopped, see OnConflict
	}
	// free holds batch bodies for reuse; only Run's goroutine uses it.
	free [][]byte
}

// NewShipper loads the peer's cursor. A cursor of another stream means the
// WAL was replaced; a peer with no cursor while the WAL no longer starts at
// 1 is new. Both need a re-seed for what the WAL cannot give them.
func NewShipper(peer Peer, log Log, cursors Cursors, opts Options) (*Shipper, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Shipper{peer: peer, log: log, cursors: cursors, opts: opts,
		rng:     rand.New(rand.NewPCG(uint64(opts.Now()), uint64(len(peer.Name)))),
		backoff: policy.Backoff{Initial: opts.BackoffMin, Max: opts.BackoffMax, Jitter: opts.Jitter},
		kick:    make(chan struct{}, 1),
	}
	c, ok, err := cursors.Cursor(peer.Name)
	if err != nil {
		return nil, err
	}
	var acked uint64
	stream := log.Stream()
	switch {
	case ok && c.Stream == stream:
		acked = c.Index
		// The WAL is only ever truncated below what every attached peer
		// acked, so a persisted cursor behind the retained WAL just lost
		// a flush.
		if first := log.First(); acked+1 < first {
			acked = first - 1
		}
	case ok:
		s.mu.needsReseed = true
		s.mu.lastErr = "the WAL was replaced since this peer's cursor (new stream): entries of the old stream may be missing"
	case log.First() > 1:
		s.mu.needsReseed = true
		s.mu.lastErr = "a new peer, and the WAL no longer holds every entry"
	case opts.StoreHasData:
		s.mu.needsReseed = true
		s.mu.lastErr = "a new peer, and the store holds data the WAL does not (replicated from others, or of an older stream)"
	}
	if s.mu.needsReseed {
		s.mu.reseedWhy = s.mu.lastErr
	}
	s.mu.acked, s.mu.persisted = acked, acked
	s.mu.url = peer.URL
	if !ok || c.Stream != stream {
		// Synced: a cursor lost to a crash would make the peer look new.
		if err := cursors.InitCursor(peer.Name, entry.Cursor{Stream: stream, Index: acked}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Peer returns the peer the shipper ships to.
func (s *Shipper) Peer() Peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peer
	p.URL = s.mu.url
	return p
}

// SetURL points the link at another address of the peer (gossip).
func (s *Shipper) SetURL(u string) {
	s.mu.Lock()
	changed := s.mu.url != u
	s.mu.url = u
	s.mu.Unlock()
	if changed {
		s.wake()
	}
}

// SetLiveness records what gossip says of the peer; a peer coming back to
// life is tried at once instead of after its backoff.
func (s *Shipper) SetLiveness(state string) {
	s.mu.Lock()
	wasDown := s.mu.liveness == LiveDead || s.mu.liveness == LiveLeft
	s.mu.liveness = state
	s.mu.Unlock()
	if wasDown && state == LiveAlive {
		s.wake()
	}
}

// Acked returns the peer's acknowledged index (in memory, ahead of what is
// persisted).
func (s *Shipper) Acked() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.acked
}

// Retains reports whether the WAL must be kept for this peer (false once it
// was detached on overflow: it then needs a re-seed instead).
func (s *Shipper) Retains() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.mu.detached
}

// NeedsReseed reports whether the peer misses entries the WAL no longer has.
func (s *Shipper) NeedsReseed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.needsReseed
}

func (s *Shipper) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Pause stops shipping (the WAL is still retained for the peer).
func (s *Shipper) Pause() { s.mu.Lock(); s.mu.paused = true; s.mu.Unlock(); s.wake() }

// Resume undoes Pause.
func (s *Shipper) Resume() { s.mu.Lock(); s.mu.paused = false; s.mu.Unlock(); s.wake() }

// Reseed asks for a re-seed now, needed or not (why is shown in status).
func (s *Shipper) Reseed(why string) {
	s.mu.Lock()
	s.mu.wantReseed, s.mu.reseedWhy = true, why
	s.mu.Unlock()
	s.wake()
}

// Owe records that the peer asked for a re-seed (it lost its data): the
// next re-seed is a requested one, which may carry the peer's own writes.
func (s *Shipper) Owe() { s.mu.Lock(); s.mu.owed = true; s.mu.Unlock(); s.wake() }

// RejoinSeed asks for the re-seed that ends this node's rejoin with the
// peer (its trailer tells the peer to stop waiting).
func (s *Shipper) RejoinSeed() { s.mu.Lock(); s.mu.rejoinSeed = true; s.mu.Unlock(); s.wake() }

// SetRejoining sets this node's rejoin phase with the peer (0, or
// RejoinRequesting / RejoinSeeding); the next heartbeat tells it, at once.
func (s *Shipper) SetRejoining(phase uint8) {
	s.mu.Lock()
	s.mu.rejoining = phase
	s.mu.Unlock()
	s.wake()
}

// Disown forgets a re-seed the peer asked for and no longer needs.
func (s *Shipper) Disown() { s.mu.Lock(); s.mu.owed = false; s.mu.Unlock() }

// Rebase points the link at the local stream after the node replaced it
// (Log now returns the new stream): the peer has nothing of it yet, and
// whatever it missed of the old one arrives by a re-seed.
func (s *Shipper) Rebase() {
	s.mu.Lock()
	s.mu.acked, s.mu.persisted, s.mu.highShipped = 0, 0, 0
	s.mu.ackedCommit = hlc.Timestamp{}
	s.mu.conflict = ""
	s.mu.oldestIdx = 0
	s.mu.Unlock()
	if err := s.cursors.SetCursor(s.peer.Name, entry.Cursor{Stream: s.log.Stream()}); err != nil {
		s.opts.Logger.Warn("persisting cursor", "peer", s.peer.Name, "err", err)
	}
	s.wake()
}

// Delivery is how far the peer has this stream, for tombstone collection.
type Delivery struct {
	Acked       uint64
	AckedCommit hlc.Timestamp // zero when not known yet
	// Complete is false while the peer may be missing entries that the WAL
	// no longer holds for it: detached, needing or owed a re-seed, in one,
	// or in an identity conflict.
	Complete bool
}

// Delivery reports how far the peer has this stream.
func (s *Shipper) Delivery() Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Delivery{Acked: s.mu.acked, AckedCommit: s.mu.ackedCommit,
		Complete: !s.mu.detached && !s.mu.needsReseed && !s.mu.reseed.Running && !s.mu.owed &&
			!s.mu.wantReseed && s.mu.conflict == ""}
}

// Limits returns what the peer said it accepts (nil before it answered).
func (s *Shipper) Limits() *wire.Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.limits
}

// Detach stops retaining the WAL for the peer (overflow mode "detach"): it
// is marked needs_reseed and, with AutoReseed, re-seeded once reachable.
func (s *Shipper) Detach(why string) {
	s.mu.Lock()
	first := !s.mu.detached
	s.mu.detached, s.mu.needsReseed = true, true
	s.mu.lastErr, s.mu.reseedWhy = why, why
	s.mu.Unlock()
	if first {
		s.opts.Logger.Error("peer detached: the WAL is no longer retained for it; it needs a re-seed", "peer", s.peer.Name, "why", why)
	}
}

// Run ships until ctx is done, then persists the cursor. It is the
// shipper's only goroutine and returns when ctx is cancelled.
func (s *Shipper) Run(ctx context.Context) {
	defer s.flushCursor(true)
	for ctx.Err() == nil {
		s.mu.Lock()
		acked, reseed, paused, pause := s.mu.acked, s.mu.needsReseed, s.mu.paused, s.mu.pauseUntil
		want := s.mu.wantReseed || s.mu.owed || s.mu.rejoinSeed || (reseed && s.opts.AutoReseed)
		conflict := s.mu.conflict != ""
		// The rejoin phase goes out at once when it changed, and with every
		// heartbeat; a busy link still sends one every few heartbeats so
		// the peer's record of it cannot go stale.
		ask := s.mu.rejoining != s.mu.phaseSent ||
			(!s.mu.lastHeartbeat.IsZero() && time.Since(s.mu.lastHeartbeat) >= 5*s.opts.Heartbeat)
		s.mu.Unlock()
		if conflict {
			// Nothing more of this stream goes out: the node is replacing it.
			select {
			case <-ctx.Done():
				return
			case <-s.kick:
			}
			continue
		}
		if paused {
			s.flushCursor(false)
			select {
			case <-ctx.Done():
				return
			case <-s.kick:
			}
			continue
		}
		if want && s.opts.Snapshots != nil {
			// Only a reachable peer is re-seeded: re-attaching retains the
			// WAL for it again, which a peer still down would overflow.
			if err := s.heartbeat(ctx); err != nil {
				s.failed(ctx, fmt.Errorf("re-seed: peer unreachable: %w", err))
				continue
			}
			if err := s.reseed(ctx); err != nil && ctx.Err() == nil {
				s.failed(ctx, fmt.Errorf("re-seed: %w", err))
			}
			continue
		}
		if d := time.Until(pause); d > 0 {
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		if ask {
			if err := s.heartbeat(ctx); err != nil && ctx.Err() == nil {
				s.failed(ctx, fmt.Errorf("heartbeat: %w", err))
				continue
			}
		}
		notify := s.log.Notify()
		last := s.log.Last()
		if reseed || acked >= last {
			s.flushCursor(false)
			if !reseed && s.idleFor() >= s.opts.Heartbeat {
				if err := s.heartbeat(ctx); err != nil && ctx.Err() == nil {
					s.failed(ctx, fmt.Errorf("heartbeat: %w", err))
				}
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-notify:
			case <-s.kick:
			case <-time.After(min(s.opts.CursorFlush, s.opts.Heartbeat)):
			}
			continue
		}
		if acked+1 < s.log.First() {
			s.setReseed(fmt.Sprintf("cursor %d is behind the retained WAL (first index %d)", acked, s.log.First()))
			continue
		}
		if !s.lingerFor(ctx, acked) {
			return
		}
		if err := s.shipOnce(ctx, acked); err != nil && ctx.Err() == nil {
			s.failed(ctx, err)
		}
	}
}

// failed counts a failure and backs off before the next try.
func (s *Shipper) failed(ctx context.Context, err error) {
	s.mu.Lock()
	s.mu.errors++
	s.mu.failures++
	n := s.mu.errors
	s.mu.lastErr = err.Error()
	if errors.Is(err, errNoPermit) {
		s.mu.permitRefs++
	}
	s.mu.Unlock()
	d := s.backoff.Delay(n, s.rng)
	s.opts.Logger.Debug("ship failed; backing off", "peer", s.peer.Name, "attempt", n, "delay", d, "err", err)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-s.kick:
	}
}

// lingerFor waits up to Linger for a batch to fill, so that a trickle of
// writes does not become a trickle of one-entry batches.
func (s *Shipper) lingerFor(ctx context.Context, acked uint64) bool {
	if s.opts.Linger <= 0 {
		return true
	}
	deadline := time.NewTimer(s.opts.Linger)
	defer deadline.Stop()
	for s.log.Last()-acked < uint64(s.batchLimit()) {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return true
		case <-s.log.Notify():
		}
	}
	return true
}

func (s *Shipper) batchLimit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.suggested > 0 && s.mu.suggested < s.opts.MaxBatchEntries {
		return s.mu.suggested
	}
	return s.opts.MaxBatchEntries
}

func (s *Shipper) setReseed(why string) {
	s.mu.Lock()
	first := !s.mu.needsReseed
	s.mu.needsReseed = true
	s.mu.lastErr = why
	if s.mu.reseedWhy == "" {
		s.mu.reseedWhy = why
	}
	s.mu.Unlock()
	if first {
		s.opts.Logger.Error("peer needs a re-seed", "peer", s.peer.Name, "why", why)
	}
}

// idleFor is how long since the peer last answered (or since ever).
func (s *Shipper) idleFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.lastContact.IsZero() {
		return time.Duration(1 << 62)
	}
	return time.Since(s.mu.lastContact)
}

// heartbeat sends an empty batch of the stream (asking for a re-seed when
// the node lost data). The ack carries the receiver's high-water mark: one
// below the cursor means the receiver lost entries (its data was wiped or
// restored), and the shipper rewinds; one the WAL does not hold means this
// node's data directory was restored or copied.
func (s *Shipper) heartbeat(ctx context.Context) error {
	s.mu.Lock()
	phase := s.mu.rejoining
	s.mu.lastHeartbeat = time.Now()
	s.mu.Unlock()
	stream := s.log.Stream()
	body := wire.AppendHeader(nil, &wire.Header{Sender: s.opts.Local, Stream: stream, Rejoining: phase}, 0)
	sent := s.opts.Now()
	ack, err := s.post(ctx, body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.mu.phaseSent = phase
	s.mu.Unlock()
	if !s.answered(&ack, stream) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if stream != s.log.Stream() {
		return nil // replaced since answered checked: Rebase owns the cursor
	}
	if s.mu.conflict != "" {
		return nil // the link stopped on an earlier answer of this window
	}
	s.ackedLocked(ack, sent)
	if phase == wire.RejoinRequesting && ack.ReseedRecorded {
		s.opts.Logger.Debug("peer holds the request for a re-seed", "peer", s.peer.Name)
	}
	if ack.HWM < s.mu.acked && !s.mu.needsReseed {
		s.opts.Logger.Warn("peer is behind its cursor: rewinding", "peer", s.peer.Name, "cursor", s.mu.acked, "peer_hwm", ack.HWM)
		s.mu.rewinds++
		s.rewindLocked(ack.HWM)
	} else if ack.HWM == s.mu.acked {
		s.mu.ackedCommit = parseCommit(ack.HWMCommit)
	}
	return nil
}

// conflicted stops the link and tells the node, once.
// REQUIRES: stream is the stream the request that proved it was sent for.
func (s *Shipper) conflicted(stream entry.StreamID, why string) {
	s.mu.Lock()
	// Checked under the lock: the node swaps the log before it calls
	// Rebase (which takes it), so a conflict about the old stream either
	// sees the swap here or is cleared by Rebase after.
	if stream != s.log.Stream() {
		s.mu.Unlock()
		return // about a stream already replaced
	}
	first := s.mu.conflict == ""
	s.mu.conflict = why
	s.mu.Unlock()
	if first {
		s.opts.Logger.Error("identity conflict: this data directory's stream was used before (restored from a backup, or copied)",
			"peer", s.peer.Name, "why", why)
		if s.opts.OnConflict != nil {
			s.opts.OnConflict(s.peer.Name, stream, why)
		}
	}
}

func parseCommit(v string) hlc.Timestamp {
	ts, _ := hlc.Parse(v)
	return ts
}

// answered checks an answer about stream (the stream the request was sent
// for) against the WAL, tells OnAck, and reports whether the answer still
// concerns the current stream. A peer that holds an index the WAL does not,
// or another commit at an index it does, holds writes of a past life of this
// data directory: the link stops and the node is told.
func (s *Shipper) answered(ack *wire.Ack, stream entry.StreamID) bool {
	if stream != s.log.Stream() {
		return false // replaced while the request was out
	}
	if ack.Limits != nil || ack.Version != "" || len(ack.Nodes) > 0 {
		s.mu.Lock()
		if ack.Limits != nil {
			s.mu.limits = ack.Limits
		}
		if len(ack.Nodes) > 0 {
			s.learnNodesLocked(ack.Nodes)
		}
		if ack.Version != "" {
			s.mu.peerVersion = ack.Version
		}
		s.mu.Unlock()
	}
	why := ""
	switch last, first := s.log.Last(), s.log.First(); {
	case ack.HWM > last:
		why = fmt.Sprintf("the peer holds index %d of stream %s, the WAL ends at %d", ack.HWM, stream, last)
	case ack.HWM >= first && ack.HWM > 0 && !parseCommit(ack.HWMCommit).IsZero():
		if p, err := s.log.ReadRaw(ack.HWM); err == nil {
			if e, err := wire.NewCodec().DecodeEntry(p, wire.Defaults{Origin: s.opts.Local, Stream: stream}); err == nil &&
				e.Commit.String() != ack.HWMCommit {
				why = fmt.Sprintf("the peer holds index %d of stream %s committed at %s, the WAL's was committed at %s",
					ack.HWM, stream, ack.HWMCommit, e.Commit)
			}
		}
	}
	if why != "" {
		s.conflicted(stream, why)
		return false
	}
	if s.opts.OnAck != nil {
		s.opts.OnAck(s.peer.Name, ack)
	}
	return true
}

// errGap carries the receiver's high-water mark from a 409 refusal.
type errGap struct{ hwm uint64 }

func (e *errGap) Error() string { return fmt.Sprintf("receiver is at index %d: rewinding", e.hwm) }

// errConflict is the receiver's proof that it applied another write under
// one of this stream's identities.
type errConflict struct{ msg string }

func (e *errConflict) Error() string { return e.msg }

var errNoPermit = errors.New("transport: receiver has no replay permit free (429)")

// errTooLarge is a 413 answer: the batch was over the receiver's body limit.
type errTooLarge struct {
	limit int64 // 0 when the receiver did not say
	msg   string
}

func (e *errTooLarge) Error() string { return "transport: batch too large for the receiver: " + e.msg }

// batchBudget is how many bytes of entries one batch may carry: the
// configured bound, lowered to what the peer accepts once it said.
func (s *Shipper) batchBudget() (budget int, peerMax int64) {
	budget = s.opts.MaxBatchBytes
	s.mu.Lock()
	lim := s.mu.limits
	s.mu.Unlock()
	if lim != nil && lim.MaxBody > 0 {
		peerMax = lim.MaxBody - batchOverhead
		if peerMax < int64(budget) {
			budget = int(max(peerMax, 1))
		}
	}
	return budget, peerMax
}

// batchOverhead is room left in a peer's body limit for the batch header.
const batchOverhead = 512

// flight is one batch on the wire.
type flight struct {
	acked    uint64 // the cursor it was built after
	from, to uint64
	n        int
	stub     bool // it carries an oversize stub: it goes alone
	stream   entry.StreamID
	body     []byte
	sent     int64
	res      chan flightResult // buffered: the post never blocks on it
	// wrote is closed once the request is written out (or failed): a
	// second batch starts only then, so that it reaches the receiver
	// behind the first.
	wrote chan struct{}
}

type flightResult struct {
	ack wire.Ack
	err error
}

// shipOnce sends the batch after acked and handles the answer. When the
// peer takes two batches in order (Limits.Pipeline), the entries written
// while one is on the wire go out right behind it (once its request is
// written), and each answer makes room for the next: a window of two, so a
// batch no longer waits a whole round trip for the one before. Answers are
// handled in the order sent; the cursor moves only on acks; after any
// failure nothing more is added, the rest is drained, and the loop resends
// from the cursor (the receiver drops what it has by its high-water mark).
// It returns to the loop (pauses, heartbeats, re-seeds) when the window
// empties, or after maxWindowRounds batches.
func (s *Shipper) shipOnce(ctx context.Context, acked uint64) error {
	take := func() *[]byte {
		b := new([]byte)
		if n := len(s.free); n > 0 {
			*b, s.free = s.free[n-1], s.free[:n-1]
		}
		return b
	}
	f, err := s.build(acked, take(), true)
	if err != nil || f == nil {
		return err
	}
	if f.stub || !s.windowOpen() {
		// One batch on the wire: posted from this goroutine, as a link
		// whose round trip is mostly the receiver's apply always did.
		s.mu.Lock()
		s.mu.inFlight++
		s.countShippedLocked(f)
		s.mu.Unlock()
		f.sent = s.opts.Now()
		ack, err := s.post(ctx, f.body)
		if err == nil {
			s.free = append(s.free, f.body[:0])
		}
		return s.settle(f, ack, err)
	}
	s.launch(ctx, f)
	window := []*flight{f}
	var firstErr error
	// open: more may be added. It closes for good at the first answer
	// that is not an ack moving the cursor to its batch's end (a failure,
	// a gap, a rewind, a conflict), when ctx ends, or after
	// maxWindowRounds batches.
	open, settled, rounds := true, false, 1
	done := ctx.Done()
	for len(window) > 0 {
		head, tail := window[0], window[len(window)-1]
		var r *flightResult
		// Room behind the tail: wait for its request to be out, then for
		// entries after it, or for the head's answer.
		adding := open && len(window) < 2 && rounds < maxWindowRounds && !tail.stub && s.windowOpen()
		var written chan struct{}
		if adding {
			written = tail.wrote
		}
		for r == nil {
			var wake <-chan struct{}
			if adding && written == nil {
				notify := s.log.Notify()
				if s.log.Last() > tail.to {
					adding = false
					// A stub goes alone: build stops before an entry that
					// would need one.
					next, err := s.build(tail.to, take(), false)
					switch {
					case err != nil:
						open = false // the next round reports it
					case next != nil && next.stream == tail.stream:
						s.launch(ctx, next)
						window = append(window, next)
						rounds++
					case next != nil:
						s.free = append(s.free, next.body[:0])
					}
					continue
				}
				wake = notify
			}
			select {
			case res := <-head.res:
				r = &res
			case <-written:
				written = nil
			case <-wake:
			case <-done:
				done, adding, open = nil, false, false
			}
		}
		window = window[1:]
		if r.err == nil {
			// Answered 200: the receiver read the whole body, so net/http
			// is done with it. (After a refusal it may still be writing it:
			// that buffer is left to the collector.)
			s.free = append(s.free, head.body[:0])
		}
		var gap *errGap
		if settled && errors.As(r.err, &gap) {
			// It overtook the batch before it on the way in (another
			// connection), or followed one the receiver did not apply:
			// the cursor stands where the acks left it, and the next round
			// sends on from there.
			s.mu.Lock()
			s.mu.inFlight--
			s.mu.Unlock()
			open = false
			continue
		}
		err := s.settle(head, r.ack, r.err)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if err != nil || r.err != nil || s.Acked() != head.to {
			open = false
		} else {
			settled = true
		}
	}
	return firstErr
}

// maxWindowRounds bounds the batches one shipOnce sends, so that pauses,
// heartbeats and re-seeds are looked at under a steady stream of writes.
const maxWindowRounds = 64

// windowOpen says whether a second batch may go out: the peer takes two,
// does not ask for smaller batches or a pause, and the link is not being
// paused, re-seeded or stopped.
func (s *Shipper) windowOpen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.limits == nil || s.mu.limits.Pipeline < 2 || !s.mu.wireShare || s.mu.paused || s.mu.wantReseed || s.mu.conflict != "" ||
		(s.mu.suggested > 0 && s.mu.suggested < s.opts.MaxBatchEntries) || time.Now().Before(s.mu.pauseUntil) {
		return false
	}
	return true
}

// build reads the entries after acked into a batch body in *buf (nil: none
// to send). Without stubs it stops before an entry too large for the peer
// (nil if that is the first), which then goes alone in a batch of its own.
func (s *Shipper) build(acked uint64, buf *[]byte, stubs bool) (*flight, error) {
	last := s.log.Last()
	limit := s.batchLimit()
	budget, peerMax := s.batchBudget()
	stream := s.log.Stream()
	var payloads [][]byte
	size := 0
	stubbed := false
	for i := acked + 1; i <= last && len(payloads) < limit; i++ {
		p, err := s.log.ReadRaw(i)
		if err != nil {
			if errors.Is(err, wal.ErrNotFound) && i < s.log.First() {
				s.setReseed(fmt.Sprintf("entry %d was truncated before the peer acked it", i))
				return nil, nil
			}
			return nil, fmt.Errorf("transport: read wal entry %d for %s: %w", i, s.peer.Name, err)
		}
		if len(payloads) > 0 && size+len(p) > budget {
			break
		}
		if peerMax > 0 && int64(len(p)) > peerMax {
			if len(payloads) > 0 || !stubs {
				break // it goes alone, next time
			}
			// The peer would refuse the body before reading it, and every
			// entry behind this one would wait forever: send a stub that
			// it sets aside as a dead letter, and move on.
			stub, err := s.stub(p, stream)
			if err != nil {
				return nil, err
			}
			p = stub
			stubbed = true
		}
		payloads = append(payloads, p)
		size += len(p)
	}
	if len(payloads) == 0 {
		return nil, nil
	}
	b := wire.AppendBatchHeader((*buf)[:0], s.opts.Local, stream, len(payloads))
	for _, p := range payloads {
		b = append(b, p...)
	}
	*buf = b
	return &flight{acked: acked, from: acked + 1, to: acked + uint64(len(payloads)), n: len(payloads), stub: stubbed,
		stream: stream, body: b, res: make(chan flightResult, 1)}, nil
}

// countShippedLocked counts f's entries as shipped (or resent).
// REQUIRES: s.mu held.
func (s *Shipper) countShippedLocked(f *flight) {
	if f.from <= s.mu.highShipped {
		s.mu.resent += min(f.to, s.mu.highShipped) - f.from + 1
	}
	if f.to > s.mu.highShipped {
		s.mu.highShipped = f.to
	}
}

// launch posts f in a goroutine of its own, which exits once the post
// returns (bounded by RequestTimeout and ctx).
func (s *Shipper) launch(ctx context.Context, f *flight) {
	s.mu.Lock()
	s.mu.inFlight++
	s.countShippedLocked(f)
	s.mu.Unlock()
	f.sent = s.opts.Now()
	f.wrote = make(chan struct{})
	var once sync.Once
	wrote := func() { once.Do(func() { close(f.wrote) }) }
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote() }})
	go func() {
		// Exits once the post returns (RequestTimeout bounds it).
		ack, err := s.post(tctx, f.body)
		wrote()
		f.res <- flightResult{ack, err}
	}()
}

// settle handles the answer to f: the cursor moves on an ack; a gap
// rewinds it to the receiver's mark; a body limit is learned.
func (s *Shipper) settle(f *flight, ack wire.Ack, err error) error {
	s.mu.Lock()
	s.mu.inFlight--
	s.mu.Unlock()
	stream, acked, sent := f.stream, f.acked, f.sent
	var gap *errGap
	var big *errTooLarge
	var conflict *errConflict
	switch {
	case errors.As(err, &conflict):
		s.conflicted(stream, conflict.msg)
		return nil
	case errors.As(err, &gap):
		s.mu.Lock()
		defer s.mu.Unlock()
		if stream != s.log.Stream() {
			return nil // about a stream replaced meanwhile
		}
		s.mu.lastContact = time.Now()
		s.mu.rewinds++
		s.mu.errors = 0
		s.rewindLocked(gap.hwm)
		return nil
	case errors.As(err, &big):
		// The peer's body limit is lower than this batch: learn it, and
		// split (a single entry goes as a stub next time).
		s.mu.Lock()
		lim := wire.Limits{MaxBody: big.limit}
		if s.mu.limits != nil {
			lim = *s.mu.limits
			if big.limit > 0 {
				lim.MaxBody = big.limit
			}
		}
		if lim.MaxBody <= 0 || int64(len(f.body)) <= lim.MaxBody {
			// It did not say, or its limit changed: aim below this batch.
			lim.MaxBody = int64(len(f.body)) - 1
		}
		s.mu.limits = &lim
		s.mu.Unlock()
		return err
	case err != nil:
		return err
	}
	if !s.answered(&ack, stream) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if stream != s.log.Stream() {
		return nil // replaced since answered checked: Rebase owns the cursor
	}
	if s.mu.conflict != "" {
		return nil // the link stopped on an earlier answer of this window
	}
	s.ackedLocked(ack, sent)
	rtt := time.Duration(s.opts.Now() - sent)
	if s.opts.ObserveShip != nil {
		s.opts.ObserveShip(s.peer.Name, rtt, f.n)
	}
	// Where the receiver's apply (its fsync) is most of the round trip, as
	// between two nodes on one LAN, a second batch on the wire only adds
	// fsyncs there; where the wire is, as between regions, it halves the
	// wait behind the batch in flight.
	apply := time.Duration(ack.ApplyMicros) * time.Microsecond
	s.mu.wireShare = ack.ApplyMicros > 0 && rtt-apply >= apply
	s.mu.shipped += uint64(f.n)
	if ack.HWM < acked {
		s.rewindLocked(ack.HWM)
	} else {
		// A receiver ahead of what was sent had those entries already
		// (same commits: answered checked the one at its mark).
		s.mu.acked = ack.HWM
		s.mu.ackedCommit = parseCommit(ack.HWMCommit)
	}
	return nil
}

// stub re-encodes a WAL entry as an oversize stub.
func (s *Shipper) stub(payload []byte, stream entry.StreamID) ([]byte, error) {
	defs := wire.Defaults{Origin: s.opts.Local, Stream: stream}
	c := wire.NewCodec()
	e, err := c.DecodeEntry(payload, defs)
	if err != nil {
		return nil, fmt.Errorf("transport: decode wal entry for a stub: %w", err)
	}
	st := e.Stub(len(payload))
	s.mu.Lock()
	s.mu.stubs++
	s.mu.Unlock()
	s.opts.Logger.Warn("entry too large for the peer: sent as a stub it will set aside as a dead letter",
		"peer", s.peer.Name, "index", e.Index, "bytes", len(payload), "key", e.Key)
	return c.AppendEntry(nil, &st, defs), nil
}

// ackedLocked records contact, flow hints and clock skew from an ack.
// REQUIRES: s.mu held.
func (s *Shipper) ackedLocked(ack wire.Ack, sent int64) {
	s.mu.lastContact = time.Now()
	s.mu.errors = 0
	s.mu.lastErr = ""
	s.mu.batches++
	s.mu.suggested = ack.SuggestedBatch
	if ack.PauseMS > 0 {
		s.mu.pauseUntil = time.Now().Add(time.Duration(ack.PauseMS) * time.Millisecond)
	}
	if ack.Now != 0 {
		mid := sent + (s.opts.Now()-sent)/2
		s.mu.skew = time.Duration(ack.Now - mid)
	}
}

// rewindLocked moves the cursor back to what the receiver says it has.
// REQUIRES: s.mu held.
func (s *Shipper) rewindLocked(hwm uint64) {
	if hwm > s.log.Last() {
		hwm = s.log.Last()
	}
	s.mu.acked = hwm
	s.mu.ackedCommit = hlc.Timestamp{}
	if hwm+1 < s.log.First() {
		s.mu.needsReseed = true
		s.mu.lastErr = fmt.Sprintf("receiver is at index %d, the WAL starts at %d: needs a re-seed", hwm, s.log.First())
	}
}

// post sends one batch and decodes the answer.
func (s *Shipper) post(ctx context.Context, body []byte) (wire.Ack, error) {
	// A node of the peer cluster that does not lead names the one that
	// does: the batch goes there at once (a redirect is never a failure).
	for hop := 0; ; hop++ {
		ack, err := s.postOnce(ctx, body)
		var nl *errNotLeader
		if !errors.As(err, &nl) || nl.leader == "" || hop == 2 {
			return ack, err
		}
		s.mu.Lock()
		from := s.mu.url
		s.mu.url = nl.leader
		s.mu.Unlock()
		s.opts.Logger.Info("peer node does not lead: following its leader", "peer", s.peer.Name, "from", from, "to", nl.leader)
	}
}

// errNotLeader is a 503 not_leader answer: a node of a cluster of several
// that does not lead now, naming the one that does when it knows.
type errNotLeader struct {
	leader string
	msg    string
}

func (e *errNotLeader) Error() string { return "transport: " + e.msg }

// learnNodesLocked records the peer cluster's nodes.
// REQUIRES: s.mu held.
func (s *Shipper) learnNodesLocked(nodes []string) {
	if len(nodes) > 64 {
		nodes = nodes[:64]
	}
	if slices.Equal(s.mu.nodes, nodes) {
		return
	}
	s.mu.nodes = slices.Clone(nodes)
}

// rotateLocked points the link at the next node of the peer cluster it
// knows (the configured URL among them), after the current one failed.
// REQUIRES: s.mu held.
func (s *Shipper) rotateLocked() {
	cands := []string{s.peer.URL}
	for _, u := range s.mu.nodes {
		if u != "" && !slices.Contains(cands, u) {
			cands = append(cands, u)
		}
	}
	if len(cands) < 2 {
		return
	}
	i := slices.Index(cands, s.mu.url)
	s.mu.url = cands[(i+1)%len(cands)]
}

// provenURL is a peer URL whose node proved the secret.
type provenURL struct {
	at     time.Time
	legacy bool // a build before proofs, let through by Peer.AllowUnproven
}

// proofTTL is how long a node's proof of the secret stands for its URL:
// every answer is authenticated besides (HeaderMAC), and the proof is what
// lets the secret go there at all.
const proofTTL = time.Minute

// prove makes the node at base prove it holds the secret before anything
// is sent there (proof.go). It reports whether the node runs a build
// before proofs (let through by Peer.AllowUnproven).
func (s *Shipper) prove(ctx context.Context, base string) (legacy bool, err error) {
	s.mu.Lock()
	if p, ok := s.mu.proven[base]; ok && time.Since(p.at) < proofTTL {
		s.mu.Unlock()
		return p.legacy, nil
	}
	s.mu.Unlock()
	nonce := wire.NewNonce()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+wire.PathProve, http.NoBody)
	if err != nil {
		return false, err
	}
	req.Header.Set(wire.HeaderOrigin, s.opts.Local)
	req.Header.Set(wire.HeaderNonce, nonce)
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return false, fmt.Errorf("transport: ask %s at %s to prove the secret: %w", s.peer.Name, base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return false, fmt.Errorf("transport: read the proof of %s at %s: %w", s.peer.Name, base, err)
	}
	var p wire.Proof
	switch {
	case resp.StatusCode == http.StatusNotFound && s.peer.AllowUnproven:
		s.opts.Logger.Warn("a node of the peer runs a build that cannot prove it holds the secret: sending it the secret unproven (--peer-allow-unproven); remove that once the peer is upgraded",
			"peer", s.peer.Name, "url", base)
		legacy = true
	case resp.StatusCode != http.StatusOK:
		return false, fmt.Errorf("%w: %s at %s answered %d to the proof request (nothing sent there): %s",
			ErrUnproven, s.peer.Name, base, resp.StatusCode, strings.TrimSpace(string(b)))
	case json.Unmarshal(b, &p) != nil:
		return false, fmt.Errorf("%w: %s at %s answered the proof request with %q (nothing sent there)", ErrUnproven, s.peer.Name, base, b)
	case p.Cluster != s.peer.Name:
		return false, fmt.Errorf("%w: the node at %s is of cluster %q, not %s (nothing sent there)", ErrUnproven, base, p.Cluster, s.peer.Name)
	case !wire.VerifyMAC(p.Proof, wire.ProofMAC(s.peer.Secret, s.opts.Local, s.peer.Name, nonce)):
		return false, fmt.Errorf("%w: the node at %s does not hold the secret shared with %s (nothing sent there)", ErrUnproven, base, s.peer.Name)
	}
	s.mu.Lock()
	if s.mu.proven == nil || len(s.mu.proven) > 64 {
		s.mu.proven = map[string]provenURL{}
	}
	s.mu.proven[base] = provenURL{at: time.Now(), legacy: legacy}
	s.mu.Unlock()
	return legacy, nil
}

// unproven forgets base's proof and points the link at the next node: its
// answer did not verify.
func (s *Shipper) unproven(base string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.proven, base)
	if s.mu.url == base {
		s.rotateLocked()
	}
}

func (s *Shipper) postOnce(ctx context.Context, body []byte) (wire.Ack, error) {
	var ack wire.Ack
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	s.mu.Lock()
	base := s.mu.url
	if s.mu.firstTry.IsZero() {
		s.mu.firstTry = time.Now()
	}
	s.mu.Unlock()
	var nonce string
	if s.peer.Secret != "" {
		legacy, err := s.prove(ctx, base)
		if err != nil {
			s.unproven(base)
			return ack, err
		}
		if !legacy {
			nonce = wire.NewNonce()
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/v1/replicate", bytes.NewReader(body))
	if err != nil {
		return ack, err
	}
	req.Header.Set("Content-Type", wire.ContentType)
	req.Header.Set(wire.HeaderOrigin, s.opts.Local)
	if s.peer.Secret != "" {
		req.Header.Set("Authorization", "Bearer "+s.peer.Secret)
	}
	if nonce != "" {
		req.Header.Set(wire.HeaderNonce, nonce)
	}
	req.Header.Set(wire.HeaderSent, strconv.FormatInt(time.Now().UnixNano(), 10))
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// This node of the peer is unreachable or too slow: the next try
			// goes to another (a follower there names the leader).
			s.mu.Lock()
			if s.mu.url == base {
				s.rotateLocked()
			}
			s.mu.Unlock()
		}
		return ack, fmt.Errorf("transport: post to %s: %w", s.peer.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return ack, fmt.Errorf("transport: read answer of %s: %w", s.peer.Name, err)
	}
	// An answer that moves anything (the cursor, the URL, the batch's
	// size) must come from a holder of the secret.
	// (A 503 moves the URL only when it is a not_leader answer; another
	// one, such as a node shutting down, is a failure like any.)
	moves := resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusRequestEntityTooLarge ||
		(resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(b, []byte(`"not_leader"`)))
	if moves && nonce != "" && !wire.VerifyMAC(resp.Header.Get(wire.HeaderMAC), wire.AnswerMAC(s.peer.Secret, nonce, resp.StatusCode, b)) {
		s.unproven(base)
		return ack, fmt.Errorf("%w: %s at %s answered %d without a valid %s: ignored", ErrUnproven, s.peer.Name, base, resp.StatusCode, wire.HeaderMAC)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if err := json.Unmarshal(b, &ack); err != nil {
			return ack, fmt.Errorf("transport: ack of %s: %w", s.peer.Name, err)
		}
		return ack, nil
	case http.StatusConflict:
		var e struct {
			Error struct {
				Code    string  `json:"code"`
				HWM     *uint64 `json:"hwm"`
				Version string  `json:"version"`
				Message string  `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code == "identity_conflict" {
			return ack, &errConflict{msg: e.Error.Message}
		}
		if json.Unmarshal(b, &e) == nil && e.Error.HWM != nil {
			return ack, &errGap{hwm: *e.Error.HWM}
		}
	case http.StatusTooManyRequests:
		return ack, fmt.Errorf("%w: %s", errNoPermit, strings.TrimSpace(string(b)))
	case http.StatusServiceUnavailable:
		var e struct {
			Error struct {
				Code    string   `json:"code"`
				Message string   `json:"message"`
				Leader  string   `json:"leader"`
				Nodes   []string `json:"nodes"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code == "not_leader" {
			s.mu.Lock()
			if len(e.Error.Nodes) > 0 {
				s.learnNodesLocked(e.Error.Nodes)
			}
			s.mu.Unlock()
			return ack, &errNotLeader{leader: e.Error.Leader, msg: fmt.Sprintf("%s at %s does not lead: %s", s.peer.Name, base, e.Error.Message)}
		}
	case http.StatusRequestEntityTooLarge:
		var e struct {
			Error struct {
				Limit int64 `json:"limit"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		return ack, &errTooLarge{limit: e.Error.Limit, msg: strings.TrimSpace(string(b))}
	}
	return ack, fmt.Errorf("transport: %s answered %d: %s", s.peer.Name, resp.StatusCode, strings.TrimSpace(string(b)))
}

// reseed streams a snapshot of the tree to the peer, then resumes normal
// shipping after the snapshot's applied index. The WAL is retained for the
// peer from before the snapshot was taken, so nothing falls in between. The
// last batch carries the trailer: the position in the real stream that the
// snapshot corresponds to, which the receiver commits as its high-water
// mark together with the batch, so the next heartbeat finds the peer where
// the shipper resumes and the re-seed ends there.
func (s *Shipper) reseed(ctx context.Context) error {
	s.mu.Lock()
	requested, rejoin := s.mu.owed, s.mu.rejoinSeed
	why := s.mu.reseedWhy
	switch {
	case requested:
		why = "the peer asked for one (it lost data)"
	case rejoin:
		why = "this node rejoined after losing data: the peer gets what only this node, or only some peers, had"
	case why == "" && s.mu.lastErr != "":
		why = s.mu.lastErr
	case why == "":
		why = "the peer needs entries the WAL no longer holds"
	}
	s.mu.wantReseed, s.mu.reseedWhy = false, ""
	s.mu.detached = false
	if s.opts.Applied != nil {
		// Hold the WAL from here on: entries after the snapshot's applied
		// index must still be there when shipping resumes.
		s.mu.acked = max(s.mu.acked, min(s.opts.Applied(), s.log.Last()))
	}
	s.mu.reseed = ReseedStatus{Running: true, Started: time.Now(), Runs: s.mu.reseed.Runs + 1,
		LastReason: why, Requested: requested}
	s.mu.Unlock()
	s.opts.Logger.Info("re-seed started", "peer", s.peer.Name, "why", why, "requested", requested, "rejoin", rejoin)

	snap, err := s.opts.Snapshots.NewSnapshot()
	if err != nil {
		return s.reseedDone(err)
	}
	defer snap.Close()
	total, err := snap.Count()
	if err != nil {
		return s.reseedDone(err)
	}
	applied := snap.LocalApplied()
	stream := s.log.Stream()
	if entry.StreamID(applied.Stream) != stream {
		// The stream was replaced since (or nothing was ever applied).
		applied = store.AppliedIndex{Stream: stream}
	}
	s.mu.Lock()
	s.mu.reseed.Total = total
	s.mu.Unlock()

	snapStream := entry.NewStreamID()
	commit := hlc.Timestamp{Wall: s.opts.Now()}
	codec := wire.NewCodec()
	defs := wire.Defaults{Origin: s.opts.Local, Stream: snapStream}
	var index uint64
	sent := 0
	// Range tombstones and counters go first (they are few), then every key.
	var extra []entry.Entry
	ranges, err := snap.Ranges()
	if err != nil {
		return s.reseedDone(err)
	}
	for _, r := range ranges {
		extra = append(extra, entry.Entry{Op: entry.OpDeleteRange, Key: r.Start, End: r.End, Stamp: r.Stamp.HLC, StampOrigin: r.Stamp.Origin})
	}
	counters, err := snap.Counters()
	if err != nil {
		return s.reseedDone(err)
	}
	for key, c := range counters {
		for comp, t := range c.Totals {
			t := t
			extra = append(extra, entry.Entry{Op: entry.OpCounter, Key: key, Ctr: &t, CtrComp: comp,
				Stamp: c.Stamp.HLC, StampOrigin: c.Stamp.Origin})
		}
	}
	next := func() (entry.Entry, bool, error) {
		if len(extra) > 0 {
			e := extra[0]
			extra = extra[1:]
			return e, true, nil
		}
		key, rec, ok, err := snap.Next()
		if err != nil || !ok {
			return entry.Entry{}, false, err
		}
		e := entry.Entry{Stamp: rec.Stamp.HLC, Op: entry.OpSet, Key: key, Value: rec.Value, StampOrigin: rec.Stamp.Origin}
		if rec.Tombstone {
			e.Op, e.Value = entry.OpDelete, nil
		}
		return e, true, nil
	}
	budget, _ := s.batchBudget()
	for done := false; !done; {
		var ents [][]byte
		size := 0
		for len(ents) < s.opts.MaxBatchEntries && size < budget {
			e, ok, err := next()
			if err != nil {
				return s.reseedDone(err)
			}
			if !ok {
				done = true
				break
			}
			index++
			e.Index, e.Origin, e.Stream, e.Commit = index, s.opts.Local, snapStream, commit
			if e.StampOrigin == s.opts.Local {
				e.StampOrigin = ""
			}
			if e.Stamp.IsZero() {
				e.Stamp = commit
			}
			p := codec.AppendEntry(nil, &e, defs)
			ents = append(ents, p)
			size += len(p)
		}
		s.mu.Lock()
		detached := s.mu.detached
		s.mu.Unlock()
		if detached {
			return s.reseedDone(errors.New("the peer was detached again (backlog overflow) during the re-seed"))
		}
		h := wire.Header{Sender: s.opts.Local, Stream: snapStream, Snapshot: true, Requested: requested, Rejoin: rejoin}
		if done {
			h.End = &wire.SnapshotEnd{Stream: stream, Index: applied.Index, Commit: applied.Commit}
			marks, err := snap.Marks()
			if err != nil {
				return s.reseedDone(err)
			}
			for _, m := range marks {
				// The receiver's own streams are its business.
				if m.Origin != s.peer.Name && len(h.Marks) < wire.MaxMarks {
					h.Marks = append(h.Marks, wire.Mark{Origin: m.Origin, Stream: m.Stream, Index: m.Index, Commit: m.Commit})
				}
			}
		}
		body := wire.AppendHeader(nil, &h, len(ents))
		for _, p := range ents {
			body = append(body, p...)
		}
		for attempt := 1; ; attempt++ {
			t0 := s.opts.Now()
			ack, err := s.post(ctx, body)
			if err == nil {
				s.mu.Lock()
				s.ackedLocked(ack, t0)
				s.mu.Unlock()
				break
			}
			if ctx.Err() != nil {
				return s.reseedDone(ctx.Err())
			}
			var gap *errGap
			if errors.As(err, &gap) {
				return s.reseedDone(fmt.Errorf("the receiver lost part of the snapshot (at %d of %d); restarting", gap.hwm, index))
			}
			s.mu.Lock()
			s.mu.errors++
			s.mu.lastErr = "re-seed: " + err.Error()
			s.mu.Unlock()
			if !sleep(ctx, s.backoff.Delay(attempt, s.rng)) {
				return s.reseedDone(ctx.Err())
			}
		}
		sent += len(ents)
		s.mu.Lock()
		s.mu.reseed.Sent = sent
		s.mu.Unlock()
	}
	if s.log.Stream() != stream {
		// The stream was replaced during the re-seed: its trailer named the
		// old one. The rejoin that follows re-seeds the peer again.
		return s.reseedDone(errors.New("the stream was replaced during the re-seed"))
	}
	s.mu.Lock()
	s.mu.needsReseed = false
	if applied.Index > s.mu.acked && applied.Index <= s.log.Last() {
		s.mu.acked = applied.Index
	}
	if s.mu.acked == applied.Index {
		s.mu.ackedCommit = applied.Commit
	} else {
		s.mu.ackedCommit = hlc.Timestamp{}
	}
	if requested {
		s.mu.owed = false
	}
	if rejoin {
		s.mu.rejoinSeed = false
	}
	s.mu.Unlock()
	s.flushCursor(true)
	s.opts.Logger.Info("re-seed done", "peer", s.peer.Name, "keys", sent, "resume_after", applied.Index)
	if s.opts.OnReseedDone != nil {
		s.opts.OnReseedDone(s.peer.Name, requested, rejoin)
	}
	return s.reseedDone(nil)
}

func (s *Shipper) reseedDone(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.reseed.Running = false
	s.mu.reseed.Finished = time.Now()
	if err != nil {
		s.mu.reseed.Error = err.Error()
		s.mu.needsReseed = true
		if s.mu.owed || s.mu.rejoinSeed {
			// A requested or rejoin re-seed retries as what it was.
			s.mu.needsReseed = false
		}
	} else {
		s.mu.reseed.Error = ""
	}
	return err
}

// flushCursor persists the acked cursor if it moved and the flush interval
// passed (or force).
func (s *Shipper) flushCursor(force bool) {
	s.mu.Lock()
	acked := s.mu.acked
	due := force || time.Since(s.mu.lastFlush) >= s.opts.CursorFlush
	if acked == s.mu.persisted || !due {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if err := s.cursors.SetCursor(s.peer.Name, entry.Cursor{Stream: s.log.Stream(), Index: acked}); err != nil {
		s.opts.Logger.Warn("persisting cursor", "peer", s.peer.Name, "err", err)
		return
	}
	s.mu.Lock()
	s.mu.persisted = acked
	s.mu.lastFlush = time.Now()
	s.mu.Unlock()
}

// Thresholds classify a link's health.
type Thresholds struct {
	// Lagging: entries behind whose oldest is older than this, or no
	// contact for this long while behind. Default 5s.
	Lagging time.Duration `json:"lagging"`
	// Stalled: the same past this. Default 60s.
	Stalled time.Duration `json:"stalled"`
}

// Backlog is what a peer has not acknowledged yet.
type Backlog struct {
	Entries   uint64
	Bytes     int64
	OldestAge time.Duration
}

// Backlog measures the link's backlog. commitWall reads the commit HLC wall
// time of a WAL entry (cached per cursor position).
func (s *Shipper) Backlog(commitWall func(index uint64) (int64, bool)) Backlog {
	s.mu.Lock()
	acked := s.mu.acked
	oldestIdx, oldestWall := s.mu.oldestIdx, s.mu.oldestWall
	s.mu.Unlock()
	last := s.log.Last()
	if last <= acked {
		return Backlog{}
	}
	b := Backlog{Entries: last - acked, Bytes: s.log.BytesAfter(acked)}
	if oldestIdx != acked+1 {
		wall, ok := commitWall(acked + 1)
		if !ok {
			return b
		}
		oldestIdx, oldestWall = acked+1, wall
		s.mu.Lock()
		s.mu.oldestIdx, s.mu.oldestWall = oldestIdx, oldestWall
		s.mu.Unlock()
	}
	b.OldestAge = max(0, time.Duration(s.opts.Now()-oldestWall))
	return b
}

// Status reports the link's figures.
func (s *Shipper) Status(th Thresholds, commitWall func(index uint64) (int64, bool)) Status {
	if th.Lagging == 0 {
		th.Lagging = 5 * time.Second
	}
	if th.Stalled == 0 {
		th.Stalled = 60 * time.Second
	}
	bl := s.Backlog(commitWall)
	s.mu.Lock()
	st := Status{
		Peer:              s.peer.Name,
		URL:               s.mu.url,
		Liveness:          s.mu.liveness,
		Nodes:             slices.Clone(s.mu.nodes),
		Acked:             s.mu.acked,
		LastContact:       s.mu.lastContact,
		ConsecutiveErrors: s.mu.errors,
		LastError:         s.mu.lastErr,
		InFlight:          s.mu.inFlight,
		Shipped:           s.mu.shipped,
		Resent:            s.mu.resent,
		Batches:           s.mu.batches,
		Rewinds:           s.mu.rewinds,
		PermitRefusals:    s.mu.permitRefs,
		Paused:            s.mu.paused,
		Detached:          s.mu.detached,
		NeedsReseed:       s.mu.needsReseed,
		Reseed:            s.mu.reseed,
		ClockSkewMS:       float64(s.mu.skew.Microseconds()) / 1000,
		Thresholds:        th,
		Conflict:          s.mu.conflict,
		ReseedOwed:        s.mu.owed,
		Limits:            s.mu.limits,
		PeerVersion:       s.mu.peerVersion,
		SendFailures:      s.mu.failures,
	}
	firstTry := s.mu.firstTry
	s.mu.Unlock()
	st.Last = s.log.Last()
	st.EntriesBehind, st.BytesBehind = bl.Entries, bl.Bytes
	st.OldestUnackedAge = bl.OldestAge.Seconds()
	sinceContact := time.Since(st.LastContact)
	switch {
	case st.Conflict != "":
		st.State = StateConflict
	case st.Reseed.Running:
		st.State = StateReseeding
	case st.NeedsReseed:
		st.State = StateNeedsReseed
	case st.Paused:
		st.State = StatePaused
	case st.Liveness == LiveDead:
		st.State = StateDead
	case st.Liveness == LiveLeft:
		st.State = StateLeft
	case st.LastContact.IsZero() && firstTry.IsZero():
		st.State = StateUnknown // nothing tried yet
	default:
		// How long the link has gone without contact (since the first
		// attempt, for a peer that never answered: a mistyped URL or a
		// firewall ages like any outage), and how old its backlog is.
		silent := sinceContact
		if st.LastContact.IsZero() {
			silent = time.Since(firstTry)
		}
		age := time.Duration(0)
		if st.EntriesBehind > 0 {
			age = bl.OldestAge
		}
		switch {
		case silent > th.Stalled || age > th.Stalled:
			st.State = StateStalled
		case silent > th.Lagging || age > th.Lagging || st.ConsecutiveErrors >= 3 ||
			(st.LastContact.IsZero() && st.ConsecutiveErrors > 0):
			st.State = StateLagging
		case st.LastContact.IsZero():
			st.State = StateUnknown // the first attempt is under way
		default:
			st.State = StateHealthy
		}
	}
	return st
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ErrUnproven: the peer node did not prove it holds the shared secret, or
// its answer did not carry a valid HeaderMAC.
var ErrUnproven = errors.New("transport: the peer node did not prove it holds the shared secret")

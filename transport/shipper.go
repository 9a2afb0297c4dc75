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
	"context"
	"errors"
	"fmt"
	"github.com/replicator/replicator/internal/secret"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/policy"
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
	NewSnapshot() (Snapshot, error)
}

// Snapshot is a consistent view of the tree, read once from start to end.
type Snapshot interface {
	// Count is how many keys Next returns.
	Count() (int, error)
	// LocalApplied is how far the local stream is applied in the view.
	LocalApplied() entry.AppliedIndex
	Ranges() ([]entry.RangeTombstone, error)
	Counters() (map[string]entry.Counter, error)
	// Marks are the high-water marks of every stream the view holds.
	Marks() ([]entry.HWM, error)
	// CollectedBelow is the cutoff below which the view's tree had
	// collected tombstones (a backfill's horizon).
	CollectedBelow() (hlc.Timestamp, error)
	// Next returns the next key and its record; ok is false at the end.
	Next() (key string, r entry.Record, ok bool, err error)
	// SeekGE makes the next Next return the first key at or above key.
	SeekGE(key string)
	Close()
}

// Peer is one configured peer cluster.
type Peer struct {
	Name   string // its cluster ID
	URL    string // base URL of its replicate endpoint
	Secret string // shared secret; "" with insecure peers
	// Secrets, when set, holds the secret sent (Secret is then unused) and
	// may change (a rotation reloaded it: secret.Pair); NewShipper makes
	// one of Secret otherwise.
	Secrets *secret.Pair
	// AllowUnproven sends the secret to a node of this peer that cannot
	// prove it holds it because it runs a build before proofs (its proof
	// endpoint answers 404): for the window of an upgrade only (proof.go).
	AllowUnproven bool
	// Compression is CompressionZstd to compress batch bodies toward a
	// node that says it decodes zstd, or "" / CompressionNone for none.
	Compression string
	// Fallbacks are more of the peer's URLs, tried when URL does not
	// answer (a peer added at run time with several).
	Fallbacks []string
}

// Link compressions (--peer-compression NAME=zstd|none).
const (
	CompressionNone = "none"
	CompressionZstd = "zstd"
)

// compressAbove is the smallest body a link compresses: below it (a
// heartbeat, a trickle's batch of one) the frame's overhead and the CPU
// buy nothing.
const compressAbove = 1024

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
	// Link returns what the cluster's log says of the link to peer: its
	// filters over the stream (nil: every key crosses every link).
	Link func(peer string) entry.LinkSettings
	// IdleBound, when set, returns a bound every entry appended later will
	// be committed above, and the stream's last index, read in that order
	// (heartbeats tell an idle frontier: wire.Header.Idle).
	IdleBound func() (hlc.Timestamp, uint64)
	// OpenStreams, when set, returns this cluster's open streams in byte
	// order: every stream that may still carry entries, this shipper's
	// among them (heartbeats tell them: wire.Header.Open).
	OpenStreams func() []entry.StreamID
	// Keeps, when set, returns the ranges whose deletes this cluster
	// keeps for its links other than to peer (entry.LinkSettings.
	// KeepSpans): heartbeats tell them with the filter (wire.Header.Keeps),
	// and the peer keeps this cluster's deletes there too.
	Keeps func(peer string) []wire.TargetSpans
	// Partial, when set, says this cluster may lack entries (or parts of
	// them) of origin's stream that the origin's filter toward it kept
	// home: a re-seed's trailer carries no mark of such a stream, nor of
	// one a filtered marker moved (the receiver would drop the origin's
	// own later delivery of them as already applied).
	Partial func(origin string, stream entry.StreamID) bool
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
	// OnBackfillDone, when set, is told that the peer took the backfill of
	// a generation of the link's settings (the node records it in the
	// log, which clears the pending ranges).
	OnBackfillDone func(peer string, generation uint64)
	// OnRewound, when set, is told (from Run's goroutine) that the peer
	// lost entries it had acknowledged and the shipper rewound, on a link
	// whose recorded filters kept ranges home that a widening backfilled:
	// the node makes them pending again (a peer restored from a backup
	// taken before a backfill came lacks it, whatever its marks say). An
	// error leaves it to the next pass of the loop.
	OnRewound func(peer string) error
	Logger    *slog.Logger
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
		}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
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
	// beforeShip, when set (tests only, export_test.go), runs on Run's
	// goroutine after the loop's checks and before a batch is built.
	beforeShip func()
	// beforeReseed, when set (tests only), runs between the heartbeat
	// that finds the peer reachable and the re-seed's start.
	beforeReseed func()

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
		wireShare bool
		errors    int
		lastErr   string
		inFlight  int
		shipped   uint64
		resent    uint64
		batches   uint64
		rewinds   uint64
		// rewound: a rewind since OnRewound was last told (maybeRebackfill).
		rewound     bool
		permitRefs  uint64
		highShipped uint64 // highest index ever sent, to count resends
		needsReseed bool
		detached    bool // the WAL is not retained for this peer
		paused      bool
		// sending counts posts carrying entries that passed the pause
		// gate and are on the wire; drained, when not nil, is closed when
		// it falls to 0 (a Pause waits on it).
		sending int
		drained chan struct{}
		// held is how far the peer said it holds heldStream (its mark, from
		// an answer); dead are the indexes of heldStream it said it set
		// aside as dead letters, and every index up to deadBelow counts as
		// not held either. Holds (WAIT) reads them.
		held       uint64
		heldStream entry.StreamID
		dead       map[uint64]struct{}
		deadBelow  uint64
		// snapDead: the re-seed under way had versions set aside.
		snapDead   bool
		wantReseed bool
		reseed     ReseedStatus
		suggested  int
		pauseUntil time.Time
		skew       time.Duration
		url        string
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
		// decodes: which of the peer's node URLs said they decode zstd
		// (wire.HeaderAcceptEncoding, on every answer).
		decodes map[string]bool
		// bytesRaw and bytesWire count request bodies before and after
		// compression (equal without it).
		bytesRaw, bytesWire uint64
		// owed: the peer asked for a re-seed; rejoinSeed: this node owes the
		// peer the re-seed that ends its own rejoin.
		owed, rejoinSeed bool
		// rejoining is this node's rejoin phase with the peer, told in
		// every heartbeat; phaseSent is the last one the peer confirmed.
		rejoining, phaseSent uint8
		lastHeartbeat        time.Time
		// filterTold is the filter the peer was last told (heartbeats,
		// Limits.OriginFilters), as String.
		filterTold string
		// openTold is the open streams the peer was last told (the
		// shipper's stream among them).
		openTold  []entry.StreamID
		reseedWhy string // why wantReseed was set
		// reseedRetry is when a failed re-seed may run again.
		reseedRetry time.Time
		conflict    string // non-empty: stopped, see OnConflict
		// backfill is the link's backfill; backfillRetry when a failed one
		// may run again.
		backfill      BackfillStatus
		backfillRetry time.Time
		// bw are the link's bandwidth buckets (bandwidth.go).
		bw limiters
	}
	// bg tracks the goroutines of a backfill and of a re-seed's snapshot
	// sent beside live entries: Run waits for them.
	bg sync.WaitGroup
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
	if peer.Secrets == nil {
		// One secret, never rotated: held as a pair all the same, so that
		// every request reads its secret and key ID one way.
		peer.Secrets = secret.NewPair(peer.Secret, "", 0)
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

func (s *Shipper) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Holds reports whether the peer holds the entries from index from to
// index to of stream, as far as its answers say (WAIT): its mark is at or
// past to in that stream, it set none of [from, to] aside as a dead
// letter, and no re-seed of it is owed, open or running (a re-seed moves
// the peer's mark before it carries what lies below it). A filtered
// marker also moves the mark: whether an entry crossed the link's filter
// is the caller's to judge.
func (s *Shipper) Holds(stream entry.StreamID, from, to uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.needsReseed || s.mu.wantReseed || s.mu.reseed.Running || s.mu.owed || s.mu.rejoinSeed || s.mu.conflict != "" {
		return false
	}
	if s.mu.limits == nil || !s.mu.limits.DeadLists {
		// A receiver that does not list what it sets aside (a build
		// before it) may hold dead letters its mark passed.
		return false
	}
	if stream != s.mu.heldStream || from == 0 || to < from || to > s.mu.held || from <= s.mu.deadBelow {
		return false
	}
	if uint64(len(s.mu.dead)) <= to-from {
		for i := range s.mu.dead {
			if i >= from && i <= to {
				return false
			}
		}
		return true
	}
	for i := from; i <= to; i++ {
		if _, dead := s.mu.dead[i]; dead {
			return false
		}
	}
	return true
}

// heldLocked records that the peer's mark of stream is at hwm, from an
// answer to a post of [from, to], with the indexes of them it said it set
// aside (a heartbeat's answer, [1, hwm], lists every one it holds now).
// What it once said it set aside stays so (a dead letter replayed since
// is under-counted, never one discarded over-counted). REQUIRES: s.mu
// held.
func (s *Shipper) heldLocked(stream entry.StreamID, hwm, from, to uint64, ack *wire.Ack) {
	if stream != s.mu.heldStream {
		s.mu.heldStream, s.mu.dead, s.mu.deadBelow = stream, nil, 0
	}
	s.mu.held = hwm
	if ack == nil {
		return
	}
	if ack.DeadMore {
		s.mu.deadBelow = max(s.mu.deadBelow, to)
	}
	for _, i := range ack.DeadLettered {
		if i < from || i > to {
			continue // not of this batch: not the answer's to say
		}
		if s.mu.dead == nil {
			s.mu.dead = map[uint64]struct{}{}
		}
		s.mu.dead[i] = struct{}{}
	}
	if len(s.mu.dead) > maxDeadKept {
		// Many dead letters: count none of them, nor anything below.
		for i := range s.mu.dead {
			s.mu.deadBelow = max(s.mu.deadBelow, i)
		}
		s.mu.dead = nil
	}
}

// maxDeadKept bounds the dead letters a link remembers for WAIT.
const maxDeadKept = 1 << 16

// Pause stops shipping (the WAL is still retained for the peer). It is a
// barrier: when it returns no batch of entries is on the wire and none
// will begin until Resume, so no write made after it returned reaches the
// peer meanwhile. A batch already on the wire is waited for (its answer,
// or its request timeout); one built but not yet sent is not sent (the
// gate is in postOnce, just before the request goes out), and is built
// again after Resume.
func (s *Shipper) Pause() {
	s.mu.Lock()
	s.mu.paused = true
	var wait chan struct{}
	if s.mu.sending > 0 {
		if s.mu.drained == nil {
			s.mu.drained = make(chan struct{})
		}
		wait = s.mu.drained
	}
	s.mu.Unlock()
	s.wake()
	if wait != nil {
		<-wait
	}
}

// errPaused: a post of entries found the link paused as it was about to
// go on the wire, and sent nothing. Not a failure of the link.
var errPaused = errors.New("transport: the link is paused: nothing sent")

// beginSend lets one post of entries onto the wire, unless the link is
// paused; endSend ends it.
func (s *Shipper) beginSend() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.paused {
		return false
	}
	s.mu.sending++
	return true
}

func (s *Shipper) endSend() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.sending--
	if s.mu.sending == 0 && s.mu.drained != nil {
		close(s.mu.drained)
		s.mu.drained = nil
	}
}

// Resume undoes Pause.
func (s *Shipper) Resume() { s.mu.Lock(); s.mu.paused = false; s.mu.Unlock(); s.wake() }

// Rebase points the link at the local stream after the node replaced it
// (Log now returns the new stream): the peer has nothing of it yet, and
// whatever it missed of the old one arrives by a re-seed.
func (s *Shipper) Rebase() {
	s.mu.Lock()
	s.mu.acked, s.mu.persisted, s.mu.highShipped = 0, 0, 0
	s.mu.ackedCommit = hlc.Timestamp{}
	s.heldLocked(s.log.Stream(), 0, 0, 0, nil)
	s.mu.conflict = ""
	s.mu.oldestIdx = 0
	s.mu.Unlock()
	if err := s.cursors.SetCursor(s.peer.Name, entry.Cursor{Stream: s.log.Stream()}); err != nil {
		s.opts.Logger.Warn("persisting cursor", "peer", s.peer.Name, "err", err)
	}
	s.wake()
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
	defer s.bg.Wait()
	for ctx.Err() == nil {
		s.maybeRebackfill()
		s.maybeBackfill(ctx)
		s.mu.Lock()
		acked, reseed, paused, pause := s.mu.acked, s.mu.needsReseed, s.mu.paused, s.mu.pauseUntil
		want := (s.mu.wantReseed || s.mu.owed || s.mu.rejoinSeed || (reseed && s.opts.AutoReseed)) &&
			!s.mu.reseed.Running && !time.Now().Before(s.mu.reseedRetry)
		conflict := s.mu.conflict != ""
		// The rejoin phase goes out at once when it changed, and with every
		// heartbeat; a busy link still sends one every few heartbeats so
		// the peer's record of it cannot go stale.
		// The first heartbeat goes out at once: its answer says whether the
		// peer holds a re-seed open that this node must send again.
		ask := s.mu.rejoining != s.mu.phaseSent ||
			s.mu.lastHeartbeat.IsZero() || time.Since(s.mu.lastHeartbeat) >= 5*s.opts.Heartbeat
		s.mu.Unlock()
		ask = ask || s.filterUntold() || s.openUntold()
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
			if s.beforeReseed != nil {
				s.beforeReseed()
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
		if s.beforeShip != nil {
			s.beforeShip()
		}
		if err := s.shipOnce(ctx, acked); err != nil && ctx.Err() == nil && !errors.Is(err, errPaused) {
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

// secret is the secret the link sends now, and its key ID.
func (s *Shipper) secret() (string, string) { return s.peer.Secrets.Send() }

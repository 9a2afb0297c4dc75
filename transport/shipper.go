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
	"strings"
	"sync"
	"time"

	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/policy"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

// Log is what a shipper reads: the local WAL.
type Log interface {
	Stream() wal.StreamID
	First() uint64
	Last() uint64
	ReadRaw(index uint64) ([]byte, error)
	Notify() <-chan struct{}
	BytesAfter(index uint64) int64
}

// Cursors persists shippers' positions.
type Cursors interface {
	Cursor(peer string) (store.Cursor, bool, error)
	SetCursor(peer string, c store.Cursor) error
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
}

// Options configure shippers. Zero fields take defaults.
type Options struct {
	// Local is this node's cluster ID, the batches' sender.
	Local string
	// MaxBatchEntries bounds the entries of one batch. Default 2048.
	MaxBatchEntries int
	// MaxBatchBytes bounds the encoded entries of one batch. Default 4 MiB.
	MaxBatchBytes int
	// Linger is how long a shipper waits for a batch to fill once it has
	// something to send. Default 2ms; negative means no wait.
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
	// Heartbeat is how often an idle link sends an empty batch: it keeps
	// the link's health current, measures clock skew, and learns the
	// receiver's high-water mark (a peer that lost its data is noticed and
	// re-seeded). Default 1s.
	Heartbeat time.Duration
	// ObserveShip, when set, is told each acknowledged batch's round trip.
	ObserveShip func(peer string, d time.Duration, entries int)
	Logger      *slog.Logger
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.MaxBatchEntries == 0 {
		o.MaxBatchEntries = 2048
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = 4 << 20
	}
	if o.Linger == 0 {
		o.Linger = 2 * time.Millisecond
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
	StateUnknown     = "unknown" // never contacted
	StateHealthy     = "healthy"
	StateLagging     = "lagging"
	StateStalled     = "stalled"
	StateNeedsReseed = "needs_reseed"
	StateReseeding   = "reseeding"
	StatePaused      = "paused"
	StateDead        = "dead" // gossip: the peer stopped answering probes
	StateLeft        = "left" // gossip: the peer left gracefully
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
	// Liveness is what gossip says of the peer (empty without gossip).
	Liveness string `json:"liveness,omitempty"`
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
		acked       uint64 // the peer has every entry up to here
		persisted   uint64
		lastFlush   time.Time
		lastContact time.Time
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
		liveness    string // from gossip: alive, suspect, dead, left ("" without gossip)
		oldestIdx   uint64 // oldestWall is the commit wall of entry oldestIdx
		oldestWall  int64
	}
	buf []byte
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
	}
	s.mu.acked, s.mu.persisted = acked, acked
	s.mu.url = peer.URL
	if !ok || c.Stream != stream {
		if err := cursors.SetCursor(peer.Name, store.Cursor{Stream: stream, Index: acked}); err != nil {
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

// Reseed asks for a re-seed now, needed or not.
func (s *Shipper) Reseed() { s.mu.Lock(); s.mu.wantReseed = true; s.mu.Unlock(); s.wake() }

// Detach stops retaining the WAL for the peer (overflow mode "detach"): it
// is marked needs_reseed and, with AutoReseed, re-seeded once reachable.
func (s *Shipper) Detach(why string) {
	s.mu.Lock()
	first := !s.mu.detached
	s.mu.detached, s.mu.needsReseed = true, true
	s.mu.lastErr = why
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
		want := s.mu.wantReseed || (reseed && s.opts.AutoReseed)
		s.mu.Unlock()
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

// heartbeat sends an empty batch of the stream. The ack carries the
// receiver's high-water mark: one below the cursor means the receiver lost
// entries (its data was wiped or restored), and the shipper rewinds.
func (s *Shipper) heartbeat(ctx context.Context) error {
	body := AppendBatchHeader(nil, s.opts.Local, s.log.Stream(), 0)
	sent := s.opts.Now()
	ack, err := s.post(ctx, body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ackedLocked(ack, sent)
	if ack.HWM < s.mu.acked && !s.mu.needsReseed {
		s.opts.Logger.Warn("peer is behind its cursor: rewinding", "peer", s.peer.Name, "cursor", s.mu.acked, "peer_hwm", ack.HWM)
		s.mu.rewinds++
		s.rewindLocked(ack.HWM)
	}
	return nil
}

// errGap carries the receiver's high-water mark from a 409 refusal.
type errGap struct{ hwm uint64 }

func (e *errGap) Error() string { return fmt.Sprintf("receiver is at index %d: rewinding", e.hwm) }

var errNoPermit = errors.New("transport: receiver has no replay permit free (429)")

// shipOnce sends one batch after acked and handles the answer.
func (s *Shipper) shipOnce(ctx context.Context, acked uint64) error {
	last := s.log.Last()
	limit := s.batchLimit()
	var payloads [][]byte
	size := 0
	for i := acked + 1; i <= last && len(payloads) < limit; i++ {
		p, err := s.log.ReadRaw(i)
		if err != nil {
			if errors.Is(err, wal.ErrNotFound) && i < s.log.First() {
				s.setReseed(fmt.Sprintf("entry %d was truncated before the peer acked it", i))
				return nil
			}
			return fmt.Errorf("transport: read wal entry %d for %s: %w", i, s.peer.Name, err)
		}
		if len(payloads) > 0 && size+len(p) > s.opts.MaxBatchBytes {
			break
		}
		payloads = append(payloads, p)
		size += len(p)
	}
	if len(payloads) == 0 {
		return nil
	}
	s.buf = AppendBatchHeader(s.buf[:0], s.opts.Local, s.log.Stream(), len(payloads))
	for _, p := range payloads {
		s.buf = append(s.buf, p...)
	}
	from, to := acked+1, acked+uint64(len(payloads))
	s.mu.Lock()
	s.mu.inFlight++
	if from <= s.mu.highShipped {
		s.mu.resent += min(to, s.mu.highShipped) - from + 1
	}
	if to > s.mu.highShipped {
		s.mu.highShipped = to
	}
	s.mu.Unlock()
	sent := s.opts.Now()
	ack, err := s.post(ctx, s.buf)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.inFlight--
	var gap *errGap
	switch {
	case errors.As(err, &gap):
		s.mu.lastContact = time.Now()
		s.mu.rewinds++
		s.mu.errors = 0
		s.rewindLocked(gap.hwm)
		return nil
	case err != nil:
		return err
	}
	s.ackedLocked(ack, sent)
	if s.opts.ObserveShip != nil {
		s.opts.ObserveShip(s.peer.Name, time.Duration(s.opts.Now()-sent), len(payloads))
	}
	s.mu.shipped += uint64(len(payloads))
	if ack.HWM > to {
		// The receiver claims more than was sent: trust only what it was
		// sent (it may have reset; the next gap answer will tell).
		ack.HWM = to
	}
	if ack.HWM < acked {
		s.rewindLocked(ack.HWM)
	} else {
		s.mu.acked = ack.HWM
	}
	return nil
}

// ackedLocked records contact, flow hints and clock skew from an ack.
// REQUIRES: s.mu held.
func (s *Shipper) ackedLocked(ack Ack, sent int64) {
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
	if hwm+1 < s.log.First() {
		s.mu.needsReseed = true
		s.mu.lastErr = fmt.Sprintf("receiver is at index %d, the WAL starts at %d: needs a re-seed", hwm, s.log.First())
	}
}

// post sends one batch and decodes the answer.
func (s *Shipper) post(ctx context.Context, body []byte) (Ack, error) {
	var ack Ack
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	s.mu.Lock()
	base := s.mu.url
	s.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/v1/replicate", bytes.NewReader(body))
	if err != nil {
		return ack, err
	}
	req.Header.Set("Content-Type", ContentType)
	req.Header.Set(HeaderOrigin, s.opts.Local)
	if s.peer.Secret != "" {
		req.Header.Set("Authorization", "Bearer "+s.peer.Secret)
	}
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return ack, fmt.Errorf("transport: post to %s: %w", s.peer.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return ack, fmt.Errorf("transport: read answer of %s: %w", s.peer.Name, err)
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
				HWM *uint64 `json:"hwm"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.HWM != nil {
			return ack, &errGap{hwm: *e.Error.HWM}
		}
	case http.StatusTooManyRequests:
		return ack, fmt.Errorf("%w: %s", errNoPermit, strings.TrimSpace(string(b)))
	}
	return ack, fmt.Errorf("transport: %s answered %d: %s", s.peer.Name, resp.StatusCode, strings.TrimSpace(string(b)))
}

// reseed streams a snapshot of the tree to the peer, then resumes normal
// shipping after the snapshot's applied index. The WAL is retained for the
// peer from before the snapshot was taken, so nothing falls in between.
func (s *Shipper) reseed(ctx context.Context) error {
	s.mu.Lock()
	s.mu.wantReseed = false
	s.mu.detached = false
	if s.opts.Applied != nil {
		// Hold the WAL from here on: entries after the snapshot's applied
		// index must still be there when shipping resumes.
		s.mu.acked = max(s.mu.acked, min(s.opts.Applied(), s.log.Last()))
	}
	s.mu.reseed = ReseedStatus{Running: true, Started: time.Now(), Runs: s.mu.reseed.Runs + 1}
	s.mu.Unlock()
	s.opts.Logger.Info("re-seed started", "peer", s.peer.Name)

	snap, err := s.opts.Snapshots.NewSnapshot()
	if err != nil {
		return s.reseedDone(err)
	}
	defer snap.Close()
	total, err := snap.Count()
	if err != nil {
		return s.reseedDone(err)
	}
	stream, applied := snap.LocalApplied()
	if wal.StreamID(stream) != s.log.Stream() {
		applied = 0
	}
	s.mu.Lock()
	s.mu.reseed.Total = total
	s.mu.Unlock()

	snapStream := wal.NewStreamID()
	commit := hlc.Timestamp{Wall: s.opts.Now()}
	codec := wal.NewCodec()
	defs := wal.Defaults{Origin: s.opts.Local, Stream: snapStream}
	var index uint64
	sent := 0
	// Range tombstones and counters go first (they are few), then every key.
	var extra []wal.Entry
	ranges, err := snap.Ranges()
	if err != nil {
		return s.reseedDone(err)
	}
	for _, r := range ranges {
		extra = append(extra, wal.Entry{Op: store.OpDeleteRange, Key: r.Start, End: r.End, Stamp: r.Stamp.HLC, StampOrigin: r.Stamp.Origin})
	}
	counters, err := snap.Counters()
	if err != nil {
		return s.reseedDone(err)
	}
	for key, c := range counters {
		for cluster, t := range c.Totals {
			t := t
			extra = append(extra, wal.Entry{Op: store.OpCounter, Key: key, Ctr: &t, Stamp: c.Stamp.HLC, StampOrigin: cluster})
		}
	}
	next := func() (wal.Entry, bool, error) {
		if len(extra) > 0 {
			e := extra[0]
			extra = extra[1:]
			return e, true, nil
		}
		key, rec, ok, err := snap.Next()
		if err != nil || !ok {
			return wal.Entry{}, false, err
		}
		e := wal.Entry{Stamp: rec.Stamp.HLC, Op: store.OpSet, Key: key, Value: rec.Value, StampOrigin: rec.Stamp.Origin}
		if rec.Tombstone {
			e.Op, e.Value = store.OpDelete, nil
		}
		return e, true, nil
	}
	for done := false; !done; {
		var ents [][]byte
		size := 0
		for len(ents) < s.opts.MaxBatchEntries && size < s.opts.MaxBatchBytes {
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
			if e.StampOrigin == s.opts.Local && e.Op != store.OpCounter {
				e.StampOrigin = ""
			}
			p := codec.AppendEntry(nil, &e, defs)
			ents = append(ents, p)
			size += len(p)
		}
		if len(ents) == 0 {
			break
		}
		s.mu.Lock()
		detached := s.mu.detached
		s.mu.Unlock()
		if detached {
			return s.reseedDone(errors.New("the peer was detached again (backlog overflow) during the re-seed"))
		}
		body := appendHeader(nil, s.opts.Local, snapStream, len(ents), true)
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
	s.mu.Lock()
	s.mu.needsReseed = false
	if applied > s.mu.acked && applied <= s.log.Last() {
		s.mu.acked = applied
	}
	s.mu.Unlock()
	s.flushCursor(true)
	s.opts.Logger.Info("re-seed done", "peer", s.peer.Name, "keys", sent, "resume_after", applied)
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
	if err := s.cursors.SetCursor(s.peer.Name, store.Cursor{Stream: s.log.Stream(), Index: acked}); err != nil {
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
	}
	s.mu.Unlock()
	st.Last = s.log.Last()
	st.EntriesBehind, st.BytesBehind = bl.Entries, bl.Bytes
	st.OldestUnackedAge = bl.OldestAge.Seconds()
	sinceContact := time.Since(st.LastContact)
	switch {
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
	case st.LastContact.IsZero():
		st.State = StateUnknown
	case st.EntriesBehind > 0 && (bl.OldestAge > th.Stalled || sinceContact > th.Stalled):
		st.State = StateStalled
	case st.EntriesBehind > 0 && (bl.OldestAge > th.Lagging || sinceContact > th.Lagging || st.ConsecutiveErrors >= 3):
		st.State = StateLagging
	default:
		st.State = StateHealthy
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

// Package transport is the outbound half of replication: one shipper per
// (local stream, peer) reads the WAL after the peer's acknowledged cursor,
// packs msgpack batches, POSTs them to the peer's acceptor, and advances the
// cursor on each ack. Delivery is at-least-once: a failure resends the very
// same entries (same WAL identities, never re-stamped) after a jittered
// exponential backoff, and the acceptor drops what it already has.
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
}

// Cursors persists shippers' positions.
type Cursors interface {
	Cursor(peer string) (store.Cursor, bool, error)
	SetCursor(peer string, c store.Cursor) error
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
	// Now reads the physical clock in nanoseconds, for status ages.
	Now    func() int64
	Logger *slog.Logger
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
	StatePaused      = "paused"
)

// Status is a link's figures.
type Status struct {
	Peer              string    `json:"peer"`
	URL               string    `json:"url"`
	State             string    `json:"state"`
	Acked             uint64    `json:"acked_index"`
	Last              uint64    `json:"last_index"`
	EntriesBehind     uint64    `json:"entries_behind"`
	BytesBehind       int64     `json:"bytes_behind"`
	OldestUnackedAge  float64   `json:"oldest_unacked_age_seconds"`
	LastContact       time.Time `json:"last_contact"`
	ConsecutiveErrors int       `json:"consecutive_errors"`
	LastError         string    `json:"last_error,omitempty"`
	InFlight          int       `json:"in_flight_batches"`
	Shipped           uint64    `json:"shipped_entries"`
	Resent            uint64    `json:"resent_entries"`
	Batches           uint64    `json:"batches"`
	Rewinds           uint64    `json:"rewinds"`
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
		highShipped uint64 // highest index ever sent, to count resends
		needsReseed bool
		suggested   int
		pauseUntil  time.Time
	}
	buf []byte
}

// NewShipper loads the peer's cursor. A cursor of another stream (the WAL
// was recreated) starts the new stream from its beginning.
func NewShipper(peer Peer, log Log, cursors Cursors, opts Options) (*Shipper, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Shipper{peer: peer, log: log, cursors: cursors, opts: opts,
		rng:     rand.New(rand.NewPCG(uint64(opts.Now()), uint64(len(peer.Name)))),
		backoff: policy.Backoff{Initial: opts.BackoffMin, Max: opts.BackoffMax, Jitter: opts.Jitter}}
	c, ok, err := cursors.Cursor(peer.Name)
	if err != nil {
		return nil, err
	}
	var acked uint64
	stream := log.Stream()
	switch {
	case ok && c.Stream == stream:
		acked = c.Index
		// The WAL is only ever truncated below what every peer acked, so
		// a persisted cursor behind the retained WAL just lost a flush.
		if first := log.First(); acked+1 < first {
			acked = first - 1
		}
	case log.First() > 1:
		// A new peer, or a new stream after the old one was lost: what is
		// no longer in the WAL must come from a snapshot.
		s.mu.needsReseed = true
	}
	s.mu.acked, s.mu.persisted = acked, acked
	if !ok || c.Stream != stream {
		if err := cursors.SetCursor(peer.Name, store.Cursor{Stream: stream, Index: acked}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Peer returns the peer the shipper ships to.
func (s *Shipper) Peer() Peer { return s.peer }

// Acked returns the peer's acknowledged index (in memory, ahead of what is
// persisted).
func (s *Shipper) Acked() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.acked
}

// NeedsReseed reports whether the peer misses entries the WAL no longer has.
func (s *Shipper) NeedsReseed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.needsReseed
}

// Run ships until ctx is done, then persists the cursor. It is the
// shipper's only goroutine and returns when ctx is cancelled.
func (s *Shipper) Run(ctx context.Context) {
	defer s.flushCursor(true)
	for ctx.Err() == nil {
		s.mu.Lock()
		acked, reseed, pause := s.mu.acked, s.mu.needsReseed, s.mu.pauseUntil
		s.mu.Unlock()
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
			select {
			case <-ctx.Done():
				return
			case <-notify:
			case <-time.After(s.opts.CursorFlush):
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
		if err := s.shipOnce(ctx, acked); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			s.mu.errors++
			n := s.mu.errors
			s.mu.lastErr = err.Error()
			s.mu.Unlock()
			d := s.backoff.Delay(n, s.rng)
			s.opts.Logger.Debug("ship failed; backing off", "peer", s.peer.Name, "attempt", n, "delay", d, "err", err)
			if !sleep(ctx, d) {
				return
			}
		}
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

// errGap carries the receiver's high-water mark from a 409 refusal.
type errGap struct{ hwm uint64 }

func (e *errGap) Error() string { return fmt.Sprintf("receiver is at index %d: rewinding", e.hwm) }

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
	s.mu.lastContact = time.Now()
	s.mu.errors = 0
	s.mu.lastErr = ""
	s.mu.batches++
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
	s.mu.suggested = ack.SuggestedBatch
	if ack.PauseMS > 0 {
		s.mu.pauseUntil = time.Now().Add(time.Duration(ack.PauseMS) * time.Millisecond)
	}
	return nil
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(s.peer.URL, "/")+"/v1/replicate", bytes.NewReader(body))
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
	}
	return ack, fmt.Errorf("transport: %s answered %d: %s", s.peer.Name, resp.StatusCode, strings.TrimSpace(string(b)))
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
	Lagging time.Duration
	// Stalled: the same past this. Default 60s.
	Stalled time.Duration
}

// Status reports the link's figures. avgEntryBytes estimates bytes behind.
func (s *Shipper) Status(th Thresholds, avgEntryBytes float64, oldestCommitWall func(index uint64) (int64, bool)) Status {
	if th.Lagging == 0 {
		th.Lagging = 5 * time.Second
	}
	if th.Stalled == 0 {
		th.Stalled = 60 * time.Second
	}
	s.mu.Lock()
	st := Status{
		Peer:              s.peer.Name,
		URL:               s.peer.URL,
		Acked:             s.mu.acked,
		LastContact:       s.mu.lastContact,
		ConsecutiveErrors: s.mu.errors,
		LastError:         s.mu.lastErr,
		InFlight:          s.mu.inFlight,
		Shipped:           s.mu.shipped,
		Resent:            s.mu.resent,
		Batches:           s.mu.batches,
		Rewinds:           s.mu.rewinds,
	}
	reseed := s.mu.needsReseed
	s.mu.Unlock()
	st.Last = s.log.Last()
	if st.Last > st.Acked {
		st.EntriesBehind = st.Last - st.Acked
		st.BytesBehind = int64(avgEntryBytes * float64(st.EntriesBehind))
		if wall, ok := oldestCommitWall(st.Acked + 1); ok {
			st.OldestUnackedAge = max(0, time.Duration(s.opts.Now()-wall).Seconds())
		}
	}
	age := time.Duration(st.OldestUnackedAge * float64(time.Second))
	sinceContact := time.Since(st.LastContact)
	switch {
	case reseed:
		st.State = StateNeedsReseed
	case st.LastContact.IsZero():
		st.State = StateUnknown
	case st.EntriesBehind > 0 && (age > th.Stalled || sinceContact > th.Stalled):
		st.State = StateStalled
	case st.EntriesBehind > 0 && (age > th.Lagging || sinceContact > th.Lagging):
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

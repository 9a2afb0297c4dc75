package transport

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/wire"
)

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
	if c := s.budgetCap(false); c > 0 {
		budget = max(min(budget, c-batchOverhead), 1)
	}
	return budget, peerMax
}

// snapshotBudget is batchBudget for a re-seed's or a backfill's batches,
// which also fit the snapshot bucket of the link's limit.
func (s *Shipper) snapshotBudget() int {
	budget, _ := s.batchBudget()
	if c := s.budgetCap(true); c > 0 {
		budget = max(min(budget, c-batchOverhead), 1)
	}
	return budget
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
	if !s.knowsLimits() {
		// Whether the peer takes filtered markers and causal contexts is
		// in its answers: ask (entries sent without contexts would make
		// the conflicts they win only possible ones there).
		if err := s.heartbeat(ctx); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if !s.knowsLimits() {
			return errors.New("the peer has not said what it takes yet (its answer had no limits)")
		}
	}
	if s.openUntold() {
		// The peer records this cluster's open streams: it is told them
		// before any entry of a stream it has not heard of flows.
		if err := s.heartbeat(ctx); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
	}
	f, err := s.build(acked, take(), true)
	if errors.Is(err, errNoMarkers) || errors.Is(err, errNoExpiry) {
		// Ask again before the next try: the peer may have been upgraded.
		_ = s.heartbeat(ctx)
	}
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
		ack, err := s.post(entriesPost(ctx), f.body)
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
	proj := s.projector(stream, acked)
	if proj != nil && !s.takesMarkers() {
		return nil, errNoMarkers
	}
	var payloads [][]byte
	size := 0
	stubbed := false
	ctxOK, expiryOK, floorsOK := s.takesContexts(), s.takesExpiry(), s.takesFloors()
	var codec *wire.Codec
	if !ctxOK || !expiryOK || !floorsOK {
		codec = wire.NewCodec()
	}
	to := acked
	for i := acked + 1; i <= last && len(payloads) < limit && i-acked <= maxScan; i++ {
		p, err := s.log.ReadRaw(i)
		if err != nil {
			if errors.Is(err, entry.ErrNotKept) && i < s.log.First() {
				s.setReseed(fmt.Sprintf("entry %d was truncated before the peer acked it", i))
				return nil, nil
			}
			return nil, fmt.Errorf("transport: read wal entry %d for %s: %w", i, s.peer.Name, err)
		}
		if proj != nil {
			if p, err = proj.project(i, p); err != nil {
				return nil, err
			}
			if p == nil {
				to = i // the pending marker covers it
				continue
			}
			if m := proj.flush(); m != nil {
				// A marker is a few bytes: it goes whatever the budget.
				payloads = append(payloads, m)
				size += len(m)
				if len(payloads) >= limit {
					break // entry i is next time's
				}
			}
		}
		if !expiryOK || !floorsOK {
			held, err := heldBack(codec, p, wire.Defaults{Origin: s.opts.Local, Stream: stream}, expiryOK, floorsOK)
			if err != nil {
				return nil, fmt.Errorf("transport: decode wal entry %d to look for an expiry or floors: %w", i, err)
			}
			if held && len(payloads) == 0 {
				return nil, errNoExpiry
			}
			if held {
				break // what comes before it goes
			}
		}
		if !ctxOK {
			if p, err = stripContexts(codec, p, wire.Defaults{Origin: s.opts.Local, Stream: stream}); err != nil {
				return nil, fmt.Errorf("transport: decode wal entry %d to strip its contexts: %w", i, err)
			}
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
		to = i
	}
	if proj != nil {
		if m := proj.flush(); m != nil {
			payloads = append(payloads, m)
			size += len(m)
		}
	}
	if len(payloads) == 0 {
		return nil, nil
	}
	b := wire.AppendBatchHeader((*buf)[:0], s.opts.Local, stream, len(payloads))
	for _, p := range payloads {
		b = append(b, p...)
	}
	*buf = b
	return &flight{acked: acked, from: acked + 1, to: to, n: len(payloads), stub: stubbed,
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
	tctx := httptrace.WithClientTrace(entriesPost(ctx), &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote() }})
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
	if !s.takeAckLocked(ack, stream) {
		return nil
	}
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
	s.heldLocked(stream, ack.HWM, f.from, f.to, &ack)
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

// takeAckLocked moves the cursor on the peer's answer to a post of stream
// sent earlier, unless the link was replaced since answered checked it
// (Rebase owns the cursor then) or stopped on an earlier answer of the
// window; it reports whether it did. REQUIRES: s.mu held.
func (s *Shipper) takeAckLocked(ack wire.Ack, stream entry.StreamID) bool {
	if stream != s.log.Stream() || s.mu.conflict != "" {
		return false
	}
	s.ackedLocked(ack)
	return true
}

package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

// The committer is the write path's single writer. Concurrent writes queue
// as proposals; the committer takes as many as are waiting (up to
// MaxGroupEntries), stamps them in order, appends them to the WAL with one
// write and one fsync, applies them to Pebble in one batch together with the
// applied index and the HLC high-water mark, and only then answers them.
//
// One goroutine does all of it, so groups reach Pebble in WAL order and the
// store's applied index only grows. (A two-stage pipeline, fsyncing group
// N+1 while applying group N, measured slower on 2 cores: it splits the
// writers over two half-size groups, and the fsync's fixed cost dominates.)
//
// Crash points and what they leave:
//   - before the WAL fsync: nothing acknowledged, nothing durable;
//   - after the fsync, before Pebble: recovery re-applies from the WAL;
//   - after Pebble, before the answer: the write is durable, the caller saw
//     a failed call, which is an unknown outcome by contract.

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

const (
	stateQueued int32 = iota
	stateTaken
	stateCancelled
)

type proposal struct {
	entry wal.Entry
	// pin is the caller's pinned LWW stamp (an idempotency scope); zero
	// means the commit HLC.
	pin hlc.Timestamp
	// idem is the keyed request this write answers, if any.
	idem *idemRequest
	// cond is a precondition decided in commit order (If-Match,
	// If-None-Match).
	cond *Condition
	// delta is a counter increment (op counter): the entry then carries
	// this cluster's resulting totals, computed in commit order, and
	// counterValue the counter's value right after it, here.
	delta        int64
	counterValue int64
	state        atomic.Int32
	done         chan struct{}

	// results, valid after done is closed
	outcome store.Outcome
	// replay is set when the answer is a recorded one: nothing was written.
	replay *store.IdemRecord
	// replayOf is an earlier proposal of the same group under the same key:
	// this one is answered with its record.
	replayOf *proposal
	err      error
}

// idemRequest is a request carrying an Idempotency-Key.
type idemRequest struct {
	key         string
	fingerprint []byte
	// answer is the shape of the recorded answer, opID a batch's
	// operation ID (machine.Answer).
	answer machine.AnswerKind
	opID   string
}

type committer struct {
	n  *Node
	in chan *proposal

	mu struct {
		sync.RWMutex
		closed bool
	}
	// failed is set when a group reached the WAL but not Pebble: the node
	// keeps refusing writes until a restart recovers from the WAL.
	failed atomic.Pointer[error]
	exited chan struct{}
	// groupMu is held from stamping a group to applying it: replacing the
	// WAL's stream takes it too, so no group straddles two streams.
	groupMu sync.Mutex
	// floor, while a group is between stamping and its WAL append, is a
	// timestamp below every commit HLC in it (nil otherwise): tombstone
	// collection must not assume a peer has every entry when one is about
	// to be appended.
	floor atomic.Pointer[hlc.Timestamp]

	pending      []*proposal // scratch of run
	groupReplays []*proposal // proposals replaying a write of the current group
	prev         int         // writers expected back for the next group
}

// maxLinger bounds how long a group waits for more writers; lingerGap is how
// long it waits for the next one before giving up on the rest.
const (
	maxLinger = 100 * time.Microsecond
	lingerGap = 20 * time.Microsecond
)

// linger waits, yielding, for the writers of the group just answered (and
// those that were queued behind it) to come back before the next fsync, so
// that they share it instead of waiting a whole fsync more: with an fsync of
// fixed cost, group size is throughput. It waits at most maxLinger, gives up
// once arrivals pause for lingerGap, and does not wait at all for a writer
// alone.
func (c *committer) linger() {
	target := min(c.prev, c.n.opts.MaxGroupEntries)
	var start, last time.Time
	for len(c.pending) < target {
		select {
		case q, ok := <-c.in:
			if !ok {
				return
			}
			c.pending = append(c.pending, q)
			last = time.Time{}
			continue
		default:
		}
		now := time.Now()
		if start.IsZero() {
			start = now
		}
		if last.IsZero() {
			last = now
		}
		if now.Sub(start) > maxLinger || now.Sub(last) > lingerGap {
			return
		}
		runtime.Gosched()
	}
}

// group is a set of proposals durable in the WAL together.
type group struct {
	props []*proposal
	ents  []*wal.Entry
	high  hlc.Timestamp // the highest commit HLC in the group
}

func newCommitter(n *Node) *committer {
	c := &committer{
		n:      n,
		in:     make(chan *proposal, n.opts.MaxGroupEntries),
		exited: make(chan struct{}),
	}
	go c.run()
	return c
}

// propose queues p and waits for its answer.
func (c *committer) propose(ctx context.Context, p *proposal) error {
	if errp := c.failed.Load(); errp != nil {
		return fmt.Errorf("%w: %w", ErrNotWritten, *errp)
	}
	p.done = make(chan struct{})
	c.mu.RLock()
	if c.mu.closed {
		c.mu.RUnlock()
		return fmt.Errorf("%w: %w", ErrNotWritten, ErrClosed)
	}
	select {
	case c.in <- p:
	case <-ctx.Done():
		c.mu.RUnlock()
		return fmt.Errorf("%w: %w", ErrNotWritten, ctx.Err())
	}
	c.mu.RUnlock()
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(stateQueued, stateCancelled) {
			return fmt.Errorf("%w: %w", ErrNotWritten, ctx.Err())
		}
		// Already in a group: its fate is being decided right now.
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// close stops taking proposals and waits for the queued ones to finish.
func (c *committer) close() {
	c.mu.Lock()
	if !c.mu.closed {
		c.mu.closed = true
		close(c.in)
	}
	c.mu.Unlock()
	<-c.exited
}

// run is the committer goroutine. It exits when close has closed c.in and
// every queued proposal was answered.
func (c *committer) run() {
	defer close(c.exited)
	for p := range c.in {
		c.pending = append(c.pending[:0], p)
	drain:
		for len(c.pending) < c.n.opts.MaxGroupEntries {
			select {
			case q, ok := <-c.in:
				if !ok {
					break drain
				}
				c.pending = append(c.pending, q)
			default:
				break drain
			}
		}
		c.linger()
		c.prev = 0
		c.groupMu.Lock()
		if g := c.makeDurable(c.pending); g != nil {
			c.applyGroup(g)
			// Expect back the writers just answered and those already
			// queued behind them.
			c.prev = len(g.props) + len(c.in)
		}
		c.groupMu.Unlock()
	}
}

// makeDurable stamps the live proposals and appends them to the WAL. It
// answers them itself on failure and returns nil then.
func (c *committer) makeDurable(pending []*proposal) *group {
	// Take the proposals whose callers still wait; a cancelled one was never
	// stamped and is simply dropped.
	g := &group{}
	for _, p := range pending {
		if p.state.CompareAndSwap(stateQueued, stateTaken) {
			g.props = append(g.props, p)
		}
	}
	if len(g.props) == 0 {
		return nil
	}
	if errp := c.failed.Load(); errp != nil {
		answerAll(g.props, fmt.Errorf("%w: %w", ErrNotWritten, *errp))
		return nil
	}
	n := c.n
	floor := n.clock.Last()
	c.floor.Store(&floor)
	defer c.floor.Store(nil)
	g.ents = make([]*wal.Entry, 0, len(g.props))
	writing := g.props[:0]
	var keyed map[string]*proposal
	ov := machine.NewOverlay(n.store, store.Component(n.cluster, n.wal.Stream(), n.ctrEpoch.Load()))
	for _, p := range g.props {
		if p.idem != nil {
			// Decided in commit order, so two concurrent first attempts
			// of one key cannot both write.
			if keyed == nil {
				keyed = map[string]*proposal{}
			}
			if done := c.settleKeyed(ov, p, keyed); done {
				continue
			}
			keyed[p.idem.key] = p
		}
		v, err := ov.Decide(&p.entry, p.cond, p.delta)
		if errors.Is(err, machine.ErrUnreadable) {
			err = fmt.Errorf("%w: %w", ErrNotWritten, err)
		}
		p.counterValue = v
		if err != nil {
			p.err = err
			close(p.done)
			continue
		}
		// Stamp inside the commit order: commit HLCs grow with WAL indexes.
		p.entry.Origin = n.cluster
		p.entry.Commit = n.clock.Now()
		p.entry.Stamp = p.entry.Commit
		if !p.pin.IsZero() {
			if err := n.checkPin(p.pin, p.entry.Commit); err != nil {
				p.err = err
				close(p.done)
				continue
			}
			p.entry.Stamp = p.pin
			// A pin may lie ahead of the clock (by up to the max offset):
			// the next write, causally later, must stamp above it.
			n.clock.Observe(p.pin)
		}
		if p.idem != nil {
			st, body := machine.Answer(p.idem.answer, &p.entry, p.counterValue, p.idem.opID)
			p.entry.Idem = &wal.Idem{Key: p.idem.key, Fingerprint: p.idem.fingerprint, Status: st, Body: body,
				Expires: p.entry.Commit.Wall + int64(n.opts.IdempotencyWindow)}
		}
		ov.Record(&p.entry)
		g.high = p.entry.Commit
		g.ents = append(g.ents, &p.entry)
		writing = append(writing, p)
	}
	g.props = writing
	if len(g.ents) == 0 {
		c.answerReplays()
		return nil
	}
	t0 := time.Now()
	err := n.wal.Append(g.ents)
	n.metrics.fsyncSeconds.Observe(time.Since(t0).Seconds())
	if err != nil {
		if errors.Is(err, wal.ErrBroken) {
			c.fail(err)
			answerAll(g.props, fmt.Errorf("%w: %w", ErrUnknownOutcome, err))
		} else {
			answerAll(g.props, fmt.Errorf("%w: %w", ErrNotWritten, err))
		}
		c.answerReplays()
		return nil
	}
	return g
}

// settleKeyed answers a keyed proposal whose key is already recorded (a
// replay, or 422 for another request under the key), or parks it behind an
// earlier proposal of the same key in this group. It reports whether p needs
// no write of its own.
func (c *committer) settleKeyed(ov *machine.Overlay, p *proposal, keyed map[string]*proposal) bool {
	if first, ok := keyed[p.idem.key]; ok {
		if !bytes.Equal(first.idem.fingerprint, p.idem.fingerprint) {
			p.err = fmt.Errorf("%w: key %q", ErrIdempotencyConflict, p.idem.key)
			close(p.done)
			return true
		}
		p.replayOf = first
		c.groupReplays = append(c.groupReplays, p)
		return true
	}
	d, rec, err := ov.LookupKey(p.idem.key, p.idem.fingerprint, c.n.clock.Physical(), &p.entry)
	switch {
	case err != nil:
		p.err = fmt.Errorf("%w: %w", ErrNotWritten, err)
	case d == machine.KeyNew:
		return false
	case d == machine.KeyConflict:
		p.err = fmt.Errorf("%w: key %q", ErrIdempotencyConflict, p.idem.key)
	case d == machine.KeyPlanted:
		c.n.log.Warn("idempotency record without its write here: ignored, the request is written",
			"idempotency_key", p.idem.key, "recorded_version", rec.Stamp.String(), "key", p.entry.Key)
		return false
	default:
		p.replay = rec
	}
	close(p.done)
	return true
}

// answerReplays answers the proposals that replay a write of this group,
// once that write is applied (or failed).
func (c *committer) answerReplays() {
	for _, p := range c.groupReplays {
		first := p.replayOf
		switch {
		case first.err != nil:
			p.err = first.err
		case first.entry.Idem != nil:
			p.replay = &store.IdemRecord{Key: first.idem.key, Fingerprint: first.idem.fingerprint,
				Status: first.entry.Idem.Status, Body: first.entry.Idem.Body, Stamp: first.entry.LWW(),
				Expires: first.entry.Idem.Expires}
		default:
			p.err = fmt.Errorf("%w: the first attempt under the key was refused", ErrNotWritten)
		}
		close(p.done)
	}
	c.groupReplays = c.groupReplays[:0]
}

// applyGroup applies a durable group to Pebble with the applied index and
// the clock's high-water mark, then answers it.
func (c *committer) applyGroup(g *group) {
	if errp := c.failed.Load(); errp != nil {
		// In the WAL, so a restart applies it; not readable until then.
		answerAll(g.props, fmt.Errorf("%w: in the WAL but not applied: %w", ErrUnknownOutcome, *errp))
		c.answerReplays()
		return
	}
	n := c.n
	b := n.store.NewBatch()
	var err error
	for _, p := range g.props {
		if p.outcome, err = p.entry.Apply(b); err != nil {
			break
		}
	}
	if err == nil {
		err = errors.Join(
			b.SetLocalApplied(store.AppliedIndex{Stream: n.wal.Stream(), Index: g.ents[len(g.ents)-1].Index, Commit: g.high}),
			// The clock's high-water, not the group's: it covers pins
			// observed and remote stamps too, and the store only raises it.
			b.RaiseHLC(n.clock.Last()),
		)
	}
	if err == nil {
		// The WAL is the redo log and is already synced: Pebble's own
		// WAL need not be fsynced here.
		err = b.Commit(false)
	}
	b.Close()
	if err != nil {
		// Durable in the WAL, not applied: a restart re-applies it. Until
		// then the node must not take writes whose reads would miss it.
		c.fail(fmt.Errorf("apply to the store: %w", err))
		answerAll(g.props, fmt.Errorf("%w: in the WAL but not applied: %w", ErrUnknownOutcome, err))
		c.answerReplays()
		return
	}
	n.applied.Store(g.ents[len(g.ents)-1].Index)
	n.metrics.writes.Add(uint64(len(g.props)))
	n.metrics.groups.Add(1)
	for _, p := range g.props {
		close(p.done)
	}
	c.answerReplays()
}

func (c *committer) fail(err error) {
	c.failed.CompareAndSwap(nil, &err)
	c.n.opts.Logger.Error("write path failed; refusing writes until restart", "err", err)
}

func answerAll(props []*proposal, err error) {
	for _, p := range props {
		p.err = err
		close(p.done)
	}
}

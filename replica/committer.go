package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/wal"
)

// The committer is the write path's single proposer. Concurrent writes
// queue as proposals; the committer takes as many as are waiting (up to
// MaxGroupEntries), stamps them in order, and commits them as one command of
// the cluster's log (one append, one fsync); the state machine then decides
// them in order (conditions, idempotency keys, counters), assigns each
// accepted write its stream index, and applies the group to Pebble in one
// batch with the log index, the stream's end and the HLC high-water mark.
// Only then are they answered.
//
// Crash points and what they leave:
//   - before the log's fsync: nothing acknowledged, nothing durable;
//   - after the fsync, before Pebble: the log replays the command at start
//     (its decisions are the same: the machine decides from the tree);
//   - after Pebble, before the answer: the write is durable, the caller saw
//     a failed call, which is an unknown outcome by contract.

const (
	stateQueued int32 = iota
	stateTaken
	stateCancelled
)

// Proposal is one write queued for the committer. The caller fills the
// write's fields before Enqueue; the committer fills the results, which
// are valid once Await returned nil.
type Proposal struct {
	// Entry is the write (its key, value, op); the committer stamps it and
	// the state machine gives it its stream index.
	Entry entry.Entry
	// Pin is the caller's pinned LWW stamp (an idempotency scope); zero
	// means the commit HLC.
	Pin hlc.Timestamp
	// Idem is the keyed request this write answers, if any.
	Idem *api.Keyed
	// Cond is a precondition decided in commit order (If-Match,
	// If-None-Match).
	Cond *api.Condition
	// Delta is a counter increment (op counter): the entry then carries
	// this cluster's resulting totals, computed in commit order, and
	// CounterValue the counter's value right after it, here.
	Delta        int64
	CounterValue int64
	// Existed is how many keys a delete or a batch deleted that held a
	// live value, decided in commit order.
	Existed int
	// Outcome is what last-writer-wins made of the write.
	Outcome entry.Outcome
	// Replay is set when the answer is a recorded one: nothing was
	// written.
	Replay *api.IdemRecord

	state atomic.Int32
	done  chan struct{}
	err   error
}

// Committer is the write path's single proposer of one replica (see the
// comment at the top of this file).
type Committer struct {
	env CommitEnv
	in  chan *Proposal

	mu struct {
		sync.RWMutex
		closed bool
	}
	// failed is set when a command reached the log but not Pebble: the node
	// keeps refusing writes until a restart replays the log (Failed).
	failed atomic.Pointer[error]
	exited chan struct{}
	// groupMu is held from stamping a group to applying it: replacing the
	// stream takes it too, so a group's writes stamped under one stream are
	// not applied under the next.
	groupMu sync.Mutex
	// floor, while a group is between stamping and its WAL append, is a
	// timestamp below every commit HLC in it (nil otherwise): tombstone
	// collection must not assume a peer has every entry when one is about
	// to be appended (Floor).
	floor atomic.Pointer[hlc.Timestamp]

	pending []*Proposal // scratch of run
	enc     *machine.Encoder
	prev    int // writers expected back for the next group
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
func (c *Committer) linger() {
	target := min(c.prev, c.env.MaxGroup)
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

// CommitEnv is what the committer sees of its replica: values and
// functions, never the node (Pebble's commitEnv), so that it can be read,
// and driven in a test, alone.
type CommitEnv struct {
	// MaxGroup bounds the writes of one group; IdemWindow is how long a
	// keyed write's record is kept.
	MaxGroup   int
	IdemWindow time.Duration
	Clock      *hlc.Clock
	Logger     *slog.Logger
	// Leading reports whether this node may stamp writes now; NotLeader is
	// the refusal when it may not.
	Leading   func() bool
	NotLeader func() error
	// Replays reports whether a keyed write's record answers it (and fills
	// e from the record); CheckPin refuses a pinned stamp out of the window.
	Replays  func(key string, fingerprint []byte, now int64, e *entry.Entry) bool
	CheckPin func(pin, commit hlc.Timestamp) error
	// Commit puts one command in the log and returns what the state machine
	// returned for it (a *machine.Result, or the error that stopped it); an
	// error of ErrEncode never reached the log.
	Commit func(cmd *machine.Command, enc *machine.Encoder) (any, error)
	// Committed is told of each group applied, with its writes.
	Committed func(writes int)
}

// ErrEncode is the class of a command that did not encode (it never
// reached the log).
var ErrEncode = errors.New("replica: encode a command")

// NewCommitter starts the committer goroutine; Close stops it.
func NewCommitter(env CommitEnv) *Committer {
	c := &Committer{
		env:    env,
		in:     make(chan *Proposal, env.MaxGroup),
		exited: make(chan struct{}),
		enc:    machine.NewEncoder(),
	}
	go c.run()
	return c
}

// Enqueue puts p in the queue behind every proposal enqueued before it
// returned, without waiting for its commit (Await does): a caller that
// enqueues in order has its writes decided in that order, and the ones
// queued together join one group.
func (c *Committer) Enqueue(ctx context.Context, p *Proposal) error {
	if errp := c.failed.Load(); errp != nil {
		return fmt.Errorf("%w: %w", api.ErrNotWritten, *errp)
	}
	p.done = make(chan struct{})
	c.mu.RLock()
	if c.mu.closed {
		c.mu.RUnlock()
		return fmt.Errorf("%w: %w", api.ErrNotWritten, api.ErrClosed)
	}
	select {
	case c.in <- p:
	case <-ctx.Done():
		c.mu.RUnlock()
		return fmt.Errorf("%w: %w", api.ErrNotWritten, ctx.Err())
	}
	c.mu.RUnlock()
	return nil
}

// Await waits for an enqueued proposal's fate.
func (c *Committer) Await(ctx context.Context, p *Proposal) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		select {
		case <-p.done:
			// Decided as ctx ended (select picks either at random): its
			// fate is known, not unknown.
			return p.err
		default:
		}
		if p.state.CompareAndSwap(stateQueued, stateCancelled) {
			return fmt.Errorf("%w: %w", api.ErrNotWritten, ctx.Err())
		}
		// Already in a group: its fate is being decided right now.
		return fmt.Errorf("%w: %w", api.ErrUnknownOutcome, ctx.Err())
	}
}

// Close stops taking proposals and waits for the queued ones to finish.
func (c *Committer) Close() {
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
func (c *Committer) run() {
	defer close(c.exited)
	for p := range c.in {
		c.pending = append(c.pending[:0], p)
	drain:
		for len(c.pending) < c.env.MaxGroup {
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
		if n := c.commit(c.pending); n > 0 {
			// Expect back the writers just answered and those already
			// queued behind them.
			c.prev = n + len(c.in)
		}
		c.groupMu.Unlock()
	}
}

// commit stamps the live proposals, commits them as one command and answers
// them. It returns how many were written.
func (c *Committer) commit(pending []*Proposal) int {
	// Take the proposals whose callers still wait; a cancelled one was never
	// stamped and is simply dropped.
	var props []*Proposal
	for _, p := range pending {
		if p.state.CompareAndSwap(stateQueued, stateTaken) {
			props = append(props, p)
		}
	}
	if len(props) == 0 {
		return 0
	}
	if errp := c.failed.Load(); errp != nil {
		answerAll(props, fmt.Errorf("%w: %w", api.ErrNotWritten, *errp))
		return 0
	}
	env := c.env
	if !env.Leading() {
		// Deposed since the writers were admitted: nothing is stamped.
		answerAll(props, env.NotLeader())
		return 0
	}
	floor := env.Clock.Last()
	c.floor.Store(&floor)
	defer c.floor.Store(nil)
	// A command of its own per group, never reused: the state machine may
	// still be applying a group's command (as this node's follower, after
	// it lost the lead with the group in flight: raft's log hands it the
	// very bytes, which the node maps to this command) when the group's
	// writers were already answered.
	cmd := &machine.Command{Local: make([]machine.Proposal, 0, len(props))}
	sent := props[:0]
	for _, p := range props {
		// Stamp in commit order: commit HLCs grow with stream indexes (the
		// machine refuses one that does not).
		// Built in place in the command (a local whose address is taken
		// for Replays would be a heap allocation per write).
		cmd.Local = append(cmd.Local, machine.Proposal{Entry: p.Entry, Cond: p.Cond, Delta: p.Delta})
		mp := &cmd.Local[len(cmd.Local)-1]
		mp.Entry.Commit = env.Clock.Now()
		mp.Entry.Stamp = hlc.Timestamp{}
		if !p.Pin.IsZero() {
			// A retry whose record exists is answered from it (the machine
			// replays it) before its pin is checked: the first attempt
			// applied, perhaps at a leader whose clock was ahead of this
			// one's, and a refusal now would be a lie.
			replay := p.Idem != nil && env.Replays(p.Idem.Key, p.Idem.Fingerprint, mp.Entry.Commit.Wall, &mp.Entry)
			if !replay {
				if err := env.CheckPin(p.Pin, mp.Entry.Commit); err != nil {
					p.err = err
					close(p.done)
					cmd.Local = cmd.Local[:len(cmd.Local)-1]
					continue
				}
				// A pin may lie ahead of the clock (by up to the max
				// offset): the next write, causally later, must stamp
				// above it.
				env.Clock.Observe(p.Pin)
			}
			mp.Entry.Stamp = p.Pin
		}
		if p.Idem != nil {
			mp.Keyed = &machine.Keyed{Key: p.Idem.Key, Fingerprint: p.Idem.Fingerprint, Answer: p.Idem.Answer,
				OpID: p.Idem.OpID, Expires: mp.Entry.Commit.Wall + int64(env.IdemWindow)}
		}
		sent = append(sent, p)
	}
	if len(sent) == 0 {
		return 0
	}
	out, err := env.Commit(cmd, c.enc)
	if errors.Is(err, ErrEncode) {
		answerAll(sent, fmt.Errorf("%w: %w", api.ErrNotWritten, err))
		return 0
	}
	if err == nil {
		if e, ok := out.(error); ok {
			// Committed, not applied: a restart applies it.
			err = fmt.Errorf("%w: in the log but not applied: %w", api.ErrUnknownOutcome, e)
		}
	}
	if err != nil {
		answerAll(sent, ApplyError(err))
		return 0
	}
	res := out.(*machine.Result)
	if len(res.Writes) != len(sent) {
		// Never: a new command is above the applied index.
		answerAll(sent, fmt.Errorf("%w: the machine answered %d of %d writes (skipped %v)", api.ErrUnknownOutcome, len(res.Writes), len(sent), res.Skipped))
		return 0
	}
	written := 0
	for i, p := range sent {
		w := &res.Writes[i]
		switch {
		case w.Replay != nil:
			p.Replay = w.Replay
		case errors.Is(w.Err, machine.ErrNoStream), errors.Is(w.Err, machine.ErrStaleStamp):
			p.err = fmt.Errorf("%w: %w", api.ErrNotWritten, w.Err)
		case w.Err != nil:
			p.err = w.Err
		default:
			p.Entry, p.Outcome, p.CounterValue, p.Existed = w.Entry, w.Outcome, w.CounterValue, w.Existed
			written++
		}
		close(p.done)
	}
	env.Committed(written)
	return written
}

// EnqueueTimeout bounds the wait for raft to take a command.
const EnqueueTimeout = 10 * time.Second

// ApplyError is what a failed commit means to its writers: not written when
// the command certainly never reached the log, an unknown outcome otherwise.
func ApplyError(err error) error {
	var nl *cluster.NotLeaderError
	switch {
	case errors.As(err, &nl), errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %w", api.ErrNotWritten, err)
	case errors.Is(err, wal.ErrAppendFailed) && !errors.Is(err, wal.ErrBroken):
		// The log refused the append and cut itself back (a full disk):
		// nothing of the command is in it.
		return fmt.Errorf("%w: %w", api.ErrNotWritten, err)
	case errors.Is(err, api.ErrUnknownOutcome):
		return err
	}
	// Leadership lost or raft shut down with the command in flight, a log
	// that cannot tell what it holds: it may yet apply.
	return fmt.Errorf("%w: %w", api.ErrUnknownOutcome, err)
}

// Fail stops the write path: every write from now on is refused, not
// written, until a restart replays the log (a command reached the log and
// not the tree).
func (c *Committer) Fail(err error) {
	c.failed.CompareAndSwap(nil, &err)
	c.env.Logger.Error("write path failed; refusing writes until restart", "err", err)
}

// Failed is why the write path stopped (nil: it did not).
func (c *Committer) Failed() error {
	if p := c.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Floor is, while a group is between its stamping and its append to the
// log, a timestamp below every commit HLC in it (nil otherwise).
func (c *Committer) Floor() *hlc.Timestamp { return c.floor.Load() }

// Exclusive runs f while no group is between its stamping and its apply:
// a stream is replaced, or the replica closes, without a group stamped
// under the old stream being applied under the new.
func (c *Committer) Exclusive(f func()) {
	c.groupMu.Lock()
	defer c.groupMu.Unlock()
	f()
}

func answerAll(props []*Proposal, err error) {
	for _, p := range props {
		p.err = err
		close(p.done)
	}
}

package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

// The committer is the write path's single writer. Concurrent writes queue
// as proposals; the committer takes as many as are waiting (up to
// MaxGroupEntries), stamps them in order, appends them to the WAL with one
// write and one fsync, applies them to Pebble in one batch together with the
// applied index and the HLC high-water mark, and only then answers them.
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
)

const (
	stateQueued int32 = iota
	stateTaken
	stateCancelled
)

type proposal struct {
	entry wal.Entry
	state atomic.Int32
	done  chan struct{}

	// results, valid after done is closed
	outcome store.Outcome
	err     error
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

	codec *wal.Codec
	group []*proposal
	ents  []*wal.Entry
}

func newCommitter(n *Node) *committer {
	c := &committer{
		n:      n,
		in:     make(chan *proposal, n.opts.MaxGroupEntries),
		exited: make(chan struct{}),
		codec:  wal.NewCodec(),
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
		c.group = append(c.group[:0], p)
	drain:
		for len(c.group) < c.n.opts.MaxGroupEntries {
			select {
			case q, ok := <-c.in:
				if !ok {
					break drain
				}
				c.group = append(c.group, q)
			default:
				break drain
			}
		}
		c.commitGroup()
	}
}

func (c *committer) commitGroup() {
	// Take the proposals whose callers still wait; a cancelled one was never
	// stamped and is simply dropped.
	live := c.group[:0]
	for _, p := range c.group {
		if p.state.CompareAndSwap(stateQueued, stateTaken) {
			live = append(live, p)
		}
	}
	c.group = live
	if len(live) == 0 {
		return
	}
	if errp := c.failed.Load(); errp != nil {
		c.answerAll(fmt.Errorf("%w: %w", ErrNotWritten, *errp))
		return
	}
	n := c.n
	c.ents = c.ents[:0]
	var high hlc.Timestamp
	for _, p := range live {
		// Stamp inside the commit order: commit HLCs grow with WAL indexes.
		p.entry.Commit = n.clock.Now()
		if p.entry.Stamp.IsZero() {
			p.entry.Stamp = p.entry.Commit
		}
		high = p.entry.Commit
		c.ents = append(c.ents, &p.entry)
	}
	if err := n.wal.Append(c.ents); err != nil {
		if errors.Is(err, wal.ErrBroken) {
			c.fail(err)
			c.answerAll(fmt.Errorf("%w: %w", ErrUnknownOutcome, err))
			return
		}
		c.answerAll(fmt.Errorf("%w: %w", ErrNotWritten, err))
		return
	}
	b := n.store.NewBatch()
	var err error
	for _, p := range live {
		e := &p.entry
		p.outcome, err = b.Merge(store.Write{
			Key:       e.Key,
			Value:     e.Value,
			Tombstone: e.Op == store.OpDelete,
			Stamp:     e.LWW(),
		})
		if err != nil {
			break
		}
	}
	if err == nil {
		err = errors.Join(
			b.SetLocalApplied(n.wal.Stream(), c.ents[len(c.ents)-1].Index),
			b.SetHLC(high),
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
		c.answerAll(fmt.Errorf("%w: in the WAL but not applied: %w", ErrUnknownOutcome, err))
		return
	}
	n.metrics.writes.Add(uint64(len(live)))
	for _, p := range live {
		close(p.done)
	}
}

func (c *committer) fail(err error) {
	c.failed.CompareAndSwap(nil, &err)
	c.n.opts.Logger.Error("write path failed; refusing writes until restart", "err", err)
}

func (c *committer) answerAll(err error) {
	for _, p := range c.group {
		p.err = err
		close(p.done)
	}
}

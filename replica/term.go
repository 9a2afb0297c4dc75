package replica

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
)

// Leadership terms, in a cluster of several nodes (docs/CLUSTER.md). The
// leader stamps, ships and accepts; every node applies what the log
// commits, and the others forward what needs the leader. A node's time as
// leader is a term: it begins once the node leads and has applied its whole
// log (a barrier: nothing is stamped below a committed stamp), and it ends
// when the node stops leading. A term owns the shippers: they are made from
// the cursors the log holds when it begins, so a new leader ships from
// where the old one recorded, and they stop when it ends (a cursor an old
// leader still records is a command that fails, or one that costs the peer
// a resend it drops).
//
// A node alone (a group of one) begins its only term in Open and ends it
// at Stop: a failed append makes it step down and elect itself again a
// moment later, and its links go on.

// leadState is this node's leadership, as the lead loop sees it.
type leadState struct {
	// ready: this node leads and its term began (log applied, stream
	// minted, shippers made). Writes are stamped only while it is set.
	ready atomic.Bool
	// Of the lead loop's goroutine only.
	term     uint64
	links    Term // the term's links
	began    bool // a term began in this process (the identity check ran)
	failures int  // consecutive failed starts
	// sawOther: another node led the cluster during this process's life,
	// so the stream's identity was checked by a leader already.
	sawOther bool
}

// Run starts the lead loop of a cluster of several and the replica's
// periodic checks, or a node alone's links (its only term began in Open);
// Stop ends them.
func (r *Replica) Run() {
	if !r.multi() {
		r.lead.links.Run()
		return
	}
	r.loop.Add(1)
	go r.leadLoop()
	// Once every member reads a newer format, the leader raises the log to
	// it; a removal the log records puts this node out.
	r.every(500*time.Millisecond, r.RaiseFormat)
	r.every(time.Second, r.CheckRemoved)
}

// every runs f every d until Stop.
func (r *Replica) every(d time.Duration, f func()) {
	r.loop.Add(1)
	go func() {
		// Exits at Stop.
		defer r.loop.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
				f()
			}
		}
	}()
}

// Stop ends the lead loop, after it ended the term (its links stopped).
// Once only.
func (r *Replica) Stop() {
	close(r.stop)
	r.loop.Wait()
	if !r.multi() {
		r.endTerm("shutting down")
	}
}

// leadLoop follows this node's leadership until stop: it begins a term
// when the node is elected and ends it when the node is deposed (or a new
// term of its own began in between). It exits at stop, after ending the
// term.
func (r *Replica) leadLoop() {
	defer r.loop.Done()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var retryAt time.Time
	for {
		select {
		case <-r.stop:
			r.endTerm("shutting down")
			return
		case <-t.C:
		}
		leading, term := r.group.IsLeader(), r.group.Term()
		if id, _ := r.group.Leader(); id != "" && id != r.d.NodeID {
			r.lead.sawOther = true
		}
		if r.lead.ready.Load() && (!leading || term != r.lead.term) {
			r.endTerm("no longer the leader")
		}
		if r.lead.ready.Load() && r.fsm.Err() != nil {
			// The state machine stopped mid-term: every write here is
			// refused, so another node must lead.
			r.endTerm("the state machine stopped")
			r.handOver()
			continue
		}
		if !leading {
			r.lead.failures, retryAt = 0, time.Time{}
			continue
		}
		if r.lead.ready.Load() || time.Now().Before(retryAt) {
			continue
		}
		if err := r.beginTerm(term); err != nil {
			// Each try appends a barrier: back off, and after a few hand
			// leadership to a node that may manage.
			r.lead.failures++
			retryAt = time.Now().Add(termBackoff(r.lead.failures))
			if r.lead.failures == 1 {
				r.log.Warn("elected, but the term could not begin (trying again)", "term", term, "err", err)
			}
			if r.lead.failures%termTries == 0 {
				// Again every termTries failures: a transfer that found no
				// target (the others down) is tried once they may be back.
				r.log.Error("the term could not begin; handing leadership over", "term", term, "err", err, "tries", r.lead.failures)
				r.handOver()
			}
			continue
		}
		r.lead.failures, retryAt = 0, time.Time{}
	}
}

// termTries is how many times a term is tried before leadership is handed
// over.
const termTries = 6

// termBackoff is the wait after the nth failed try to begin a term: 20 ms
// doubling to at most a second (the shift is bounded: unbounded, it wrapped
// to zero after a minute of failures, and every 10 ms tick appended a
// barrier again).
func termBackoff(failures int) time.Duration {
	if failures >= 7 {
		return time.Second
	}
	return 10 * time.Millisecond << failures
}

// handOver asks raft to make another voter the leader (a node alone has
// none: it keeps trying).
func (r *Replica) handOver() {
	if err := r.group.TransferLeadership(); err != nil {
		r.log.Warn("handing leadership over", "err", err)
	}
}

// beginTerm makes this node the one that stamps, ships and accepts.
func (r *Replica) beginTerm(term uint64) error {
	start := time.Now()
	if err := r.group.Barrier(5 * time.Second); err != nil {
		return fmt.Errorf("apply the log: %w", err)
	}
	if err := r.fsm.Err(); err != nil {
		r.handOver() // this node cannot apply the log: another must lead
		return fmt.Errorf("apply the log: %w", err)
	}
	// The FSM observed every command's stamps; the tree's high-water mark
	// covers the commands a snapshot brought.
	if err := r.restoreClock(); err != nil {
		return err
	}
	created := false
	if r.machine.Stream().IsZero() {
		// The cluster's first leader mints its stream, through the log, so
		// that every node (and every later leader) holds the same one.
		if err := r.ApplyCommand(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
			return fmt.Errorf("start the cluster's stream: %w", err)
		}
		created = true
		r.log.Info("the cluster's stream begins", "stream", r.out.Stream())
	}
	if !r.lead.began {
		// Once per process: what a node checks when it reopens a stream
		// (docs/ARCHITECTURE.md, "Stream identity"). A later term of the
		// same process continues what the log holds, and so does the first
		// when another node led meanwhile (that leader checked it).
		if err := r.d.Identity(created || r.lead.sawOther); err != nil {
			return err
		}
		r.lead.began = true
	}
	// The links are made from the log's cursors, and start once the term's
	// bookkeeping (a seal after a recovery) is done.
	links, err := r.d.BeginTerm()
	if err != nil {
		return err
	}
	if err := r.sealAfterRecovery(); err != nil {
		links.Abort()
		return err
	}
	r.lead.term, r.lead.links = term, links
	r.lead.ready.Store(true)
	links.Run()
	r.m.leaderTerms.Inc()
	r.log.Info("leading the cluster: stamping, shipping and accepting", "term", term, "node", r.d.NodeID,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// sealAfterRecovery finishes a recovery from the loss of a majority
// (docs/OPERATIONS.md): every server of the configuration before it but
// this one is recorded as lost (refused for good, and told why, if it comes
// back with its old directory), and the stream the recovery left is sealed:
// a new one begins, and the node rejoins its peers so that what only the
// lost nodes had shipped comes back by re-seeds. Only then does peers.json
// go (cluster.FinishRecovery): a stop before starts the recovery again.
func (r *Replica) sealAfterRecovery() error {
	if rec := r.group.Recovery(); rec != nil {
		if err := recoveryStep("begin"); err != nil {
			return err
		}
		for _, id := range rec.Lost {
			node, inc := cluster.SplitServerID(raft.ServerID(id))
			key := machine.RemovalKey(node, inc)
			if why, err := r.machine.Removed(key); err != nil {
				return err
			} else if why != 0 {
				continue
			}
			if err := r.ApplyCommand(&machine.Command{RemoveNode: &machine.RemoveNodeCmd{ID: key, Why: byte(cluster.RemovedInRecovery)}}); err != nil {
				return fmt.Errorf("record %s as lost in the recovery: %w", id, err)
			}
		}
		if err := recoveryStep("lost-recorded"); err != nil {
			return err
		}
		if rec.Stream == r.out.Stream().String() {
			if err := r.d.Seal(r.out.Stream(), "the cluster was recovered after the loss of a majority: "+
				"writes the lost nodes committed and shipped may be missing here"); err != nil {
				return err
			}
		}
		if err := recoveryStep("sealed"); err != nil {
			return err
		}
		if err := r.group.FinishRecovery(); err != nil {
			return err
		}
	}
	// A recovery a build before the record began.
	b, err := os.ReadFile(r.SealFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if old := strings.TrimSpace(string(b)); old == r.out.Stream().String() {
		if err := r.d.Seal(r.out.Stream(), "the cluster was recovered after the loss of a majority: "+
			"writes the lost nodes committed and shipped may be missing here"); err != nil {
			return err
		}
	}
	return os.Remove(r.SealFile())
}

// RecoveryStepHook, in tests, stops a recovery's first term at a step (a
// crash there): its error fails the term.
var RecoveryStepHook atomic.Pointer[func(step string) error]

func recoveryStep(step string) error {
	if f := RecoveryStepHook.Load(); f != nil {
		return (*f)(step)
	}
	return nil
}

// endTerm stops what only the leader does: stamping, its shippers.
func (r *Replica) endTerm(why string) {
	if !r.lead.ready.Swap(false) {
		return
	}
	r.lead.links.End()
	r.log.Info("stopped leading the cluster", "term", r.lead.term, "why", why)
}

// Ready reports that this node leads and its term began (log applied,
// stream minted, links made): writes are stamped only while it does.
// Ready, AwaitTerm and NotLeader are what the router reads of the lead
// (forward.Leadership).
func (r *Replica) Ready() bool                         { return r.lead.ready.Load() }
func (r *Replica) AwaitTerm(ctx context.Context) error { return r.awaitTerm(ctx) }
func (r *Replica) NotLeader() error                    { return r.notLeader() }

// notLeader is the answer to what needs the leader on a node that does not
// lead: nothing was done.
func (r *Replica) notLeader() error {
	select {
	case <-r.stop:
		// Stop ended the term: the write met a node shutting down, not an
		// election.
		return fmt.Errorf("%w: %w", api.ErrClosed, api.ErrNotWritten)
	default:
	}
	id, addr := r.group.Leader()
	if id == r.d.NodeID {
		return fmt.Errorf("%w: this node was just elected and is applying the log", api.ErrNotWritten)
	}
	return fmt.Errorf("%w: %w", api.ErrNotWritten, &cluster.NotLeaderError{LeaderID: id, LeaderAddr: addr})
}

// awaitTerm waits, while this node leads, for its term to begin (at most
// twice the election timeout): a write that reaches a node elected a
// moment ago is stamped once the log is applied, not refused.
func (r *Replica) awaitTerm(ctx context.Context) error {
	if r.lead.ready.Load() {
		return nil
	}
	deadline := time.Now().Add(2 * r.d.Raft.ElectionTimeout)
	for !r.lead.ready.Load() {
		if !r.group.IsLeader() || time.Now().After(deadline) {
			return r.notLeader()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", api.ErrNotWritten, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// progress is the last log index the state machine applied, with a way to
// wait for one.
type progress struct {
	idx atomic.Uint64
	mu  sync.Mutex
	ch  chan struct{} // closed at the next advance
}

func (p *progress) set(i uint64) {
	// Only forward: raft replays commands the tree applied (skipped) from
	// its snapshot on after a restart.
	for {
		cur := p.idx.Load()
		if i <= cur || p.idx.CompareAndSwap(cur, i) {
			break
		}
	}
	p.mu.Lock()
	if p.ch != nil {
		close(p.ch)
		p.ch = nil
	}
	p.mu.Unlock()
}

func (p *progress) get() uint64 { return p.idx.Load() }

// Applied is the last log index the state machine applied; AwaitApplied
// waits for one (the router's view: forward.Progress).
func (r *Replica) Applied() uint64                                  { return r.progress.get() }
func (r *Replica) AwaitApplied(ctx context.Context, i uint64) error { return r.progress.wait(ctx, i) }

// wait returns once the index reaches i, or when ctx ends.
func (p *progress) wait(ctx context.Context, i uint64) error {
	for {
		if p.idx.Load() >= i {
			return nil
		}
		p.mu.Lock()
		if p.ch == nil {
			p.ch = make(chan struct{})
		}
		ch := p.ch
		p.mu.Unlock()
		if p.idx.Load() >= i {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

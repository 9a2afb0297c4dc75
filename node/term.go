package node

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
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/transport"
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
// A node alone (a group of one) begins its only term in Open and never
// ends it: a failed append makes it step down and elect itself again a
// moment later, and its links go on.

// leadState is this node's leadership, as the lead loop sees it.
type leadState struct {
	n *Node // whose links, stream and committer a term starts and stops
	// ready: this node leads and its term began (log applied, stream
	// minted, shippers made). Writes are stamped only while it is set.
	ready atomic.Bool
	// changes counts the terms this node began and ended (a metric).
	changes atomic.Uint64
	// Of the lead loop's goroutine only.
	term     uint64
	cancel   context.CancelFunc
	began    bool // a term began in this process (the identity check ran)
	failures int  // consecutive failed starts
	// sawOther: another node led the cluster during this process's life,
	// so the stream's identity was checked by a leader already.
	sawOther bool
}

// multi reports a node of a cluster of several. A node alone takes the
// same path (a raft group of one, the same committer, machine and FSM; its
// term is ready once Open returns); what multi() still forks is only what
// has no meaning without other nodes: a raft port and its requests
// (forwarding to a leader, asking members, admitting and removing them),
// terms that begin and end while the process runs (a leadership loop,
// follower views of the links), snapshots that carry a tree for a follower,
// and the starts a voter must refuse instead of beginning a new stream.
func (n *Node) multi() bool { return n.opts.Raft != nil }

// leadLoop follows this node's leadership until stop: it begins a term
// when the node is elected and ends it when the node is deposed (or a new
// term of its own began in between). It exits at stop, after ending the
// term.
func (l *leadState) leadLoop() {
	n := l.n
	defer n.bg.Done()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var retryAt time.Time
	for {
		select {
		case <-n.stop:
			l.endTerm("shutting down")
			return
		case <-t.C:
		}
		leading, term := n.group.IsLeader(), n.group.Term()
		if id, _ := n.group.Leader(); id != "" && id != n.nodeID {
			l.sawOther = true
		}
		if l.ready.Load() && (!leading || term != l.term) {
			l.endTerm("no longer the leader")
		}
		if l.ready.Load() && n.fsm.Err() != nil {
			// The state machine stopped mid-term: every write here is
			// refused, so another node must lead.
			l.endTerm("the state machine stopped")
			l.handOver()
			continue
		}
		if !leading {
			l.failures, retryAt = 0, time.Time{}
			continue
		}
		if l.ready.Load() || time.Now().Before(retryAt) {
			continue
		}
		if err := l.beginTerm(term); err != nil {
			// Each try appends a barrier: back off, and after a few hand
			// leadership to a node that may manage.
			l.failures++
			retryAt = time.Now().Add(termBackoff(l.failures))
			if l.failures == 1 {
				n.log.Warn("elected, but the term could not begin (trying again)", "term", term, "err", err)
			}
			if l.failures%termTries == 0 {
				// Again every termTries failures: a transfer that found no
				// target (the others down) is tried once they may be back.
				n.log.Error("the term could not begin; handing leadership over", "term", term, "err", err, "tries", l.failures)
				l.handOver()
			}
			continue
		}
		l.failures, retryAt = 0, time.Time{}
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
func (l *leadState) handOver() {
	n := l.n
	if err := n.group.TransferLeadership(); err != nil {
		n.log.Warn("handing leadership over", "err", err)
	}
}

// beginTerm makes this node the one that stamps, ships and accepts.
func (l *leadState) beginTerm(term uint64) error {
	n := l.n
	start := time.Now()
	if err := n.group.Barrier(5 * time.Second); err != nil {
		return fmt.Errorf("apply the log: %w", err)
	}
	if err := n.fsm.Err(); err != nil {
		l.handOver() // this node cannot apply the log: another must lead
		return fmt.Errorf("apply the log: %w", err)
	}
	// The FSM observed every command's stamps; the tree's high-water mark
	// covers the commands a snapshot brought.
	if err := n.restoreClock(); err != nil {
		return err
	}
	created := false
	if n.machine.Stream().IsZero() {
		// The cluster's first leader mints its stream, through the log, so
		// that every node (and every later leader) holds the same one.
		if err := n.cons.applyCommand(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
			return fmt.Errorf("start the cluster's stream: %w", err)
		}
		created = true
		n.log.Info("the cluster's stream begins", "stream", n.out.Stream())
	}
	if !l.began {
		// Once per process: what a node checks when it reopens a stream
		// (docs/ARCHITECTURE.md, "Stream identity"). A later term of the
		// same process continues what the log holds, and so does the first
		// when another node led meanwhile (that leader checked it).
		if err := n.rejoin.PruneReseedState(); err != nil {
			return err
		}
		if err := n.rejoin.InitIdentity(created || l.sawOther); err != nil {
			return err
		}
		l.began = true
	}
	// The links are made from the log's cursors, and start once the term's
	// bookkeeping (a seal after a recovery) is done.
	ctx, cancel := context.WithCancel(n.repl.replCtx)
	n.repl.linksMu.Lock()
	n.repl.linksBuilding = true
	n.repl.linksMu.Unlock()
	fail := func(err error) error {
		n.repl.linksMu.Lock()
		n.repl.linksBuilding = false
		n.repl.linksMu.Unlock()
		cancel()
		n.repl.stopLinks()
		return err
	}
	var errs []error
	for _, p := range n.repl.linkPeers() {
		if _, err := n.repl.addLink(p); err != nil {
			errs = append(errs, fmt.Errorf("link to %s: %w", p.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	if err := l.sealAfterRecovery(); err != nil {
		return fail(err)
	}
	n.repl.linksMu.Lock()
	n.repl.linksBuilding = false
	n.repl.linkCtx = ctx
	for _, sh := range n.repl.shippers {
		n.repl.runLinkLocked(sh)
	}
	n.repl.linksMu.Unlock()
	l.term, l.cancel = term, cancel
	l.ready.Store(true)
	l.changes.Add(1)
	n.metrics.leaderChanges.Inc()
	// A peer gossip found while the term began (too early to be linked by
	// it, too late for the list above).
	for _, p := range n.repl.linkPeers() {
		if _, err := n.repl.shipper(p.Name); err != nil {
			if _, err := n.repl.addLink(p); err != nil {
				n.log.Warn("linking a peer found while the term began", "peer", p.Name, "err", err)
			}
		}
	}
	n.log.Info("leading the cluster: stamping, shipping and accepting", "term", term, "node", n.nodeID,
		"took", time.Since(start).Round(time.Millisecond), "links", len(n.repl.links()))
	return nil
}

// sealAfterRecovery finishes a recovery from the loss of a majority
// (docs/OPERATIONS.md): every server of the configuration before it but
// this one is recorded as lost (refused for good, and told why, if it comes
// back with its old directory), and the stream the recovery left is sealed:
// a new one begins, and the node rejoins its peers so that what only the
// lost nodes had shipped comes back by re-seeds. Only then does peers.json
// go (cluster.FinishRecovery): a stop before starts the recovery again.
func (l *leadState) sealAfterRecovery() error {
	n := l.n
	if rec := n.group.Recovery(); rec != nil {
		if err := recoveryStep("begin"); err != nil {
			return err
		}
		for _, id := range rec.Lost {
			node, inc := cluster.SplitServerID(raft.ServerID(id))
			key := machine.RemovalKey(node, inc)
			if why, err := n.machine.Removed(key); err != nil {
				return err
			} else if why != 0 {
				continue
			}
			if err := n.cons.applyCommand(&machine.Command{RemoveNode: &machine.RemoveNodeCmd{ID: key, Why: byte(cluster.RemovedInRecovery)}}); err != nil {
				return fmt.Errorf("record %s as lost in the recovery: %w", id, err)
			}
		}
		if err := recoveryStep("lost-recorded"); err != nil {
			return err
		}
		if rec.Stream == n.out.Stream().String() {
			if err := n.rejoin.SealStream(n.out.Stream(), "the cluster was recovered after the loss of a majority: "+
				"writes the lost nodes committed and shipped may be missing here"); err != nil {
				return err
			}
		}
		if err := recoveryStep("sealed"); err != nil {
			return err
		}
		if err := n.group.FinishRecovery(); err != nil {
			return err
		}
	}
	// A recovery a build before the record began.
	b, err := os.ReadFile(n.cons.sealFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if old := strings.TrimSpace(string(b)); old == n.out.Stream().String() {
		if err := n.rejoin.SealStream(n.out.Stream(), "the cluster was recovered after the loss of a majority: "+
			"writes the lost nodes committed and shipped may be missing here"); err != nil {
			return err
		}
	}
	return os.Remove(n.cons.sealFile())
}

// testRecoveryStep, in tests, stops a recovery's first term at a step (a
// crash there): its error fails the term.
var testRecoveryStep atomic.Pointer[func(step string) error]

func recoveryStep(step string) error {
	if f := testRecoveryStep.Load(); f != nil {
		return (*f)(step)
	}
	return nil
}

// endTerm stops what only the leader does: stamping, its shippers.
func (l *leadState) endTerm(why string) {
	n := l.n
	if !l.ready.Swap(false) {
		return
	}
	n.repl.linksMu.Lock()
	n.repl.linkCtx = nil
	n.repl.linksMu.Unlock()
	l.cancel()
	n.repl.stopLinks()
	l.changes.Add(1)
	n.log.Info("stopped leading the cluster", "term", l.term, "why", why)
}

// stopLinks waits for the term's shippers to stop and forgets them.
func (r *replication) stopLinks() {
	r.linkWG.Wait()
	r.linksMu.Lock()
	r.shippers = nil
	r.linksMu.Unlock()
}

// linkPeers are the peers a term links to: the configured ones with a URL,
// and those gossip found.
func (r *replication) linkPeers() []Peer {
	n := r.n
	var out []Peer
	for _, p := range n.opts.Peers {
		if p.URL != "" {
			out = append(out, p)
		}
	}
	r.discoveredMu.Lock()
	defer r.discoveredMu.Unlock()
	for _, p := range r.discovered {
		if !containsPeer(out, p.Name) {
			out = append(out, p)
		}
	}
	return out
}

func containsPeer(ps []Peer, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// notLeader is the answer to what needs the leader on a node that does not
// lead: nothing was done.
// Ready, AwaitTerm and NotLeader are what the router reads of the lead
// (forward.Leadership).
func (l *leadState) Ready() bool                         { return l.ready.Load() }
func (l *leadState) AwaitTerm(ctx context.Context) error { return l.awaitTerm(ctx) }
func (l *leadState) NotLeader() error                    { return l.notLeader() }

func (l *leadState) notLeader() error {
	n := l.n
	id, addr := n.group.Leader()
	if id == n.nodeID {
		return fmt.Errorf("%w: this node was just elected and is applying the log", api.ErrNotWritten)
	}
	return fmt.Errorf("%w: %w", api.ErrNotWritten, &cluster.NotLeaderError{LeaderID: id, LeaderAddr: addr})
}

// awaitTerm waits, while this node leads, for its term to begin (at most
// twice the election timeout): a write that reaches a node elected a
// moment ago is stamped once the log is applied, not refused.
func (l *leadState) awaitTerm(ctx context.Context) error {
	n := l.n
	if l.ready.Load() {
		return nil
	}
	deadline := time.Now().Add(2 * n.opts.Raft.ElectionTimeout)
	for !l.ready.Load() {
		if !n.group.IsLeader() || time.Now().After(deadline) {
			return l.notLeader()
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

// Applied and AwaitApplied are the router's view (forward.Progress).
func (p *progress) Applied() uint64                                  { return p.get() }
func (p *progress) AwaitApplied(ctx context.Context, i uint64) error { return p.wait(ctx, i) }

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

// followerLinks is what a node that does not lead shows of its cluster's
// links: where each peer's cursor stands in the log, state follower.
func (r *replication) followerLinks() []client.LinkStatus {
	n := r.n
	out := []client.LinkStatus{} // [] in JSON, as a leader answers: the dashboard iterates it
	last := n.out.Last()
	for _, p := range r.linkPeers() {
		st := client.LinkStatus{Peer: p.Name, URL: p.URL, State: transport.StateFollower, Last: last}
		if c, ok, err := n.store.Cursor(p.Name); err == nil && ok && c.Stream == n.out.Stream() {
			st.Acked = c.Index
			if last > c.Index {
				st.EntriesBehind = last - c.Index
				st.BytesBehind = n.out.BytesAfter(c.Index)
			}
		}
		out = append(out, st)
	}
	return out
}

// cursorOf reads a peer's cursor as the log holds it.
func (r *replication) cursorOf(peer string) (entry.Cursor, bool) {
	n := r.n
	c, ok, err := n.store.Cursor(peer)
	return c, ok && err == nil
}

// onPeer links to a member of another cluster gossip found (or updates the
// link's liveness and URL), when a secret is configured for its cluster:
// at once on the leader, and at every term.
func (r *replication) onPeer(m api.Member) {
	n := r.n
	c := m.Meta.Cluster
	var cfg *Peer
	for i := range n.opts.Peers {
		if n.opts.Peers[i].Name == c {
			cfg = &n.opts.Peers[i]
		}
	}
	if sh, err := r.shipper(c); err == nil {
		sh.SetLiveness(m.State)
		if cfg != nil && cfg.URL != "" {
			n.gossip.Note(m.Node, true, "static --peer URL wins over gossip")
			return
		}
		if m.Meta.Replicate != "" && m.State == api.LiveAlive {
			sh.SetURL(m.Meta.Replicate)
		}
		n.gossip.Note(m.Node, true, "")
		return
	}
	switch {
	case cfg == nil && !n.opts.InsecurePeers:
		n.gossip.Note(m.Node, false, fmt.Sprintf("no secret configured for cluster %s: shown, not shipped to", c))
		return
	case m.State != api.LiveAlive || m.Meta.Replicate == "":
		return
	}
	p := Peer{Name: c, URL: m.Meta.Replicate}
	if cfg != nil {
		p.Secret, p.Overflow, p.AllowUnproven = cfg.Secret, cfg.Overflow, cfg.AllowUnproven
	} else {
		n.acceptor.SetPeer(c, "")
	}
	if n.multi() {
		// Every term links to it; the current one at once.
		r.discoveredMu.Lock()
		r.discovered[c] = p
		r.discoveredMu.Unlock()
		if !n.lead.ready.Load() {
			n.gossip.Note(m.Node, false, "this node does not lead its cluster: the leader ships")
			return
		}
	}
	sh, err := r.addLink(p)
	if err != nil {
		n.log.Error("gossip: cannot ship to a discovered peer", "cluster", c, "err", err)
		return
	}
	sh.SetLiveness(m.State)
	n.gossip.Note(m.Node, true, "")
	n.log.Info("gossip: shipping to a discovered peer", "cluster", c, "url", m.Meta.Replicate)
}

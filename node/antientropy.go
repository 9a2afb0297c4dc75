package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/antientropy"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// antiEntropy is the node's part that compares its cluster's tree with a
// peer's and repairs what this cluster lacks (docs/ANTIENTROPY.md). A
// comparison runs on the leader (the admin endpoint is forwarded there): it
// holds the links that reach the peers, and it proposes the repairs. The
// leader also compares with every peer in the background, every
// Options.AntiEntropyInterval, at Options.AntiEntropyBandwidth.
type antiEntropy struct {
	n *Node
	// running lets one comparison run at a time: they share the links and
	// the store's scans.
	running sync.Mutex
	mu      struct {
		sync.Mutex
		last map[string]client.AntiEntropyStatus // by peer
		// treeTurn lets one tree request of each peer run at a time;
		// treeNext is when its next may.
		treeTurn map[string]chan struct{}
		treeNext map[string]time.Time
	}
	// bytes and repaired count what comparisons exchanged and applied
	// (on the node that ran them).
	bytes    *prometheus.CounterVec
	repaired *prometheus.CounterVec
	// refused counts the peer's versions repairs did not take, by rule.
	refused *prometheus.CounterVec
	// treeCPU, treeBytes and treePaced count what answering each peer's
	// tree requests cost, and how its requests were paced.
	treeCPU, treeBytes, treePaced *prometheus.CounterVec
	// scoped keeps the trees of filtered links' comparisons a peer asked
	// for, for the rest of its pass.
	scoped *antientropy.ScopeCache
	// checks numbers the sample checks of the kept hashes; mismatches
	// counts the leaves they found wrong.
	checks     atomic.Uint64
	mismatches prometheus.Counter
}

// checkParts is how many sample checks cover every leaf once: each checks
// one part in 16 (its versions hashed; the key space read whole).
const checkParts = 16

// minSettle is the least wait between a comparison's two looks.
const minSettle = time.Second

// settleWait bounds how long the second look waits for this cluster's link
// to the peer to deliver what it had in flight at the first.
const settleWait = 30 * time.Second

var (
	descDivergent = prometheus.NewDesc("replicator_divergent_keys",
		"Keys the leader's last complete comparison with the peer found divergent (lacked by either side; writes in flight excluded).", []string{"peer"}, nil)
	descLastPass = prometheus.NewDesc("replicator_antientropy_last_pass_timestamp_seconds",
		"When the leader's last complete comparison with the peer ended (Unix seconds).", []string{"peer"}, nil)
)

func (ae *antiEntropy) init(n *Node, reg func(prometheus.Collector)) {
	ae.n, ae.scoped = n, &antientropy.ScopeCache{}
	ae.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_antientropy_bytes_total",
		Help: "Bytes comparisons with the peer exchanged on the wire (requests and answers)."}, []string{"peer"})
	ae.repaired = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_antientropy_repaired_total",
		Help: "Versions repairs pulled from the peer and applied here."}, []string{"peer"})
	ae.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_antientropy_refused_total",
		Help: "Versions of the peer's that repairs did not take, by the inbound rule they break (origin, component, scope, unasked, clock, limits)."}, []string{"peer", "why"})
	ae.treeCPU = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_antientropy_answer_seconds_total",
		Help: "Time spent answering the peer's tree requests (its comparisons of this cluster's tree), paced to a quarter core per peer."}, []string{"peer"})
	ae.treeBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_antientropy_answer_bytes_total",
		Help: "Bytes of the peer's tree requests and their answers, charged to the link's bandwidth limit."}, []string{"peer"})
	ae.treePaced = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "replicator_antientropy_answers_paced_total",
		Help: "Tree requests of the peer that waited for their turn (waited) or were refused for a wait too long (refused)."}, []string{"peer", "outcome"})
	ae.mismatches = prometheus.NewCounter(prometheus.CounterOpts{Name: "replicator_leaf_check_mismatches_total",
		Help: "Leaves whose kept hash the sample check or a rebuild found different from the tree's data (bit rot, a hand edit, a bug), then corrected."})
	for _, c := range []prometheus.Collector{ae.bytes, ae.repaired, ae.refused, ae.treeCPU, ae.treeBytes, ae.treePaced, ae.mismatches} {
		reg(c)
	}
}

// collect exports the last comparison with each peer, from the leader only
// (a node that led once keeps an old figure, which must not stay on show).
func (ae *antiEntropy) collect(ch chan<- prometheus.Metric) {
	if !ae.n.lead.ready.Load() {
		return
	}
	ae.mu.Lock()
	defer ae.mu.Unlock()
	for peer, st := range ae.mu.last {
		if st.LastPass.IsZero() {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descDivergent, prometheus.GaugeValue, float64(st.Divergent), peer)
		ch <- prometheus.MustNewConstMetric(descLastPass, prometheus.GaugeValue, float64(st.LastPass.Unix()), peer)
	}
}

// status is what the last comparison with peer found (zero: none yet).
func (ae *antiEntropy) status(peer string) *client.AntiEntropyStatus {
	ae.mu.Lock()
	defer ae.mu.Unlock()
	st, ok := ae.mu.last[peer]
	if !ok {
		return nil
	}
	return &st
}

func (ae *antiEntropy) record(peer string, f func(st *client.AntiEntropyStatus)) {
	ae.mu.Lock()
	defer ae.mu.Unlock()
	if ae.mu.last == nil {
		ae.mu.last = map[string]client.AntiEntropyStatus{}
	}
	st := ae.mu.last[peer]
	f(&st)
	ae.mu.last[peer] = st
}

// link is the leader's link to peer (nil: none here).
func (ae *antiEntropy) link(peer string) *transport.Shipper {
	for _, sh := range ae.n.repl.links() {
		if sh.Name() == peer {
			return sh
		}
	}
	return nil
}

// answer answers a peer's tree request from this node's tree, paced: a
// peer's requests run one at a time and take at most treeShare of a core
// here, whatever their number or rate (each waits until the one before it
// has paid for its time), and their bytes are charged to the link's
// bandwidth limit (charge).
func (ae *antiEntropy) answer(ctx context.Context, sender string, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	if ae.n.restoring.Load() {
		return nil, antientropy.ErrNotKept
	}
	release, err := ae.paced(ctx, sender)
	if err != nil {
		return nil, err
	}
	defer release()
	// Scoped to what this cluster's link toward the asker carries, too.
	ls := ae.n.linkSettings(sender)
	t0 := time.Now()
	ans, err := antientropy.Local{St: ae.n.store, Toward: ls.Current(), Scoped: ae.scoped, Asker: sender}.Ask(ctx, req)
	ae.spent(sender, time.Since(t0))
	return ans, err
}

// treeShare is the share of a core one peer's tree requests may take on
// the node that answers them; maxTreeWait bounds how long one waits for
// its turn (past it: refused, the asker's pass tries again later).
const (
	treeShare   = 0.25
	maxTreeWait = 30 * time.Second
)

// paced waits for sender's turn: no other request of its running, and the
// one before it paid for. release ends the turn.
func (ae *antiEntropy) paced(ctx context.Context, sender string) (release func(), err error) {
	ae.mu.Lock()
	if ae.mu.treeTurn == nil {
		ae.mu.treeTurn, ae.mu.treeNext = map[string]chan struct{}{}, map[string]time.Time{}
	}
	turn := ae.mu.treeTurn[sender]
	if turn == nil {
		turn = make(chan struct{}, 1)
		ae.mu.treeTurn[sender] = turn
	}
	ae.mu.Unlock()
	give := time.NewTimer(maxTreeWait)
	defer give.Stop()
	refuse := func(why string) error {
		ae.treePaced.WithLabelValues(sender, "refused").Inc()
		return fmt.Errorf("node: %s's tree requests are paced to %.0f%% of a core here, one at a time: %s", sender, treeShare*100, why)
	}
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-give.C:
		return nil, refuse("another has run for longer than " + maxTreeWait.String())
	}
	release = func() { <-turn }
	ae.mu.Lock()
	wait := time.Until(ae.mu.treeNext[sender])
	ae.mu.Unlock()
	if wait <= 0 {
		return release, nil
	}
	if wait > maxTreeWait {
		release()
		return nil, refuse("the next may run in " + wait.Round(time.Second).String())
	}
	ae.treePaced.WithLabelValues(sender, "waited").Inc()
	if err := antientropy.Sleep(ctx, wait); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// spent records took of work for sender's requests: its next waits for
// took*(1/treeShare - 1) after now.
func (ae *antiEntropy) spent(sender string, took time.Duration) {
	ae.treeCPU.WithLabelValues(sender).Add(took.Seconds())
	ae.mu.Lock()
	defer ae.mu.Unlock()
	ae.mu.treeNext[sender] = time.Now().Add(time.Duration(float64(took) * (1/treeShare - 1)))
}

// charge takes the bytes of a tree exchange with sender from the link's
// bandwidth limit toward it (none: no link here, nothing to charge).
func (ae *antiEntropy) charge(ctx context.Context, sender string, n int) error {
	ae.treeBytes.WithLabelValues(sender).Add(float64(n))
	if sh := ae.link(sender); sh != nil {
		return sh.Charge(ctx, n)
	}
	return nil
}

// pace bounds what a background comparison takes (the zero pace: nothing,
// for an operator's command): bytes a second exchanged with the peer, and
// the share of a core its requests keep busy on each side. A request is one
// scan or one copy of the leaves, single-threaded, so pausing after it for
// its time times (1/cpu - 1) keeps that side's share at cpu.
type pace struct {
	bytes int64   // bytes per second with the peer (0: the link's own limit only)
	cpu   float64 // share of a core (0 or 1: no pause)
}

// wait is how long to pause after a request of n bytes that took took.
func (p pace) wait(took time.Duration, n int64) time.Duration {
	var w time.Duration
	if p.bytes > 0 {
		// n bytes at the budget take this long; what the exchange took
		// already counts.
		w = time.Duration(float64(n)/float64(p.bytes)*float64(time.Second)) - took
	}
	if p.cpu > 0 && p.cpu < 1 {
		w = max(w, time.Duration(float64(took)*(1/p.cpu-1)))
	}
	return max(w, 0)
}

// pacedTree is this side's tree, its requests paced (CPU only: no bytes
// cross).
type pacedTree struct {
	t    antientropy.Tree
	pace pace
}

func (p pacedTree) Ask(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	t0 := time.Now()
	ans, err := p.t.Ask(ctx, req)
	if err == nil {
		if wait := (pace{cpu: p.pace.cpu}).wait(time.Since(t0), 0); wait > 0 {
			if err := antientropy.Sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
	}
	return ans, err
}

// remoteTree asks a peer's tree over a link, counting the bytes, and
// pacing them when it has a budget.
type remoteTree struct {
	sh    *transport.Shipper
	bytes *atomic.Int64
	pace  pace
}

func (r remoteTree) Ask(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	t0 := time.Now()
	ans, n, err := r.sh.AskTree(ctx, req)
	r.bytes.Add(n)
	if err == nil {
		if wait := r.pace.wait(time.Since(t0), n); wait > 0 {
			if err := antientropy.Sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
	}
	return ans, err
}

// Diff compares this cluster's tree with peer's and, when repair is set,
// pulls and applies what this cluster lacks.
func (ae *antiEntropy) Diff(ctx context.Context, peer string, repair bool) (client.DiffReport, error) {
	rep, err := ae.diff(ctx, peer, repair, pace{})
	if rep == nil {
		return client.DiffReport{}, err
	}
	return rep.DiffReport, err
}

func (ae *antiEntropy) diff(ctx context.Context, peer string, repair bool, budget pace) (*antientropy.Report, error) {
	n := ae.n
	sh := ae.link(peer)
	if sh == nil {
		if !n.knownPeer(peer) {
			return nil, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
		}
		return nil, fmt.Errorf("%w: this node holds no link to %s now (not the leader, or the link is starting)", api.ErrNotWritten, peer)
	}
	if repair && n.machine.Format() < machine.FormatRepair {
		return nil, fmt.Errorf("%w: the cluster's log is at format %d; repairs need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, n.machine.Format(), machine.FormatRepair)
	}
	ae.running.Lock()
	defer ae.running.Unlock()
	rep, err := ae.compare(ctx, sh, peer, repair, budget)
	ae.record(peer, func(st *client.AntiEntropyStatus) {
		if err != nil {
			st.Error = err.Error()
			return
		}
		st.Error = ""
		st.LastPass = time.Now().UTC().Truncate(time.Second)
		st.Equal, st.Divergent, st.InFlight, st.Bytes, st.Seconds = rep.Equal, len(rep.Divergent), rep.InFlight, rep.Bytes, rep.Seconds
		if rep.Repaired > 0 {
			st.Repaired += rep.Repaired
		}
	})
	return rep, err
}

func (ae *antiEntropy) compare(ctx context.Context, sh *transport.Shipper, peer string, repair bool, budget pace) (*antientropy.Report, error) {
	n := ae.n
	start := time.Now()
	var bytes atomic.Int64
	// What this cluster's link had in flight at the first look must have
	// arrived before the second: the link's acknowledged index reaching
	// the stream's last index of then (the hwm rule, for this side's
	// writes); the peer's writes in flight here are given the settle time.
	st0 := ae.linkAt(sh)
	behind := false
	sleep := func(ctx context.Context, d time.Duration) error {
		if err := antientropy.Sleep(ctx, d); err != nil {
			return err
		}
		deadline := time.Now().Add(settleWait)
		for ae.linkAt(sh).Acked < st0.Last {
			if time.Now().After(deadline) {
				behind = true
				return nil
			}
			if err := antientropy.Sleep(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		}
		return nil
	}
	ls := n.linkSettings(peer)
	settle := max(minSettle, 2*time.Duration(st0.OldestUnackedAge*float64(time.Second)))
	// This side lists only what its own link filter lets cross toward the
	// peer, whatever scope the peer says it compared: the keys this side
	// lists go to the peer by name in the second look.
	local := pacedTree{antientropy.Local{St: n.store, Toward: ls.Current(), Scoped: ae.scoped}, budget}
	rep, err := antientropy.Compare(ctx, peer, local, remoteTree{sh, &bytes, budget}, antientropy.Options{
		Settle: settle, Sleep: sleep, Counted: bytes.Load, PeerBehind: func() bool { return behind },
		Filter: ls.Current(), Pass: rand.Uint64(), Local: n.cluster})
	ae.bytes.WithLabelValues(peer).Add(float64(bytes.Load()))
	if err != nil {
		return nil, fmt.Errorf("node: compare with %s: %w", peer, err)
	}
	if repair {
		rep.Repaired = 0
		var pulls []wire.TreeVersion
		scope := func(key string) bool {
			return ls.Current().Match(key) && (ls.FromPeer == nil || ls.FromPeer.Match(key))
		}
		logged := 0
		for _, v := range rep.Pulls() {
			if why, err := ae.refuses(peer, scope, &v); err != nil {
				rep.Refuse(why, 1)
				if logged++; logged <= 3 {
					n.log.Warn("a repair did not pull a version the inbound path would refuse", "peer", peer, "key", v.Key, "err", err)
				}
				continue
			}
			pulls = append(pulls, v)
		}
		if rep.Refused > 0 {
			n.log.Warn("a repair did not take versions of the peer's", "peer", peer, "refused", rep.Refused, "why", rep.RefusedWhy)
		}
		for why, k := range rep.RefusedWhy {
			ae.refused.WithLabelValues(peer, why).Add(float64(k))
		}
		for len(pulls) > 0 {
			chunk := pulls[:repairChunk(pulls)]
			pulls = pulls[len(chunk):]
			res, err := n.cons.commitCommand(&machine.Command{Repair: &machine.RepairCmd{Peer: peer, Versions: chunk}})
			if err != nil {
				return rep, fmt.Errorf("node: repair from %s (%d versions applied before): %w", peer, rep.Repaired, err)
			}
			rep.Repaired += res.Repair.Applied
			if k := res.Repair.Resurrections; k > 0 {
				// Collected meanwhile: judged possible resurrections at
				// the apply, in commit order.
				rep.Refused += k
				n.log.Warn("a repair did not take versions older than the tree's collection horizon, of keys it holds nothing of (possible resurrections)",
					"peer", peer, "versions", k)
			}
		}
		ae.repaired.WithLabelValues(peer).Add(float64(rep.Repaired))
	}
	rep.Seconds = time.Since(start).Seconds()
	lvl := n.log.Info
	if len(rep.Divergent) > 0 {
		lvl = n.log.Warn
	}
	lvl("compared the tree with a peer's", "peer", peer, "equal", rep.Equal, "leaves_differing", rep.LeavesDiffering,
		"divergent", len(rep.Divergent), "in_flight", rep.InFlight, "bytes", rep.Bytes, "repaired", rep.Repaired, "seconds", rep.Seconds)
	return rep, nil
}

// RebuildTree sums every kept leaf afresh from this node's tree and
// corrects the wrong ones (the check's whole sample at once; writes go on).
// What the check found is counted as it counts it.
func (ae *antiEntropy) RebuildTree(ctx context.Context) (client.TreeRebuild, error) {
	n := ae.n
	if n.restoring.Load() || n.store.Leaves() == nil {
		return client.TreeRebuild{}, fmt.Errorf("%w: %w", api.ErrNotWritten, antientropy.ErrNotKept)
	}
	start := time.Now()
	bad, err := n.store.CheckLeaves(func(int) bool { return true }, true)
	if err != nil {
		return client.TreeRebuild{}, fmt.Errorf("node: rebuild the kept hashes: %w", err)
	}
	rep := client.TreeRebuild{Leaves: hashtree.Leaves, Corrected: len(bad), First: bad[:min(len(bad), 16)], Seconds: time.Since(start).Seconds()}
	if len(bad) > 0 {
		ae.mismatches.Add(float64(len(bad)))
		n.log.Error("the rebuild found the tree changed beneath the kept hashes (bit rot, a hand edit, or a bug): the hashes are corrected; "+
			"compare with the peers (replicator diff) to find the keys", "leaves", len(bad), "first", bad[0])
	}
	return rep, nil
}

// refuses says why a repair must not pull v: what the inbound path refuses
// from a peer is not taken by a repair either. A version stamped too far
// ahead of this node's clock would drag the cluster's clock into the future
// (a peer whose clock runs ahead); a key or a value past this node's limits
// (a peer configured with larger ones) is one this node never takes.
//
// A repair from peer takes only the peer's own writes, as the inbound path
// takes from that peer only what it authored: a version of another origin
// (this cluster's own, a third cluster's, one nobody knows), a counter
// component of another cluster, or a key outside the link's filters (this
// side's toward the peer, and the peer's toward this side as its heartbeats
// told it) is refused, whatever the peer's answer says. why names the rule.
func (ae *antiEntropy) refuses(peer string, inScope func(key string) bool, v *wire.TreeVersion) (why string, err error) {
	n := ae.n
	if v.Counter {
		for _, c := range v.Totals {
			if entry.ComponentCluster(c.Cluster) != peer {
				return "component", fmt.Errorf("a counter component of %q, not of %s", c.Cluster, peer)
			}
		}
	} else if v.Origin != peer {
		return "origin", fmt.Errorf("a version of %q, not %s's own write", v.Origin, peer)
	}
	if !inScope(v.Key) {
		return "scope", errors.New("a key outside the link's filters")
	}
	if err := n.clock.CheckOffset(v.Stamp); err != nil {
		return "clock", err
	}
	if len(v.Key) > n.opts.MaxKeyBytes || !utf8.ValidString(v.Key) {
		return "limits", fmt.Errorf("a key of %d bytes (limit %d) or not UTF-8", len(v.Key), n.opts.MaxKeyBytes)
	}
	if len(v.Value) > n.opts.MaxValueBytes {
		return "limits", fmt.Errorf("a value of %d bytes (limit %d)", len(v.Value), n.opts.MaxValueBytes)
	}
	return "", nil
}

// pass compares with every peer in turn, in the background (the leader
// only), repairing when the node is told to. It returns when the node
// stops (the comparison under way is cancelled).
func (ae *antiEntropy) pass() {
	n := ae.n
	if !n.lead.ready.Load() {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	// Exits when the pass ends or the node stops, whichever is first.
	go func() {
		select {
		case <-n.stop:
			cancel()
		case <-done:
		}
	}()
	for _, sh := range n.repl.links() {
		if ctx.Err() != nil || !n.lead.ready.Load() {
			return
		}
		if _, err := ae.diff(ctx, sh.Name(), n.opts.AntiEntropyRepair, pace{bytes: n.opts.AntiEntropyBandwidth, cpu: n.opts.AntiEntropyCPU}); err != nil && ctx.Err() == nil {
			n.log.Warn("background comparison with a peer failed; trying again at the next pass", "peer", sh.Name(), "err", err)
		}
	}
}

// check compares the kept hashes of one part of the leaves with the tree's
// data, on every node, and corrects those found wrong: they must say what
// the tree holds, so that a comparison with a peer finds the keys that
// changed beneath the log.
func (ae *antiEntropy) check() {
	n := ae.n
	part := ae.checks.Add(1) % checkParts
	bad, err := n.store.CheckLeaves(func(l int) bool { return uint64(l)%checkParts == part }, true)
	if err != nil {
		n.log.Warn("the check of the kept hashes failed; trying again at the next", "err", err)
		return
	}
	if len(bad) > 0 {
		ae.mismatches.Add(float64(len(bad)))
		n.log.Error("the tree changed beneath the kept hashes (bit rot, a hand edit, or a bug): the hashes are corrected; "+
			"compare with the peers (replicator diff) to find the keys", "leaves", len(bad), "first", bad[0])
	}
}

// repairChunk is how many of vs one repair command carries: at most 4,096
// versions and about 4 MiB of values.
func repairChunk(vs []wire.TreeVersion) int {
	size := 0
	for i := range vs {
		size += len(vs[i].Key) + len(vs[i].Value) + 64
		if i == 4096 || (i > 0 && size > 4<<20) {
			return i
		}
	}
	return len(vs)
}

// linkAt is what the link had shipped and acknowledged, and its oldest
// unacknowledged entry's age.
func (ae *antiEntropy) linkAt(sh *transport.Shipper) transport.Status {
	return sh.Status(transport.Thresholds{}, ae.n.repl.oldestCommitWall)
}

// diverge writes (or deletes) keys at this cluster without an outbound
// entry, stamped now: the peers never hear of them. For tests only (no flag
// or endpoint reaches it): the divergence a comparison must find.
func (ae *antiEntropy) diverge(keys []string, value []byte, del bool) error {
	n := ae.n
	vs := make([]wire.TreeVersion, len(keys))
	for i, k := range keys {
		vs[i] = wire.TreeVersion{Key: k, Stamp: n.clock.Now(), Origin: n.cluster, Value: value, Tombstone: del, Whole: true}
	}
	_, err := n.cons.commitCommand(&machine.Command{Repair: &machine.RepairCmd{Versions: vs}})
	return err
}

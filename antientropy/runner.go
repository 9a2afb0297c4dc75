package antientropy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Link is what a runner uses of the link to a peer (transport.Shipper):
// it asks the peer's tree over it, and charges the bytes of the peer's own
// tree requests to its bandwidth limit.
type Link interface {
	AskTree(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, int64, error)
	Charge(ctx context.Context, n int) error
	// Delivery is what the link shipped (its stream's last index when it
	// looked), the peer acknowledged, and its oldest unacknowledged
	// entry's age.
	Delivery() (last, acked uint64, oldest time.Duration)
}

// Deps is what a runner needs of its node: values and functions, never the
// node.
type Deps struct {
	// Cluster is this node's cluster; Store its tree; Clock its clock.
	Cluster string
	Store   *store.Store
	Clock   *hlc.Clock
	Logger  *slog.Logger
	// MaxKeyBytes and MaxValueBytes are this node's limits: a repair
	// never takes what the inbound path would refuse.
	MaxKeyBytes, MaxValueBytes int
	// Leading reports this node leads (its term began); Restoring that a
	// snapshot's tree replaces the store's (no tree is answered then).
	Leading, Restoring func() bool
	// Link is this node's link to peer (false: none here); Peers the
	// peers linked; KnownPeer whether a peer is configured at all.
	Link      func(peer string) (Link, bool)
	Peers     func() []string
	KnownPeer func(peer string) bool
	// Filters are the link's filters: this side's toward the peer, and the
	// peer's toward this side as its heartbeats told (nil: not heard).
	Filters func(peer string) (toward entry.Filter, fromPeer *entry.Filter)
	// Format is the log's command format; Commit commits a command
	// through the cluster's log (a repair).
	Format func() int
	Commit func(*machine.Command) (*machine.Result, error)
	// Register registers the runner's metrics.
	Register func(prometheus.Collector)
	// Repair, Bandwidth and CPU are the background pass's: whether it
	// repairs, and the bytes a second and the share of a core it may take.
	Repair    bool
	Bandwidth int64
	CPU       float64
}

// Runner compares its cluster's tree with a peer's and repairs what this
// cluster lacks (docs/ANTIENTROPY.md). A comparison runs on the leader (the
// admin endpoint is forwarded there): it holds the links that reach the
// peers, and it proposes the repairs. The leader also compares with every
// peer in the background (Pass). Any node answers a peer's tree requests
// (Answer), paced.
type Runner struct {
	d Deps
	// running lets one comparison run at a time: they share the links and
	// the store's scans.
	running sync.Mutex
	mu      struct {
		sync.Mutex
		last map[string]api.AntiEntropyStatus // by peer
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
	scoped *ScopeCache
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

// NewRunner builds a runner from d and registers its metrics.
func NewRunner(d Deps) *Runner {
	ae := &Runner{d: d, scoped: &ScopeCache{}}
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
		d.Register(c)
	}
	return ae
}

// Collect exports the last comparison with each peer, from the leader only
// (a node that led once keeps an old figure, which must not stay on show).
func (ae *Runner) Collect(ch chan<- prometheus.Metric) {
	if !ae.d.Leading() {
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

// Status is what the last comparison with peer found (nil: none yet).
func (ae *Runner) Status(peer string) *api.AntiEntropyStatus {
	ae.mu.Lock()
	defer ae.mu.Unlock()
	st, ok := ae.mu.last[peer]
	if !ok {
		return nil
	}
	return &st
}

func (ae *Runner) record(peer string, f func(st *api.AntiEntropyStatus)) {
	ae.mu.Lock()
	defer ae.mu.Unlock()
	if ae.mu.last == nil {
		ae.mu.last = map[string]api.AntiEntropyStatus{}
	}
	st := ae.mu.last[peer]
	f(&st)
	ae.mu.last[peer] = st
}

// Answer answers a peer's tree request from this node's tree, paced: a
// peer's requests run one at a time and take at most TreeShare of a core
// here, whatever their number or rate (each waits until the one before it
// has paid for its time), and their bytes are charged to the link's
// bandwidth limit (charge).
func (ae *Runner) Answer(ctx context.Context, sender string, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	if ae.d.Restoring() {
		return nil, ErrNotKept
	}
	release, err := ae.paced(ctx, sender)
	if err != nil {
		return nil, err
	}
	defer release()
	// Scoped to what this cluster's link toward the asker carries, too.
	toward, _ := ae.d.Filters(sender)
	t0 := time.Now()
	ans, err := Local{St: ae.d.Store, Toward: toward, Scoped: ae.scoped, Asker: sender}.Ask(ctx, req)
	ae.spent(sender, time.Since(t0))
	return ans, err
}

// TreeShare is the share of a core one peer's tree requests may take on
// the node that answers them; maxTreeWait bounds how long one waits for
// its turn (past it: refused, the asker's pass tries again later).
const (
	TreeShare   = 0.25
	maxTreeWait = 30 * time.Second
)

// paced waits for sender's turn: no other request of its running, and the
// one before it paid for. release ends the turn.
func (ae *Runner) paced(ctx context.Context, sender string) (release func(), err error) {
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
		return fmt.Errorf("antientropy: %s's tree requests are paced to %.0f%% of a core here, one at a time: %s", sender, TreeShare*100, why)
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
	if err := Sleep(ctx, wait); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// spent records took of work for sender's requests: its next waits for
// took*(1/TreeShare - 1) after now.
func (ae *Runner) spent(sender string, took time.Duration) {
	ae.treeCPU.WithLabelValues(sender).Add(took.Seconds())
	ae.mu.Lock()
	defer ae.mu.Unlock()
	ae.mu.treeNext[sender] = time.Now().Add(time.Duration(float64(took) * (1/TreeShare - 1)))
}

// Charge takes the bytes of a tree exchange with sender from the link's
// bandwidth limit toward it (none: no link here, nothing to charge).
func (ae *Runner) Charge(ctx context.Context, sender string, n int) error {
	ae.treeBytes.WithLabelValues(sender).Add(float64(n))
	if l, ok := ae.d.Link(sender); ok {
		return l.Charge(ctx, n)
	}
	return nil
}

// Answered is what answering sender's tree requests cost here: the time
// spent, and the bytes charged to the link.
func (ae *Runner) Answered(sender string) (seconds, bytes float64) {
	return counterValue(ae.treeCPU.WithLabelValues(sender)), counterValue(ae.treeBytes.WithLabelValues(sender))
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
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
	t    Tree
	pace pace
}

func (p pacedTree) Ask(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	t0 := time.Now()
	ans, err := p.t.Ask(ctx, req)
	if err == nil {
		if wait := (pace{cpu: p.pace.cpu}).wait(time.Since(t0), 0); wait > 0 {
			if err := Sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
	}
	return ans, err
}

// remoteTree asks a peer's tree over a link, counting the bytes, and
// pacing them when it has a budget.
type remoteTree struct {
	sh    Link
	bytes *atomic.Int64
	pace  pace
}

func (r remoteTree) Ask(ctx context.Context, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
	t0 := time.Now()
	ans, n, err := r.sh.AskTree(ctx, req)
	r.bytes.Add(n)
	if err == nil {
		if wait := r.pace.wait(time.Since(t0), n); wait > 0 {
			if err := Sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
	}
	return ans, err
}

// Diff compares this cluster's tree with peer's and, when repair is set,
// pulls and applies what this cluster lacks.
func (ae *Runner) Diff(ctx context.Context, peer string, repair bool) (api.DiffReport, error) {
	rep, err := ae.diff(ctx, peer, repair, pace{})
	if rep == nil {
		return api.DiffReport{}, err
	}
	return rep.DiffReport, err
}

func (ae *Runner) diff(ctx context.Context, peer string, repair bool, budget pace) (*Report, error) {
	sh, ok := ae.d.Link(peer)
	if !ok {
		if !ae.d.KnownPeer(peer) {
			return nil, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
		}
		return nil, fmt.Errorf("%w: this node holds no link to %s now (not the leader, or the link is starting)", api.ErrNotWritten, peer)
	}
	if f := ae.d.Format(); repair && f < machine.FormatRepair {
		return nil, fmt.Errorf("%w: the cluster's log is at format %d; repairs need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, f, machine.FormatRepair)
	}
	ae.running.Lock()
	defer ae.running.Unlock()
	rep, err := ae.compare(ctx, sh, peer, repair, budget)
	ae.record(peer, func(st *api.AntiEntropyStatus) {
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

func (ae *Runner) compare(ctx context.Context, sh Link, peer string, repair bool, budget pace) (*Report, error) {
	d := ae.d
	start := time.Now()
	var bytes atomic.Int64
	// What this cluster's link had in flight at the first look must have
	// arrived before the second: the link's acknowledged index reaching
	// the stream's last index of then (the hwm rule, for this side's
	// writes); the peer's writes in flight here are given the settle time.
	last0, _, oldest0 := sh.Delivery()
	behind := false
	sleep := func(ctx context.Context, d time.Duration) error {
		if err := Sleep(ctx, d); err != nil {
			return err
		}
		deadline := time.Now().Add(settleWait)
		for _, acked, _ := sh.Delivery(); acked < last0; _, acked, _ = sh.Delivery() {
			if time.Now().After(deadline) {
				behind = true
				return nil
			}
			if err := Sleep(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		}
		return nil
	}
	toward, fromPeer := d.Filters(peer)
	settle := max(minSettle, 2*oldest0)
	// This side lists only what its own link filter lets cross toward the
	// peer, whatever scope the peer says it compared: the keys this side
	// lists go to the peer by name in the second look.
	local := pacedTree{Local{St: d.Store, Toward: toward, Scoped: ae.scoped}, budget}
	rep, err := Compare(ctx, peer, local, remoteTree{sh, &bytes, budget}, Options{
		Settle: settle, Sleep: sleep, Counted: bytes.Load, PeerBehind: func() bool { return behind },
		Filter: toward, Pass: rand.Uint64(), Local: d.Cluster, Expiry: d.Format() >= machine.FormatExpiry,
		Floors: d.Format() >= machine.FormatCounterFloors})
	ae.bytes.WithLabelValues(peer).Add(float64(bytes.Load()))
	if err != nil {
		return nil, fmt.Errorf("antientropy: compare with %s: %w", peer, err)
	}
	if repair {
		rep.Repaired = 0
		var pulls []wire.TreeVersion
		scope := func(key string) bool {
			return toward.Match(key) && (fromPeer == nil || fromPeer.Match(key))
		}
		logged := 0
		for _, v := range rep.Pulls() {
			if why, err := ae.refuses(peer, scope, &v); err != nil {
				rep.Refuse(why, 1)
				if logged++; logged <= 3 {
					d.Logger.Warn("a repair did not pull a version the inbound path would refuse", "peer", peer, "key", v.Key, "err", err)
				}
				continue
			}
			pulls = append(pulls, v)
		}
		if rep.Refused > 0 {
			d.Logger.Warn("a repair did not take versions of the peer's", "peer", peer, "refused", rep.Refused, "why", rep.RefusedWhy)
		}
		for why, k := range rep.RefusedWhy {
			ae.refused.WithLabelValues(peer, why).Add(float64(k))
		}
		for len(pulls) > 0 {
			chunk := pulls[:repairChunk(pulls)]
			pulls = pulls[len(chunk):]
			res, err := d.Commit(&machine.Command{Repair: &machine.RepairCmd{Peer: peer, Versions: chunk}})
			if err != nil {
				return rep, fmt.Errorf("antientropy: repair from %s (%d versions applied before): %w", peer, rep.Repaired, err)
			}
			rep.Repaired += res.Repair.Applied
			if k := res.Repair.Resurrections; k > 0 {
				// Collected meanwhile: judged possible resurrections at
				// the apply, in commit order.
				rep.Refused += k
				d.Logger.Warn("a repair did not take versions older than the tree's collection horizon, of keys it holds nothing of (possible resurrections)",
					"peer", peer, "versions", k)
			}
		}
		ae.repaired.WithLabelValues(peer).Add(float64(rep.Repaired))
	}
	rep.Seconds = time.Since(start).Seconds()
	lvl := d.Logger.Info
	if len(rep.Divergent) > 0 {
		lvl = d.Logger.Warn
	}
	lvl("compared the tree with a peer's", "peer", peer, "equal", rep.Equal, "leaves_differing", rep.LeavesDiffering,
		"divergent", len(rep.Divergent), "in_flight", rep.InFlight, "bytes", rep.Bytes, "repaired", rep.Repaired, "seconds", rep.Seconds)
	return rep, nil
}

// RebuildTree sums every kept leaf afresh from this node's tree and
// corrects the wrong ones (the check's whole sample at once; writes go on).
// What the check found is counted as it counts it.
func (ae *Runner) RebuildTree(ctx context.Context) (api.TreeRebuild, error) {
	d := ae.d
	if d.Restoring() || d.Store.Leaves() == nil {
		return api.TreeRebuild{}, fmt.Errorf("%w: %w", api.ErrNotWritten, ErrNotKept)
	}
	start := time.Now()
	bad, err := d.Store.CheckLeaves(func(int) bool { return true }, true)
	if err != nil {
		return api.TreeRebuild{}, fmt.Errorf("antientropy: rebuild the kept hashes: %w", err)
	}
	rep := api.TreeRebuild{Leaves: hashtree.Leaves, Corrected: len(bad), First: bad[:min(len(bad), 16)], Seconds: time.Since(start).Seconds()}
	if len(bad) > 0 {
		ae.mismatches.Add(float64(len(bad)))
		d.Logger.Error("the rebuild found the tree changed beneath the kept hashes (bit rot, a hand edit, or a bug): the hashes are corrected; "+
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
func (ae *Runner) refuses(peer string, inScope func(key string) bool, v *wire.TreeVersion) (why string, err error) {
	d := ae.d
	if v.Counter {
		for _, c := range append(v.Totals[:len(v.Totals):len(v.Totals)], v.Floors...) {
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
	if err := d.Clock.CheckOffset(v.Stamp); err != nil {
		return "clock", err
	}
	if len(v.Key) > d.MaxKeyBytes || !utf8.ValidString(v.Key) {
		return "limits", fmt.Errorf("a key of %d bytes (limit %d) or not UTF-8", len(v.Key), d.MaxKeyBytes)
	}
	if len(v.Value) > d.MaxValueBytes {
		return "limits", fmt.Errorf("a value of %d bytes (limit %d)", len(v.Value), d.MaxValueBytes)
	}
	if v.Expires != 0 && d.Format() < machine.FormatExpiry {
		// A node of this cluster's older build would drop it.
		return "expiry", errors.New("a version that expires, which this cluster does not keep yet (a node of it runs an older build)")
	}
	if len(v.Floors) > 0 && d.Format() < machine.FormatCounterFloors {
		return "floors", errors.New("a counter with floors, which this cluster does not keep yet (a node of it runs an older build)")
	}
	return "", nil
}

// Pass compares with every peer in turn, in the background (the leader
// only), repairing when Deps.Repair says so. It returns when stop closes
// (the comparison under way is cancelled) or the pass is done.
func (ae *Runner) Pass(stop <-chan struct{}) {
	d := ae.d
	if !d.Leading() {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	// Exits when the pass ends or the node stops, whichever is first.
	go func() {
		select {
		case <-stop:
			cancel()
		case <-done:
		}
	}()
	for _, peer := range d.Peers() {
		if ctx.Err() != nil || !d.Leading() {
			return
		}
		if _, err := ae.diff(ctx, peer, d.Repair, pace{bytes: d.Bandwidth, cpu: d.CPU}); err != nil && ctx.Err() == nil {
			d.Logger.Warn("background comparison with a peer failed; trying again at the next pass", "peer", peer, "err", err)
		}
	}
}

// Check compares the kept hashes of one part of the leaves with the tree's
// data, on every node, and corrects those found wrong: they must say what
// the tree holds, so that a comparison with a peer finds the keys that
// changed beneath the log.
func (ae *Runner) Check() {
	d := ae.d
	part := ae.checks.Add(1) % checkParts
	bad, err := d.Store.CheckLeaves(func(l int) bool { return uint64(l)%checkParts == part }, true)
	if err != nil {
		d.Logger.Warn("the check of the kept hashes failed; trying again at the next", "err", err)
		return
	}
	if len(bad) > 0 {
		ae.mismatches.Add(float64(len(bad)))
		d.Logger.Error("the tree changed beneath the kept hashes (bit rot, a hand edit, or a bug): the hashes are corrected; "+
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

// Diverge writes (or deletes) keys at this cluster without an outbound
// entry, stamped now: the peers never hear of them. For tests only (no flag
// or endpoint reaches it): the divergence a comparison must find.
func (ae *Runner) Diverge(keys []string, value []byte, del bool) error {
	d := ae.d
	vs := make([]wire.TreeVersion, len(keys))
	for i, k := range keys {
		vs[i] = wire.TreeVersion{Key: k, Stamp: d.Clock.Now(), Origin: d.Cluster, Value: value, Tombstone: del, Whole: true}
	}
	_, err := d.Commit(&machine.Command{Repair: &machine.RepairCmd{Versions: vs}})
	return err
}

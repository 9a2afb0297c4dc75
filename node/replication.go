package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
	"github.com/replicator/replicator/wire"
)

// setupReplication builds the acceptor and one shipper per peer with a URL
// (peers known only by a secret get theirs when gossip finds them).
// replication is the node's links to its peer clusters: a shipper per
// peer, started for the node's stream while it may ship (a node alone: from
// Start; a cluster of several: during each term of its leader), and the
// operator's actions on them.
type replication struct {
	n        *Node // whose stream, store and leadership the links follow
	linksMu  sync.RWMutex
	shippers []*transport.Shipper // guarded by linksMu
	replCtx  context.Context      // set by startReplication, under linksMu
	// linkCtx is what shippers run under (guarded by linksMu): replCtx
	// for a node alone; a term's, in a cluster of several (nil between
	// terms: no shipper runs).
	linkCtx context.Context
	// linksBuilding: a term is making its links (they start once it began).
	linksBuilding bool
	linkWG        sync.WaitGroup // shipper goroutines
	// linkStates is each link's last state, to log changes once.
	linkStatesMu sync.Mutex
	linkStates   map[string]string
	// kept is what the last collection kept for each link (its filter
	// held the deletes back); guarded by keptMu.
	keptMu sync.Mutex
	kept   map[string]machine.KeptCount
	// idle is each peer's idle frontier, from its heartbeats (guarded by
	// idleMu): a peer that writes nothing holds collection back no more
	// than to its last heartbeat. In memory: a new leader starts from the
	// streams' marks again.
	idleMu sync.Mutex
	idle   map[string]hlc.Timestamp
	// acks rings at every answer a link receives (RESP WAIT listens).
	acks bell
	// discovered are peers gossip found (a term links to them too).
	discoveredMu sync.Mutex
	discovered   map[string]Peer
}

// bell wakes whoever listens at the next ring: a channel closed then and
// replaced. The zero bell is ready.
type bell struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns the channel the next ring closes.
func (b *bell) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *bell) ring() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// idleBound is a bound every entry appended from now on is committed
// above, and the stream's last index, read in that order: the clock, then
// the floor of a group being stamped, then the end of the stream
// (transport.Options.IdleBound, as tombstoneCutoff reads them).
func (r *replication) idleBound() (hlc.Timestamp, uint64) {
	n := r.n
	bound := n.clock.Now() // every commit after it is above it
	if f := n.com.Floor(); f != nil && f.Less(bound) {
		bound = *f
	}
	return bound, n.out.Last()
}

// noteIdle records a peer's idle frontier (acceptor.Options.OnIdle).
func (r *replication) noteIdle(peer string, bound hlc.Timestamp) {
	r.idleMu.Lock()
	defer r.idleMu.Unlock()
	if r.idle == nil {
		r.idle = map[string]hlc.Timestamp{}
	}
	if r.idle[peer].Less(bound) {
		r.idle[peer] = bound
	}
}

// keptFor is what the last collection kept for the link to peer (nil:
// nothing).
func (r *replication) keptFor(peer string) *client.KeptTombstones {
	r.keptMu.Lock()
	defer r.keptMu.Unlock()
	k, ok := r.kept[peer]
	if !ok {
		return nil
	}
	return &client.KeptTombstones{Tombstones: k.Tombstones, Ranges: k.Ranges, Bytes: k.Bytes}
}

// keptForPeerLinks is what the last collection kept of peer's deletes for
// the peer's other links (nil: nothing).
func (r *replication) keptForPeerLinks(peer string) *client.KeptTombstones {
	r.keptMu.Lock()
	defer r.keptMu.Unlock()
	var sum *client.KeptTombstones
	for name, k := range r.kept {
		if strings.HasPrefix(name, peer+"->") {
			if sum == nil {
				sum = &client.KeptTombstones{}
			}
			sum.Tombstones += k.Tombstones
			sum.Ranges += k.Ranges
			sum.Bytes += k.Bytes
		}
	}
	return sum
}

// keepRanges are, per link, the ranges whose tombstones a collection keeps
// (entry.LinkSettings.KeepSpans), in the order a collect command carries
// them (nil before format 7: the log cannot carry them yet).
func (r *replication) keepRanges() []machine.KeepRanges {
	n := r.n
	if n.machine.Format() < machine.FormatKeptTombstones {
		return nil
	}
	// The peers this node links to (configured, or found by gossip): a
	// link the log still records for a peer removed since keeps nothing
	// (its narrowing could never be released or widened).
	peers := map[string]bool{}
	for _, p := range n.opts.Peers {
		peers[p.Name] = true
	}
	for _, p := range r.linkPeers() {
		peers[p.Name] = true
	}
	var out []machine.KeepRanges
	for _, name := range slices.Sorted(maps.Keys(peers)) {
		ls := n.settings.Of(name)
		if spans := ls.KeepSpans(); len(spans) > 0 {
			out = append(out, machine.KeepRanges{Peer: name, Spans: spans})
		}
		// The ranges the peer keeps for its own other links, as its
		// heartbeats said: its deletes there stay here too, so that one it
		// loses with its data comes back to it by its rejoin (and reaches
		// the other link when that widens).
		for _, on := range ls.Onward {
			if on.Target != n.cluster && len(on.Spans) > 0 {
				out = append(out, machine.KeepRanges{Peer: on.Target, Origin: name, Spans: on.Spans})
			}
		}
	}
	slices.SortFunc(out, func(a, b machine.KeepRanges) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Origin, b.Origin))
	})
	return out
}

// keepsBesides are the ranges this cluster keeps for its links other than
// to peer (transport.Options.Keeps): the peer keeps this cluster's deletes
// there too.
func (r *replication) keepsBesides(peer string) []wire.TargetSpans {
	var out []wire.TargetSpans
	for _, k := range r.keepRanges() {
		if k.Origin == "" && k.Peer != peer {
			out = append(out, wire.TargetSpans{Target: k.Peer, Spans: k.Spans})
		}
	}
	return out
}

func (r *replication) setupReplication() error {
	n := r.n
	secrets := make(map[string]string, len(n.opts.Peers))
	for _, p := range n.opts.Peers {
		secrets[p.Name] = p.Secret
	}
	n.acceptor = acceptor.New(n.store, &n.cons, n.clock, acceptor.Options{
		Local: n.cluster,
		Tree: func(ctx context.Context, sender string, req *wire.TreeRequest) (*wire.TreeAnswer, error) {
			return n.ae.Answer(ctx, sender, req)
		},
		TreeCharge:         func(ctx context.Context, sender string, k int) error { return n.ae.Charge(ctx, sender, k) },
		Version:            n.opts.BuildVersion,
		Secrets:            secrets,
		Insecure:           n.opts.InsecurePeers,
		CertCluster:        n.tls.CertCluster,
		MaxBodyBytes:       n.opts.MaxReplicateBytes,
		MaxKeyBytes:        n.opts.MaxKeyBytes,
		MaxValueBytes:      n.opts.MaxValueBytes,
		TakesOriginFilters: func() bool { return n.machine.Format() >= machine.FormatOriginFilters },
		OnIdle:             n.repl.noteIdle,
		FromPeer:           func(peer string) *entry.Filter { return n.machine.Link(peer).FromPeer },
		Onward:             func(peer string) []entry.TargetSpans { return n.machine.Link(peer).Onward },
		PinWindow:          n.opts.PinWindow,
		Permits:            n.opts.Permits,
		PermitQueue:        n.opts.PermitQueue,
		PermitWait:         n.opts.PermitWait,
		MaxBodies:          n.opts.MaxBodiesInFlight,
		ObserveLag: func(origin string, lags []acceptor.Lag) {
			// Label lookups once per batch, not per entry: this runs on the
			// apply path of every replicated batch.
			total := n.metrics.lagSeconds.WithLabelValues(origin)
			ship := n.metrics.stageSeconds.WithLabelValues(origin, "ship")
			wire := n.metrics.stageSeconds.WithLabelValues(origin, "wire")
			apply := n.metrics.stageSeconds.WithLabelValues(origin, "apply")
			for _, l := range lags {
				total.Observe(l.Total.Seconds())
				if l.Staged {
					ship.Observe(l.Ship.Seconds())
					wire.Observe(l.Wire.Seconds())
					apply.Observe(l.Apply.Seconds())
				}
				if n.opts.ObserveLag != nil {
					n.opts.ObserveLag(origin, l.Total)
				}
			}
			n.lagRing.add(time.Now().UnixNano(), lags)
		},
		ObserveApply:    func(d time.Duration) { n.metrics.applySeconds.Observe(d.Seconds()) },
		OnReseedRequest: n.rejoin.OnReseedRequest,
		OnTrailer:       n.rejoin.OnTrailer,
		Leadership:      r.leadership(),
		Nodes:           r.ackNodes(),
		// Markers take format 3: a node that cannot read them would stop.
		TakesMarkers: func() bool { return n.machine.Format() >= machine.FormatLinks },
		// Contexts take format 4: before it, a member may not read them.
		TakesContexts: func() bool { return n.machine.Format() >= machine.FormatConflicts },
		ConflictValueMax: func() int {
			if n.machine.Format() < machine.FormatConflicts {
				return 0
			}
			return n.opts.ConflictValueMax
		},
		Now:    n.clock.Physical,
		Logger: n.log,
	})
	rt := n.opts.PeerTransport
	if rt == nil {
		rt = &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second, TLSClientConfig: n.tls.Client()}
	}
	n.peerClient = &http.Client{Transport: rt, CheckRedirect: forward.NoRedirects}
	if n.multi() {
		return nil // each term links to the peers (term.go)
	}
	for _, p := range n.opts.Peers {
		if p.URL == "" {
			continue
		}
		if _, err := r.addLink(p); err != nil {
			return err
		}
	}
	return nil
}

// addLink creates the shipper of a peer, and starts it if replication runs.
func (r *replication) addLink(p Peer) (*transport.Shipper, error) {
	n := r.n
	empty, err := n.store.Empty()
	if err != nil {
		return nil, err
	}
	sh, err := transport.NewShipper(transport.Peer{Name: p.Name, URL: p.URL, Secret: p.Secret, AllowUnproven: p.AllowUnproven, Compression: p.Compression}, n.out, replica.Cursors{Store: n.store, Apply: n.cons.applyCommand}, transport.Options{
		Local:           n.cluster,
		MaxBatchEntries: n.opts.MaxBatchEntries,
		MaxBatchBytes:   n.opts.MaxBatchBytes,
		Linger:          n.opts.BatchLinger,
		Client:          n.peerClient,
		Now:             n.clock.Physical,
		Applied:         n.applied.Load,
		Link:            n.settings.Of,
		IdleBound:       n.repl.idleBound,
		Keeps:           n.repl.keepsBesides,
		Partial: func(origin string, stream entry.StreamID) bool {
			ls := n.machine.Link(origin)
			return (ls.FromPeer != nil && !ls.FromPeer.All()) || slices.Contains(ls.Partial, stream)
		},
		Snapshots:    snapshots{n.store},
		AutoReseed:   !n.opts.NoAutoReseed,
		StoreHasData: !empty,
		ObserveShip: func(peer string, d time.Duration, _ int) {
			n.metrics.shipSeconds.WithLabelValues(peer).Observe(d.Seconds())
		},
		OnAck: func(peer string, ack *wire.Ack) {
			n.rejoin.OnAck(peer, ack)
			r.acks.ring()
		},
		OnConflict:   n.rejoin.OnConflict,
		OnReseedDone: n.rejoin.OnReseedDone,
		OnRewound: func(peer string) error {
			if n.machine.Format() < machine.FormatKeptTombstones {
				return nil // a build that reads no rebackfill may still apply the log
			}
			n.log.Info("the peer lost data it had acknowledged: what widenings backfilled to it is backfilled again", "peer", peer)
			return n.cons.applyCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, Rebackfill: true}})
		},
		OnBackfillDone: func(peer string, gen uint64) {
			err := n.cons.applyCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, BackfillDone: gen}})
			if err != nil {
				n.log.Warn("could not record that the peer took its backfill; it is sent again", "peer", peer, "err", err)
			}
		},
		Logger: n.log, // the shipper names the peer on every line
	})
	if err != nil {
		return nil, err
	}
	n.rejoin.RestoreReseedState(sh)
	r.linksMu.Lock()
	defer r.linksMu.Unlock()
	for _, have := range r.shippers {
		if have.Peer().Name == p.Name {
			return have, nil // made meanwhile (gossip and a term at once)
		}
	}
	if n.multi() && r.linkCtx == nil && !r.linksBuilding {
		// The term ended while the link was being made: the next one links.
		return nil, errNoTerm
	}
	r.shippers = append(r.shippers, sh)
	r.runLinkLocked(sh)
	return sh, nil
}

// errNoTerm refuses a link at a node that does not lead now.
var errNoTerm = errors.New("node: this node does not lead its cluster now")

// REQUIRES: n.repl.linksMu held.
func (r *replication) runLinkLocked(sh *transport.Shipper) {
	ctx := r.linkCtx
	if ctx == nil {
		return
	}
	r.linkWG.Add(1)
	go func() {
		// Exits when linkCtx is cancelled (Close; the end of a term).
		defer r.linkWG.Done()
		sh.Run(ctx)
	}()
}

// leadership tells the acceptor whether this node takes batches (nil for
// a node alone: it always does).
func (r *replication) leadership() func() (bool, string, []string) {
	n := r.n
	if !n.multi() {
		return nil
	}
	return func() (bool, string, []string) {
		if n.lead.ready.Load() {
			return true, "", nil
		}
		// The leader's URL is what it said of itself over the raft port
		// (refreshProven asks every member each second), never what
		// gossip reports; a leader of an older build says nothing, and
		// its gossiped URL is handed out, as that build did.
		leader := ""
		if id := n.group.LeaderServer(); id != "" && id != n.group.ID() {
			switch d, state := n.svc.Proven(id, false); state {
			case forward.DescKnown:
				leader = d.Replicate
			case forward.DescOlder:
				leader = n.svc.GossipedReplicate(id)
			}
		}
		return false, leader, n.svc.URLs()
	}
}

// ackNodes lists this cluster's nodes in acks (nil for a node alone).
func (r *replication) ackNodes() func() []string {
	n := r.n
	if !n.multi() {
		return nil
	}
	return n.svc.URLs
}

// links returns the current peer links.
func (r *replication) links() []*transport.Shipper {
	r.linksMu.RLock()
	defer r.linksMu.RUnlock()
	return append([]*transport.Shipper(nil), r.shippers...)
}

// startReplication runs the shippers and the truncation loop until stop.
func (r *replication) startReplication() {
	n := r.n
	ctx, cancel := context.WithCancel(context.Background())
	r.linksMu.Lock()
	r.replCtx = ctx
	if !n.multi() {
		r.linkCtx = ctx
	}
	for _, sh := range r.shippers {
		r.runLinkLocked(sh)
	}
	r.linksMu.Unlock()
	n.bg.Add(1)
	go func() {
		// Exits when stop is closed, after the shippers it cancels.
		defer n.bg.Done()
		t := time.NewTicker(n.opts.TruncateInterval)
		defer t.Stop()
		for {
			select {
			case <-n.stop:
				cancel()
				r.linkWG.Wait()
				return
			case <-t.C:
				if err := n.TruncateWAL(); err != nil {
					n.log.Warn("wal truncation", "err", err)
				}
			}
		}
	}()
}

// TruncateWAL drops the stream's outbound entries every peer acknowledged,
// through the cluster's log (every node drops the same).
func (n *Node) TruncateWAL() error {
	if n.com.Failed() != nil || n.closing.Load() {
		return nil
	}
	if !n.lead.ready.Load() {
		return nil // the leader's links know what the peers hold
	}
	// The command names the stream read here: if a new stream began
	// meanwhile, it cuts nothing.
	stream := n.out.Stream()
	upTo := min(n.applied.Load(), n.out.Last())
	for _, sh := range n.repl.links() {
		if sh.Retains() {
			upTo = min(upTo, sh.Acked())
		}
	}
	if upTo < n.out.First() || stream.IsZero() {
		return nil
	}
	return n.cons.applyCommand(&machine.Command{Truncate: &machine.TruncateCmd{Stream: stream, First: upTo + 1}})
}

// tombstoneCutoff is the stamp below which tombstones may go. A tombstone is
// collected only when no write older than it can still arrive here, and
// every peer has the delete (or a re-seed will carry it):
//
//   - it is older than the retention window;
//   - inbound: for every peer cluster this node takes writes from, linked or
//     not, it lies more than the pin window below that cluster's applied
//     commit frontier here (a stamp lies within the pin window of its
//     commit, and commits grow within a stream);
//   - outbound: every link has every entry of this stream committed up to
//     the stamp plus the pin window, and none is detached, in or owed a
//     re-seed (the snapshot must still carry the tombstone);
//   - no dead letter holds a write it could shadow, no rejoin is under way
//     (this node's, or a peer's that will re-seed this node), and no
//     re-seed or backfill from a peer is open here (store.OpenSnapshot).
func (r *replication) tombstoneCutoff() (hlc.Timestamp, error) {
	cutoff, _, err := r.tombstoneCutoffWhy()
	return cutoff, err
}

// tombstoneCutoffWhy is tombstoneCutoff and, when nothing may be collected
// (a zero cutoff), why: the node logs it (DEBUG) and /admin/wal shows it.
func (r *replication) tombstoneCutoffWhy() (hlc.Timestamp, string, error) {
	n := r.n
	cutoff := hlc.Timestamp{Wall: n.clock.Physical() - int64(n.opts.TombstoneRetention)}
	lower := func(ts hlc.Timestamp) {
		if ts.Less(cutoff) {
			cutoff = ts
		}
	}
	if rj, err := n.store.Rejoin(); err != nil || len(rj) > 0 {
		return hlc.Timestamp{}, "a rejoin is under way", err
	}
	if rr, err := n.store.ReseedRequests(); err != nil || len(rr) > 0 {
		return hlc.Timestamp{}, fmt.Sprintf("a peer awaits a re-seed from this cluster (%d requests)", len(rr)), err
	}
	if open, err := r.openSnapshotsOfPeers(); err != nil || open {
		// A re-seed or backfill coming in relays old versions, which a
		// tombstone collected meanwhile could no longer shadow.
		return hlc.Timestamp{}, "a re-seed or backfill from a peer is open here", err
	}
	// Outbound first: read the clock, then the floor of a group being
	// stamped, then the WAL's end, so that an entry appended after the end
	// was read is either above the clock reading or below the floor.
	clockNow := n.clock.Last()
	floorp := n.com.Floor()
	last := n.out.Last()
	for _, sh := range r.links() {
		d := sh.Delivery()
		switch {
		case !d.Complete:
			return hlc.Timestamp{}, "the link to " + sh.Peer().Name + " is detached, owed or running a re-seed", nil
		case d.Acked >= last:
			bound := clockNow
			if floorp != nil && floorp.Less(bound) {
				bound = *floorp
			}
			lower(bound.Add(-n.opts.PinWindow))
		case d.AckedCommit.IsZero():
			// not known since the cursor moved
			return hlc.Timestamp{}, "how far " + sh.Peer().Name + " has this stream is not known since its cursor moved", nil
		default:
			lower(d.AckedCommit.Add(-n.opts.PinWindow))
		}
	}
	// Inbound: a peer cluster's frontier is the furthest of its streams (a
	// stream it lost and replaced never advances again; what it lost comes
	// back by its rejoin, which blocks collection while it runs). A re-seed's
	// one-off snapshot stream records no frontier.
	hwms, err := n.store.HWMs()
	if err != nil {
		return hlc.Timestamp{}, "", err
	}
	frontier := map[string]hlc.Timestamp{}
	for _, h := range hwms {
		if f := frontier[h.Origin]; f.Less(h.Commit) {
			frontier[h.Origin] = h.Commit
		}
	}
	// A peer idle since its last heartbeat has nothing older than its
	// idle frontier to send (its entries are all here).
	r.idleMu.Lock()
	for p, b := range r.idle {
		if frontier[p].Less(b) {
			frontier[p] = b
		}
	}
	r.idleMu.Unlock()
	peers := map[string]bool{}
	for _, p := range n.acceptor.Peers() {
		peers[p] = true
	}
	for _, sh := range r.links() {
		peers[sh.Peer().Name] = true
	}
	for p := range peers {
		f, ok := frontier[p]
		if !ok || f.IsZero() {
			// Nothing known from this peer yet: it may hold any old write.
			return hlc.Timestamp{}, "nothing applied from " + p + " yet", nil
		}
		lower(f.Add(-n.opts.PinWindow))
	}
	dls, err := n.store.DeadLetters()
	if err != nil {
		return hlc.Timestamp{}, "", err
	}
	codec := wire.NewCodec()
	for _, d := range dls {
		if e, err := codec.DecodeEntry(d.Entry, wire.Defaults{}); err == nil {
			lower(e.LWW().HLC)
		}
	}
	return cutoff, "", nil
}

// openSnapshotsOfPeers says whether a re-seed or backfill is open here from
// a peer this node still takes writes from. One from a peer removed from the
// configuration never ends and can relay nothing more, so it holds nothing
// back, as re-seed requests of such peers are forgotten at start
// (pruneReseedState); with insecure peers any may come back.
func (r *replication) openSnapshotsOfPeers() (bool, error) {
	open, err := r.n.store.OpenSnapshots()
	if err != nil || len(open) == 0 {
		return false, err
	}
	if r.n.opts.InsecurePeers {
		return true, nil
	}
	for _, p := range r.n.acceptor.Peers() {
		for _, o := range open {
			if o.Sender == p {
				return true, nil
			}
		}
	}
	return false, nil
}

// oldestCommitWall reads the commit HLC's wall time of a WAL entry, for the
// age of a link's oldest unacknowledged entry.
func (r *replication) oldestCommitWall(index uint64) (int64, bool) {
	n := r.n
	p, err := n.out.ReadRaw(index)
	if err != nil {
		return 0, false
	}
	e, err := wire.NewCodec().DecodeEntry(p, wire.Defaults{Origin: n.cluster, Stream: n.out.Stream()})
	if err != nil {
		return 0, false
	}
	return e.Commit.Wall, true
}

// PeerStatus reports every link.
func (n *Node) PeerStatus() []client.LinkStatus {
	if !n.lead.ready.Load() {
		return n.repl.followerLinks()
	}
	th := transport.Thresholds{Lagging: n.opts.LinkLagging, Stalled: n.opts.LinkStalled}
	links := n.repl.links()
	out := make([]client.LinkStatus, 0, len(links))
	for _, sh := range links {
		// The shipper reports in the contract's words (package api).
		st := sh.Status(th, n.repl.oldestCommitWall)
		st.AntiEntropy = n.ae.Status(st.Peer)
		st.KeptTombstones = n.repl.keptFor(st.Peer)
		st.KeptForPeerLinks = n.repl.keptForPeerLinks(st.Peer)
		out = append(out, st)
	}
	return out
}

// shipper returns the link to a peer.
func (r *replication) shipper(peer string) (*transport.Shipper, error) {
	for _, sh := range r.links() {
		if sh.Peer().Name == peer {
			return sh, nil
		}
	}
	return nil, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
}

// Holding names the peer clusters whose links acknowledged holding the
// writes from index from to index to of stream (transport.Shipper.Holds):
// answered by the leader, which holds the links (a follower's router
// forwards GET /v1/held to it).
func (n *Node) Holding(stream entry.StreamID, from, to uint64) ([]string, error) {
	if n.multi() && !n.lead.ready.Load() {
		return nil, fmt.Errorf("%w: this node does not lead the cluster (any more): ask again", api.ErrNotWritten)
	}
	peers := []string{}
	for _, sh := range n.repl.links() {
		if sh.Holds(stream, from, to) {
			peers = append(peers, sh.Peer().Name)
		}
	}
	return peers, nil
}

// PausePeer stops shipping to a peer (its backlog is still retained).
func (n *Node) PausePeer(peer string) error {
	sh, err := n.repl.shipper(peer)
	if err == nil {
		sh.Pause()
		n.log.Info("peer paused by the operator", "peer", peer)
	}
	return err
}

// ResumePeer undoes PausePeer.
func (n *Node) ResumePeer(peer string) error {
	sh, err := n.repl.shipper(peer)
	if err == nil {
		sh.Resume()
		n.log.Info("peer resumed by the operator", "peer", peer)
	}
	return err
}

// ReseedPeer starts a re-seed of a peer: a snapshot of the whole tree
// streamed through its acceptor, then normal shipping.
func (n *Node) ReseedPeer(peer string) error {
	sh, err := n.repl.shipper(peer)
	if err == nil {
		sh.Reseed("asked by the operator")
		n.log.Info("re-seed requested by the operator", "peer", peer)
	}
	return err
}

// DetachPeer stops retaining the WAL for a peer (as overflow mode detach
// does): for a peer gone for long, whose backlog should not hold the WAL.
// It is re-seeded once it is reachable again.
func (n *Node) DetachPeer(peer string) error {
	sh, err := n.repl.shipper(peer)
	if err == nil {
		sh.Detach("detached by the operator")
		n.metrics.detached.WithLabelValues(peer).Inc()
	}
	return err
}

// watchLinks logs each change of a link's state once: a link that degrades
// at WARN with the peer and its last error, one that recovers at INFO.
func (r *replication) watchLinks() {
	n := r.n
	for _, st := range n.PeerStatus() {
		r.linkStatesMu.Lock()
		prev, seen := r.linkStates[st.Peer]
		r.linkStates[st.Peer] = st.State
		r.linkStatesMu.Unlock()
		if seen && prev == st.State {
			continue
		}
		switch st.State {
		case transport.StateHealthy:
			if seen {
				n.log.Info("peer link recovered", "peer", st.Peer, "was", prev, "last_contact", st.LastContact)
			}
		case transport.StateUnknown, transport.StatePaused, transport.StateReseeding, transport.StateFollower:
			n.log.Info("peer link state", "peer", st.Peer, "state", st.State, "was", prev)
		default:
			contact := "never"
			if !st.LastContact.IsZero() {
				contact = st.LastContact.Format(time.RFC3339)
			}
			n.log.Warn("peer link degraded", "peer", st.Peer, "state", st.State, "was", prev, "last_contact", contact,
				"consecutive_errors", st.ConsecutiveErrors, "last_error", st.LastError, "entries_behind", st.EntriesBehind)
		}
	}
}

// snapshots opens the store's snapshots as the shippers read them.
type snapshots struct{ s *store.Store }

func (s snapshots) NewSnapshot() (transport.Snapshot, error) {
	sn, err := s.s.NewSnapshot()
	if err != nil {
		return nil, err // not a nil *store.Snapshot in a non-nil interface
	}
	return sn, nil
}

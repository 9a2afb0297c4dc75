package node

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/antientropy"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/transport"
)

// What crosses each link is state of the cluster's log (machine.LinkCmd):
// a filter takes effect at a stream index, so every node and every later
// leader ships the same thing for the same index. A node's flags
// (--peer-include, --peer-exclude) seed the log once; after that the log
// wins, and an operator changes a link with PUT /admin/peers/NAME/filter.

// linkAdmin is the node's part that keeps each link's settings in step
// with the cluster's log (filters, bandwidth) and answers the admin API on
// them; the node embeds it.
type linkAdmin struct{ n *Node }

// linkSeeds remembers which differences between flags and log a node
// already logged, so that it says so once per process.
type linkSeeds struct {
	mu     sync.Mutex
	warned map[string]bool
}

// linkSettings is what the links ship by: the log's settings of the link
// or, before the log says anything of it, the filter of this node's flags,
// as holding from the first entry (the seed command records it so).
func (l linkAdmin) linkSettings(peer string) entry.LinkSettings {
	n := l.n
	ls := n.machine.Links()[peer]
	if p, ok := n.peerOption(peer); ok {
		if len(ls.Filters) == 0 && !p.Filter().All() {
			ls.Filters = []entry.FilterEpoch{{Filter: p.Filter().Normal()}}
		}
		if !ls.BandwidthSet {
			ls.Bandwidth = p.Bandwidth
		}
	}
	return ls
}

// peerOption is the configured peer of that name.
func (l linkAdmin) peerOption(name string) (Peer, bool) {
	n := l.n
	for _, p := range n.opts.Peers {
		if p.Name == name {
			return p, true
		}
	}
	return Peer{}, false
}

// seedLinks, at the leader, records the filter of each configured peer's
// flags in the log if the log says nothing of that link yet, and says once
// where the flags differ from what the log says (the log wins).
func (l linkAdmin) seedLinks() {
	n := l.n
	if n.group == nil || !n.group.IsLeader() || !n.lead.ready.Load() || n.machine.Format() < machine.FormatLinks {
		return
	}
	links := n.machine.Links()
	for _, p := range n.opts.Peers {
		f := p.Filter().Normal()
		ls, ok := links[p.Name]
		seed := &machine.LinkCmd{Peer: p.Name, Seed: true}
		if !ok || len(ls.Filters) == 0 {
			seed.SetFilter, seed.Filter = !f.All(), f
		} else if !ls.Current().Equal(f) && n.seeds.warnOnce(p.Name+"/filter") {
			n.log.Info("the cluster's log holds another filter for this link than this node's flags: the log's wins "+
				"(change it with replicator filter)", "peer", p.Name, "log", ls.Current().String(), "flags", f.String())
		}
		if !ls.BandwidthSet {
			seed.SetBandwidth, seed.Bandwidth = p.Bandwidth > 0, p.Bandwidth
		} else if ls.Bandwidth != p.Bandwidth && n.seeds.warnOnce(p.Name+"/bandwidth") {
			n.log.Info("the cluster's log holds another bandwidth limit for this link than this node's flags: the log's wins "+
				"(change it with replicator bandwidth)", "peer", p.Name, "log", ls.Bandwidth, "flags", p.Bandwidth)
		}
		if !seed.SetFilter && !seed.SetBandwidth {
			continue
		}
		if err := n.cons.applyCommand(&machine.Command{Link: seed}); err != nil {
			n.log.Warn("could not record the link's settings in the log; trying again", "peer", p.Name, "err", err)
			return
		}
		n.log.Info("the link's settings, from this node's flags, are now the cluster's", "peer", p.Name, "filter", f.String(), "bandwidth", p.Bandwidth)
	}
}

func (s *linkSeeds) warnOnce(peer string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.warned[peer] {
		return false
	}
	if s.warned == nil {
		s.warned = map[string]bool{}
	}
	s.warned[peer] = true
	return true
}

// LinkFilter is what the log says of the filter of the link to peer (and
// where each of its epochs took effect).
func (l linkAdmin) LinkFilter(peer string) (api.FilterReport, error) {
	n := l.n
	if !n.knownPeer(peer) {
		return api.FilterReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	return n.filterReport(peer), nil
}

func (l linkAdmin) filterReport(peer string) api.FilterReport {
	n := l.n
	ls := n.linkSettings(peer)
	recorded := len(n.machine.Links()[peer].Filters) > 0
	r := api.FilterReport{Peer: peer, Filter: ls.Current(), Recorded: recorded, Backfill: ls.Backfill, BackfillGeneration: ls.BackfillGen,
		Released: ls.Released, Kept: n.repl.keptFor(peer), PeerKeeps: ls.Onward, KeptForPeerLinks: n.repl.keptForPeerLinks(peer)}
	if n.machine.Format() >= machine.FormatKeptTombstones {
		r.Keep = ls.KeepSpans()
	}
	stream := n.out.Stream()
	for _, ep := range ls.Filters {
		e := api.FilterEpochReport{Filter: ep.Filter, From: ep.From}
		if ep.Stream != stream {
			e.From = 1 // holds from the start of this stream
		}
		r.Epochs = append(r.Epochs, e)
	}
	return r
}

// SetLinkFilter makes f the filter of the link to peer, from the stream's
// next index on. Widening it backfills the newly included keys to the peer;
// narrowing it stops shipping them (the peer keeps what it has).
func (l linkAdmin) SetLinkFilter(peer string, f entry.Filter) (api.FilterReport, error) {
	n := l.n
	if !n.knownPeer(peer) {
		return api.FilterReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	if err := f.Validate(); err != nil {
		return api.FilterReport{}, fmt.Errorf("%w: %w", api.ErrBadRequest, err)
	}
	if v := n.machine.Format(); v < machine.FormatLinks {
		return api.FilterReport{}, fmt.Errorf("%w: the cluster's log is at format %d; filters need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatLinks)
	}
	if ls := n.machine.Links()[peer]; len(ls.Filters) == 0 {
		// What the links ship by until now is the flags' filter: the log
		// records it first, so that the change widens or narrows from it.
		if p, ok := n.peerOption(peer); ok && !p.Filter().All() {
			seed := &machine.LinkCmd{Peer: peer, SetFilter: true, Filter: p.Filter().Normal(), Seed: true}
			if err := n.cons.applyCommand(&machine.Command{Link: seed}); err != nil {
				return api.FilterReport{}, err
			}
		}
	}
	res, err := n.cons.commitCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetFilter: true, Filter: f.Normal()}})
	if err != nil {
		return api.FilterReport{}, err
	}
	if !res.Swapped && !res.Skipped {
		return api.FilterReport{}, fmt.Errorf("%w: the link to %s has %d filters in force for entries its stream still keeps (the bound): "+
			"change it again once the peer has acknowledged those entries and the stream was cut", api.ErrNotWritten, peer, machine.MaxFilterEpochs)
	}
	n.log.Warn("the link's filter changed", "peer", peer, "filter", f.Normal().String())
	return n.filterReport(peer), nil
}

// ReleaseLinkFilter declares the narrowing of the link to peer permanent:
// the ranges its filter keeps home now keep no tombstones for a later
// widening any more (the next collection drops them once past the cutoff).
// A later widening of them backfills what the tree holds then; keys the
// peer holds that this cluster deleted meanwhile stay there, and a
// comparison lists them as possible resurrections (docs/DATAMODEL.md
// "Filters").
func (l linkAdmin) ReleaseLinkFilter(peer string) (api.FilterReport, error) {
	n := l.n
	if !n.knownPeer(peer) {
		return api.FilterReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	if v := n.machine.Format(); v < machine.FormatKeptTombstones {
		return api.FilterReport{}, fmt.Errorf("%w: the cluster's log is at format %d; releasing a narrowing needs format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatKeptTombstones)
	}
	if ls := n.linkSettings(peer); ls.Current().All() {
		return api.FilterReport{}, fmt.Errorf("%w: the link to %s lets every key cross: there is no narrowing to release", api.ErrBadRequest, peer)
	}
	if ls := n.machine.Links()[peer]; len(ls.Filters) == 0 {
		// The flags' filter, not recorded yet: the log records it first.
		if p, ok := n.peerOption(peer); ok && !p.Filter().All() {
			seed := &machine.LinkCmd{Peer: peer, SetFilter: true, Filter: p.Filter().Normal(), Seed: true}
			if err := n.cons.applyCommand(&machine.Command{Link: seed}); err != nil {
				return api.FilterReport{}, err
			}
		}
	}
	if _, err := n.cons.commitCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, Release: true}}); err != nil {
		return api.FilterReport{}, err
	}
	n.log.Warn("the link's narrowing declared permanent: the tombstones kept for a widening go at the next collection", "peer", peer,
		"released", n.linkSettings(peer).Released)
	return n.filterReport(peer), nil
}

// knownPeer reports a peer this node links to or takes writes from.
func (l linkAdmin) knownPeer(peer string) bool {
	n := l.n
	if _, ok := n.peerOption(peer); ok {
		return true
	}
	for _, st := range n.PeerStatus() {
		if st.Peer == peer {
			return true
		}
	}
	return false
}

// SetLinkBandwidth sets the link's limit in bytes per second of request
// bodies as sent (0: none), through the log: it holds at once, at every
// node that leads later too.
func (l linkAdmin) SetLinkBandwidth(peer string, bytesPerSec int64) (api.BandwidthReport, error) {
	n := l.n
	if !n.knownPeer(peer) {
		return api.BandwidthReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	if bytesPerSec < 0 || (bytesPerSec > 0 && bytesPerSec < 1024) {
		return api.BandwidthReport{}, fmt.Errorf("%w: bandwidth %d bytes/s: 0 (no limit) or at least 1024", api.ErrBadRequest, bytesPerSec)
	}
	if v := n.machine.Format(); v < machine.FormatLinks {
		return api.BandwidthReport{}, fmt.Errorf("%w: the cluster's log is at format %d; link settings need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, machine.FormatLinks)
	}
	if _, err := n.cons.commitCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetBandwidth: true, Bandwidth: bytesPerSec}}); err != nil {
		return api.BandwidthReport{}, err
	}
	n.log.Warn("the link's bandwidth limit changed", "peer", peer, "bytes_per_second", bytesPerSec)
	return n.LinkBandwidth(peer)
}

// LinkBandwidth is the link's bandwidth limit and how long it throttled.
func (l linkAdmin) LinkBandwidth(peer string) (api.BandwidthReport, error) {
	n := l.n
	if !n.knownPeer(peer) {
		return api.BandwidthReport{}, fmt.Errorf("%w: no peer %q", api.ErrNotFound, peer)
	}
	ls := n.linkSettings(peer)
	r := api.BandwidthReport{Peer: peer, BytesPerSecond: ls.Bandwidth, Recorded: ls.BandwidthSet}
	for _, st := range n.PeerStatus() {
		if st.Peer == peer {
			r.ThrottledSeconds = st.ThrottledSeconds
		}
	}
	return r, nil
}

// newAntiEntropy builds the node's anti-entropy runner (package
// antientropy) over its links, tree and log; reg registers its metrics.
func (n *Node) newAntiEntropy(reg func(prometheus.Collector)) *antientropy.Runner {
	return antientropy.NewRunner(antientropy.Deps{
		Cluster: n.cluster, Store: n.store, Clock: n.clock, Logger: n.log,
		MaxKeyBytes: n.opts.MaxKeyBytes, MaxValueBytes: n.opts.MaxValueBytes,
		Leading: n.lead.ready.Load, Restoring: n.restoring.Load,
		Link: func(peer string) (antientropy.Link, bool) {
			for _, sh := range n.repl.links() {
				if sh.Name() == peer {
					return aeLink{sh, n.repl.oldestCommitWall}, true
				}
			}
			return nil, false
		},
		Peers: func() []string {
			var out []string
			for _, sh := range n.repl.links() {
				out = append(out, sh.Name())
			}
			return out
		},
		KnownPeer: n.knownPeer,
		Filters: func(peer string) (entry.Filter, *entry.Filter) {
			ls := n.linkSettings(peer)
			return ls.Current(), ls.FromPeer
		},
		Format:   n.machine.Format,
		Commit:   n.cons.commitCommand,
		Register: reg,
		Repair:   n.opts.AntiEntropyRepair, Bandwidth: n.opts.AntiEntropyBandwidth, CPU: n.opts.AntiEntropyCPU,
	})
}

// aeLink is a link as anti-entropy sees it: what it delivered, read with
// the node's view of the stream's oldest commit.
type aeLink struct {
	*transport.Shipper
	oldest func(index uint64) (int64, bool)
}

func (l aeLink) Delivery() (last, acked uint64, oldest time.Duration) {
	st := l.Status(transport.Thresholds{}, l.oldest)
	return st.Last, st.Acked, time.Duration(st.OldestUnackedAge * float64(time.Second))
}

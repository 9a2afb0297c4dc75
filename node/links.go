package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/antientropy"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/transport"
)

// newAntiEntropy builds the node's anti-entropy runner (package
// antientropy) over its links, tree and log; reg registers its metrics.
func (n *Node) newAntiEntropy(reg func(prometheus.Collector)) *antientropy.Runner {
	return antientropy.NewRunner(antientropy.Deps{
		Cluster: n.cluster, Store: n.store, Clock: n.clock, Logger: n.log,
		MaxKeyBytes: n.opts.MaxKeyBytes, MaxValueBytes: n.opts.MaxValueBytes,
		Leading: n.rep.Ready, Restoring: n.rep.Restoring,
		Link: func(peer string) (antientropy.Link, bool) {
			for _, sh := range n.links.All() {
				if sh.Name() == peer {
					return aeLink{sh, n.links.OldestCommitWall}, true
				}
			}
			return nil, false
		},
		Peers: func() []string {
			var out []string
			for _, sh := range n.links.All() {
				out = append(out, sh.Name())
			}
			return out
		},
		KnownPeer: n.settings.Known,
		Filters: func(peer string) (entry.Filter, *entry.Filter) {
			ls := n.settings.Of(peer)
			return ls.Current(), ls.FromPeer
		},
		Format:   n.machine.Format,
		Commit:   n.rep.CommitCommand,
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

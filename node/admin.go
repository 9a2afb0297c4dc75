package node

import (
	_ "embed"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/api"
)

// PeersReport reports outgoing links and what came in from each peer.
func (n *Node) PeersReport() api.PeersReport {
	hwms, err := n.store.HWMs()
	if err != nil {
		n.log.Warn("reading high-water marks", "err", err)
	}
	return api.PeersReport{Cluster: n.cluster, Links: n.PeerStatus(), Incoming: n.acceptor.Counts(), Refusals: n.acceptor.Refusals(),
		Streams: api.StreamReports(hwms), Members: n.gossip.Members(), Rejoin: n.rejoin.Report()}
}

// DigestReport hashes the live state: every key, or the keys under any of
// prefixes.
func (n *Node) DigestReport(prefixes ...string) (api.DigestReport, error) {
	d, err := n.keys.Digest(prefixes)
	if err != nil {
		return api.DigestReport{}, err
	}
	return api.DigestReport{Cluster: n.cluster, Digest: d.Hash, Keys: d.Keys, Tombstones: d.Tombstones, Counters: d.Counters,
		Prefixes: prefixes}, nil
}

// WALReport describes the outbound WAL.
func (n *Node) WALReport() api.WALReport {
	st := n.group.LogStats()
	first := n.out.First()
	r := api.WALReport{
		Stream: n.out.Stream().String(), First: first, Last: n.out.Last(), Applied: n.rep.StreamApplied(),
		Bytes: n.out.BytesAfter(first - 1), Segments: st.Segments, Repairs: st.Repairs, DroppedBytes: st.DroppedBytes,
		WriteFailures: st.WriteFailures, Writes: n.rep.Writes(), Groups: n.rep.Groups(),
		Saturation: n.Saturation(), Permits: n.acceptor.Permits(),
	}
	r.Peers = n.sat.Backlogs(n.PeerStatus())
	r.Refusals = map[string]uint64{
		acceptor.SourceOutboundBacklog: r.Saturation.Refusals,
		acceptor.SourceReplayPermit:    r.Permits.Refused,
	}
	return r
}

// OriginReport tells which cluster this node is and how it knows.
func (n *Node) OriginReport() api.OriginReport {
	r := api.OriginReport{Cluster: n.cluster, Resolver: n.resolver, Stream: n.out.Stream().String(), Version: n.opts.BuildVersion}
	if d := n.resp.Load(); d != nil {
		st := d.Stats()
		r.RESP = &api.RESPReport{Addr: d.Addr().String(), Connections: st.Connections(), Commands: st.Commands(), Errors: st.Errors()}
	}
	return r
}

package node

import (
	"fmt"
	"time"

	"github.com/replicator/replicator/transport"
)

// startGossip joins the memberlist cluster and starts shipping to the
// members of clusters whose secret is configured.
func (ms *membership) startGossip() error {
	n := ms.n
	g := n.opts.Gossip
	id := n.nodeID
	meta := transport.MemberMeta{V: transport.GossipVersion, Cluster: n.cluster, Stream: n.out.Stream().String(),
		API: g.APIURL, Replicate: g.ReplicateURL, Node: id}
	if n.multi() {
		meta.Raft, meta.Fresh, meta.Inc = n.group.Addr(), n.group.Fresh(), n.incarnation
	}
	if meta.API == "" {
		meta.API = n.URL()
	}
	if meta.Replicate == "" {
		meta.Replicate = n.PeerURL()
	}
	d, err := transport.StartDiscovery(transport.DiscoveryOptions{
		NodeName: n.cluster + "-" + id, Bind: g.Bind, Advertise: g.Advertise, Join: g.Join, Key: g.Key,
		Profile: g.Profile, Meta: meta, OnChange: ms.onMember, Logger: n.log.With("component", "gossip"),
	})
	if err != nil {
		return err
	}
	ms.gossip = d
	ms.gossipP.Store(d)
	n.bg.Add(1)
	go func() {
		// Exits once a seed answered, or at stop.
		defer n.bg.Done()
		d.JoinLoop(n.stop)
	}()
	n.log.Info("gossip started", "bind", g.Bind, "node", n.cluster+"-"+id, "seeds", g.Join)
	return nil
}

// note annotates a member, once gossip is set: memberlist delivers the
// first joins while StartDiscovery runs, before Start holds its result (a
// node crashed there on a nil Discovery); a member is noted again at its
// next change.
func (ms *membership) note(node string, shipped bool, note string) {
	if d := ms.gossipP.Load(); d != nil {
		d.SetNote(node, shipped, note)
	}
}

// onMember reacts to a member's join, update, departure or death.
func (ms *membership) onMember(m transport.Member) {
	n := ms.n
	c := m.Meta.Cluster
	if c == "" || c == n.cluster || m.Note != "" {
		return
	}
	var cfg *Peer
	for i := range n.opts.Peers {
		if n.opts.Peers[i].Name == c {
			cfg = &n.opts.Peers[i]
		}
	}
	if sh, err := n.repl.shipper(c); err == nil {
		sh.SetLiveness(m.State)
		if cfg != nil && cfg.URL != "" {
			ms.note(m.Node, true, "static --peer URL wins over gossip")
			return
		}
		if m.Meta.Replicate != "" && m.State == transport.LiveAlive {
			sh.SetURL(m.Meta.Replicate)
		}
		ms.note(m.Node, true, "")
		return
	}
	switch {
	case cfg == nil && !n.opts.InsecurePeers:
		ms.note(m.Node, false, fmt.Sprintf("no secret configured for cluster %s: shown, not shipped to", c))
		return
	case m.State != transport.LiveAlive || m.Meta.Replicate == "":
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
		ms.discoveredMu.Lock()
		ms.discovered[c] = p
		ms.discoveredMu.Unlock()
		if !n.lead.ready.Load() {
			ms.note(m.Node, false, "this node does not lead its cluster: the leader ships")
			return
		}
	}
	sh, err := n.repl.addLink(p)
	if err != nil {
		n.log.Error("gossip: cannot ship to a discovered peer", "cluster", c, "err", err)
		return
	}
	sh.SetLiveness(m.State)
	ms.note(m.Node, true, "")
	n.log.Info("gossip: shipping to a discovered peer", "cluster", c, "url", m.Meta.Replicate)
}

// Members lists the nodes known through gossip (nil without gossip).
func (n *Node) Members() []transport.Member {
	if n.mem.gossip == nil {
		return nil
	}
	return n.mem.gossip.Members()
}

func (ms *membership) stopGossip() error {
	if ms.gossip == nil {
		return nil
	}
	// A graceful leave tells the others this node left, rather than died.
	return ms.gossip.Leave(5 * time.Second)
}

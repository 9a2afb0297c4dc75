package node

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/replicator/replicator/internal/atomicfile"
	"github.com/replicator/replicator/transport"
)

// nodeID is this node's own name within its cluster, minted once and kept in
// the data directory (a cluster will have several nodes; gossip names them
// <cluster>-<node id>).
func nodeID(dir string) (string, error) {
	path := filepath.Join(dir, "NODE_ID")
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var b [4]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	return id, atomicfile.Write(path, []byte(id+"\n"))
}

// startGossip joins the memberlist cluster and starts shipping to the
// members of clusters whose secret is configured.
func (n *Node) startGossip() error {
	g := n.opts.Gossip
	id, err := nodeID(n.opts.DataDir)
	if err != nil {
		return fmt.Errorf("node: node id: %w", err)
	}
	meta := transport.MemberMeta{V: transport.GossipVersion, Cluster: n.cluster, Stream: n.out.Stream().String(),
		API: g.APIURL, Replicate: g.ReplicateURL}
	if meta.API == "" {
		meta.API = n.URL()
	}
	if meta.Replicate == "" {
		meta.Replicate = n.PeerURL()
	}
	d, err := transport.StartDiscovery(transport.DiscoveryOptions{
		NodeName: n.cluster + "-" + id, Bind: g.Bind, Advertise: g.Advertise, Join: g.Join, Key: g.Key,
		Profile: g.Profile, Meta: meta, OnChange: n.onMember, Logger: n.log.With("component", "gossip"),
	})
	if err != nil {
		return err
	}
	n.gossip = d
	n.bg.Add(1)
	go func() {
		// Exits once a seed answered, or at stop.
		defer n.bg.Done()
		d.JoinLoop(n.stop)
	}()
	n.log.Info("gossip started", "bind", g.Bind, "node", n.cluster+"-"+id, "seeds", g.Join)
	return nil
}

// onMember reacts to a member's join, update, departure or death.
func (n *Node) onMember(m transport.Member) {
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
	if sh, err := n.shipper(c); err == nil {
		sh.SetLiveness(m.State)
		if cfg != nil && cfg.URL != "" {
			n.gossip.SetNote(m.Node, true, "static --peer URL wins over gossip")
			return
		}
		if m.Meta.Replicate != "" && m.State == transport.LiveAlive {
			sh.SetURL(m.Meta.Replicate)
		}
		n.gossip.SetNote(m.Node, true, "")
		return
	}
	switch {
	case cfg == nil && !n.opts.InsecurePeers:
		n.gossip.SetNote(m.Node, false, fmt.Sprintf("no secret configured for cluster %s: shown, not shipped to", c))
		return
	case m.State != transport.LiveAlive || m.Meta.Replicate == "":
		return
	}
	p := Peer{Name: c, URL: m.Meta.Replicate}
	if cfg != nil {
		p.Secret, p.Overflow = cfg.Secret, cfg.Overflow
	} else {
		n.acceptor.SetPeer(c, "")
	}
	sh, err := n.addLink(p)
	if err != nil {
		n.log.Error("gossip: cannot ship to a discovered peer", "cluster", c, "err", err)
		return
	}
	sh.SetLiveness(m.State)
	n.gossip.SetNote(m.Node, true, "")
	n.log.Info("gossip: shipping to a discovered peer", "cluster", c, "url", m.Meta.Replicate)
}

// Members lists the nodes known through gossip (nil without gossip).
func (n *Node) Members() []transport.Member {
	if n.gossip == nil {
		return nil
	}
	return n.gossip.Members()
}

func (n *Node) stopGossip() error {
	if n.gossip == nil {
		return nil
	}
	// A graceful leave tells the others this node left, rather than died.
	return n.gossip.Leave(2 * time.Second)
}

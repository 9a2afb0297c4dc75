package node

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/internal/atomicfile"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/transport"
)

// The nodes of one cluster find each other by gossip: each gossips its
// node ID, raft address, API and replicate URLs, and whether it is fresh
// (no raft state, no data). The group (package cluster) reads them to
// bootstrap and to add members; the node reads them to forward to the
// leader, and tells peers every node's replicate URL.

// resolveNodeID returns this node's ID: the data directory's, minted at its
// first start (or the one asked for then). A directory keeps its ID: the
// raft configuration names the node by it.
// membership is what gossip tells the node: the nodes of its cluster (their
// URLs and incarnations, for raft's membership) and the peer clusters found.
type membership struct {
	n      *Node
	gossip *transport.Discovery
	// gossipP is gossip for goroutines that may run before Start set it
	// (the group\'s reconciliation).
	gossipP atomic.Pointer[transport.Discovery]
	// discovered are peers gossip found (a term links to them too).
	discoveredMu sync.Mutex
	discovered   map[string]Peer
}

func resolveNodeID(dir, want string) (string, error) {
	path := filepath.Join(dir, "NODE_ID")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		have := strings.TrimSpace(string(b))
		if want != "" && want != have {
			return "", fmt.Errorf("node: --node-id %s, but the data directory %s belongs to node %s: start it as %s (or omit --node-id), or give %s an empty data directory",
				want, dir, have, have, want)
		}
		return have, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("node: node id: %w", err)
	}
	id := want
	if id == "" {
		var r [4]byte
		rand.Read(r[:])
		id = hex.EncodeToString(r[:])
	}
	if err := atomicfile.Write(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("node: node id: %w", err)
	}
	return id, nil
}

// resolveIncarnation returns the data directory's incarnation, minted at
// its first start (origin.Incarnation): raft knows a node of several by its
// node ID and incarnation, so a wiped directory comes back as a new member.
// A directory that joined a group before incarnations keeps its bare node
// ID. A node of several whose directory was copied since its incarnation
// was recorded is refused (it would forget what it acknowledged since the
// copy); a node alone makes the directory its own (it has no voter to
// fool).
func (ms *membership) resolveIncarnation() (string, error) {
	n := ms.n
	dir := n.opts.DataDir
	hasRaft := cluster.HasState(n.cons.groupDir())
	_, err := os.Stat(filepath.Join(dir, origin.IncarnationFile))
	recorded := err == nil
	if n.multi() && !hasRaft && recorded {
		// Its raft state is gone (a partial wipe, identity files kept on
		// another volume): whatever it voted or acknowledged as its old
		// incarnation is forgotten, so it is a new one.
		inc, err := origin.NewIncarnation(dir)
		if err == nil {
			n.log.Warn("no raft state beside the incarnation record: this node comes back as a new incarnation", "incarnation", inc)
		}
		return inc, err
	}
	inc, err := origin.Incarnation(dir, hasRaft && !recorded)
	if err != nil {
		return "", err
	}
	switch {
	case !n.multi():
		err = origin.Refingerprint(dir)
	case hasRaft:
		err = origin.CheckNotCopied(dir)
	}
	return inc, err
}

// removedServer says why a raft server may not be a member ("" when it
// may), from what the log recorded.
func (ms *membership) removedServer(id raft.ServerID) string {
	n := ms.n
	node, inc := cluster.SplitServerID(id)
	why, err := n.machine.Removed(machine.RemovalKey(node, inc))
	switch {
	case err != nil:
		return "its removal record could not be read: " + err.Error()
	case why == 0:
		return ""
	}
	return cluster.Removal(why).String()
}

// raftCredentials says how the raft port is secured, or why it cannot be.
func (o *Options) raftCredentials() (string, error) {
	r := o.Raft
	switch {
	case o.TLSCert != "" && o.TLSClientCA != "":
		return "tls", nil
	case len(r.Key) > 0:
		if r.AcceptGossipKey && (o.Gossip == nil || len(o.Gossip.Key) == 0) {
			return "", errors.New("node: accepting the gossip key's credential on the raft port (--raft-accept-gossip-key) needs the gossip key (--gossip-key-file)")
		}
		return "raft-key", nil
	case o.Gossip != nil && len(o.Gossip.Key) > 0:
		return "gossip-key", nil
	case o.InsecurePeers:
		return "insecure", nil
	case raftconn.IsLoopback(r.Listen) && (r.Advertise == "" || raftconn.IsLoopback(r.Advertise)):
		if o.APIToken != "" || o.AdminToken != "" {
			// Any local process reaches a loopback port: with the API
			// closed to it by a token, raft must not be open to it (it
			// would join, read every write and depose the leader).
			return "", errors.New("node: the API needs a token, so the raft port needs credentials too: a loopback raft port without them " +
				"lets any local process without the token join the cluster and read every write; give mutual TLS (--tls-cert, --tls-key, " +
				"--tls-client-ca) or a gossip key (--gossip-key-file)")
		}
		return "loopback", nil
	}
	return "", errors.New("node: the raft port carries every write and needs credentials: mutual TLS (--tls-cert, --tls-key, --tls-client-ca), " +
		"or a gossip key (--gossip-key-file); without them it serves a loopback address only (every node on this machine), or --insecure-peers in tests")
}

// raftConn builds the raft port's credentials.
func (ms *membership) raftConn() (raftconn.Options, error) {
	n := ms.n
	kind, err := n.opts.raftCredentials()
	if err != nil {
		return raftconn.Options{}, err
	}
	var co raftconn.Options
	switch kind {
	case "tls":
		co.Certificate = func() (*tls.Certificate, error) { return n.tls.Live(), nil }
		co.CA = n.tls.ClientCA()
		co.ClusterOf = func(c *x509.Certificate) (string, error) { return ClusterFromCert(c, n.opts.PeerSANMode) }
	case "raft-key":
		co.RaftKey, co.AcceptGossipKey = n.opts.Raft.Key, n.opts.Raft.AcceptGossipKey
		if co.AcceptGossipKey {
			co.GossipKey = n.opts.Gossip.Key
			n.log.Warn("the raft port also takes the gossip key's credential (--raft-accept-gossip-key): any holder of the gossip key can join; drop the flag once every node has the raft key",
				"raft", n.opts.Raft.Listen)
		}
	case "gossip-key":
		co.GossipKey = n.opts.Gossip.Key
		n.log.Warn("the raft port's credential derives from the gossip key, which the clusters of a mesh may share (any holder can join this cluster): give the cluster a raft key of its own (--raft-key-file, docs/OPERATIONS.md)",
			"raft", n.opts.Raft.Listen)
	case "loopback":
		co.Loopback = true
		n.log.Warn("the raft port has no credentials and serves loopback only: any local process can reach it; give --gossip-key-file or mutual TLS outside tests",
			"raft", n.opts.Raft.Listen)
	case "insecure":
		co.Insecure = true
		n.log.Warn("the raft port is plain TCP (--insecure-peers): anyone who reaches it can join the cluster and append writes", "raft", n.opts.Raft.Listen)
	}
	if path := n.opts.Testing.RaftBlockFile; path != "" {
		co.Blocked = blockList(path)
	}
	co.MaxConns = n.opts.MaxConnections
	return co, nil
}

// blockList reads the test partition file (at most every 20 ms).
func blockList(path string) func(string) bool {
	var mu sync.Mutex
	var read time.Time
	var set map[string]bool
	return func(addr string) bool {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(read) > 20*time.Millisecond {
			read, set = time.Now(), map[string]bool{}
			if b, err := os.ReadFile(path); err == nil {
				for _, l := range strings.Fields(string(b)) {
					set[l] = true
				}
			}
		}
		return set[addr]
	}
}

// groupMembers is the group's view of gossip: the nodes of this cluster,
// this one included once the group is open (its own goroutine asks before
// Open has returned it).
type groupMembers struct {
	n *Node
	g atomic.Pointer[cluster.Group]
}

func (gm *groupMembers) Members() []cluster.Member {
	n := gm.n
	var out []cluster.Member
	if g := gm.g.Load(); g != nil {
		out = append(out, cluster.Member{ID: n.nodeID, Incarnation: n.incarnation, RaftAddr: g.Addr(), Alive: true, Fresh: g.Fresh()})
	}
	for _, m := range n.mem.sameCluster() {
		out = append(out, cluster.Member{ID: m.Meta.Node, Incarnation: m.Meta.Inc, RaftAddr: m.Meta.Raft, Alive: m.State == transport.LiveAlive,
			Fresh: m.Meta.Fresh})
	}
	return out
}

// sameCluster lists the gossip members of this node's cluster (not this
// node) that gossip a node ID.
func (ms *membership) sameCluster() []transport.Member {
	n := ms.n
	d := ms.gossipP.Load()
	if d == nil {
		return nil
	}
	var out []transport.Member
	for _, m := range d.Members() {
		if m.Meta.Cluster == n.cluster && m.Meta.Node != "" && m.Meta.Node != n.nodeID && m.Note == "" {
			out = append(out, m)
		}
	}
	return out
}

// member returns the gossip member of this cluster with node ID id.
func (ms *membership) member(id string) (transport.Member, bool) {
	for _, m := range ms.sameCluster() {
		if m.Meta.Node == id {
			return m, true
		}
	}
	return transport.Member{}, false
}

// refreshMeta keeps what this node gossips current (fresh turns false at
// bootstrap or at the first append; the stream changes when one is
// minted). It runs every 250 ms.
func (ms *membership) refreshMeta() {
	n := ms.n
	if ms.gossip == nil {
		return
	}
	meta := ms.gossip.Meta()
	want := meta
	want.Stream = n.out.Stream().String()
	if n.multi() {
		want.Fresh = n.group.Fresh()
	}
	if want != meta {
		if err := ms.gossip.SetMeta(want, time.Second); err != nil {
			n.log.Debug("gossip: updating this node's metadata", "err", err)
		}
	}
}

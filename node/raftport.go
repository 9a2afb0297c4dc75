package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/replicator/replicator/internal/raftconn"
)

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
func (n *Node) raftConn() (raftconn.Options, error) {
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

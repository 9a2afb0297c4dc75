package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"

	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/listener"
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

// raftConn builds the raft port's credentials from o, with the node's
// certificates.
func raftConn(o *Options, certs *listener.TLS, log *slog.Logger) (raftconn.Options, error) {
	kind, err := o.raftCredentials()
	if err != nil {
		return raftconn.Options{}, err
	}
	var co raftconn.Options
	switch kind {
	case "tls":
		co.Certificate = func() (*tls.Certificate, error) { return certs.Live(), nil }
		co.CA = certs.ClientCA()
		co.ClusterOf = func(c *x509.Certificate) (string, error) { return ClusterFromCert(c, o.PeerSANMode) }
	case "raft-key":
		co.RaftKey, co.AcceptGossipKey = o.Raft.Key, o.Raft.AcceptGossipKey
		if co.AcceptGossipKey {
			co.GossipKey = o.Gossip.Key
			log.Warn("the raft port also takes the gossip key's credential (--raft-accept-gossip-key): any holder of the gossip key can join; drop the flag once every node has the raft key",
				"raft", o.Raft.Listen)
		}
	case "gossip-key":
		co.GossipKey = o.Gossip.Key
		log.Warn("the raft port's credential derives from the gossip key, which the clusters of a mesh may share (any holder can join this cluster): give the cluster a raft key of its own (--raft-key-file, docs/OPERATIONS.md)",
			"raft", o.Raft.Listen)
	case "loopback":
		co.Loopback = true
		log.Warn("the raft port has no credentials and serves loopback only: any local process can reach it; give --gossip-key-file or mutual TLS outside tests",
			"raft", o.Raft.Listen)
	case "insecure":
		co.Insecure = true
		log.Warn("the raft port is plain TCP (--insecure-peers): anyone who reaches it can join the cluster and append writes", "raft", o.Raft.Listen)
	}
	if path := o.Testing.RaftBlockFile; path != "" {
		co.Blocked = raftconn.BlockList(path)
	}
	co.MaxConns = o.MaxConnections
	return co, nil
}

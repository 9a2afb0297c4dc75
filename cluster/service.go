package cluster

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftconn"
)

// Requests between the nodes of a cluster (issue 25, docs/SECURITY.md
// "Who may be a member"): a follower forwards to the leader, and a node
// asks the others their state, over the raft port, to the server raft's
// configuration names, at the address the configuration holds for it. The
// raft port's credential authenticates both ends: no API token crosses,
// and a gossip member that claims a member's node ID with addresses of its
// own never receives a request. What a member says of itself (its API and
// replication URLs) is asked the same way (Identify), and is what a node
// hands out in redirects, never what gossip reports.

// ErrNotMember: the server named is not in this node's configuration.
var ErrNotMember = errors.New("cluster: not a member of the configuration")

// ErrOlderBuild: the member runs a build that takes no requests on its
// raft port (a rolling upgrade is under way).
var ErrOlderBuild = raftconn.ErrOlderBuild

// ServiceListener returns the requests other nodes of the cluster send
// this one (each connection a *raftconn.ServiceConn naming its sender); nil
// for a node alone.
func (g *Group) ServiceListener() net.Listener {
	if g.layer == nil || g.opts.Number > 0 {
		return nil // the port's requests are group 0's to take
	}
	return g.layer.ServiceListener()
}

// Port is the raft port this group opened, for the cluster's groups after
// it (Options.Port); nil for a group of one and for a group Number >= 1.
func (g *Group) Port() *raftconn.Layer {
	if g.opts.Number > 0 {
		return nil
	}
	return g.layer
}

// address returns the raft address the latest configuration holds for id,
// or, for the leader, the one raft learned from it: a node just added knows
// its leader (its appends came over the raft port, with the cluster's
// credential) before its log holds a configuration naming it.
func (g *Group) address(id raft.ServerID) (string, error) {
	cf := g.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return "", err
	}
	for _, s := range cf.Configuration().Servers {
		if s.ID == id {
			return string(s.Address), nil
		}
	}
	if addr, lid := g.raft.LeaderWithID(); lid == id && addr != "" {
		return string(addr), nil
	}
	return "", fmt.Errorf("%w: %s", ErrNotMember, id)
}

// DialService connects to member id for a request, at the address the
// configuration holds for it.
func (g *Group) DialService(id raft.ServerID, timeout time.Duration) (net.Conn, error) {
	if g.layer == nil {
		return nil, fmt.Errorf("cluster: dial %s: this node is alone", id)
	}
	addr, err := g.address(id)
	if err != nil {
		return nil, err
	}
	return g.layer.DialService(string(id), addr, timeout)
}

// LeaderServer is the known leader's raft server ID ("" when none is known).
func (g *Group) LeaderServer() raft.ServerID {
	_, id := g.raft.LeaderWithID()
	return id
}

// describedTTL bounds how long what a member said of itself is kept: a
// member restarted with other URLs is asked again within it.
const describedTTL = 30 * time.Second

// described caches what members said of themselves, by server ID and
// address.
type described struct {
	mu sync.Mutex
	m  map[string]describedEntry
}

type describedEntry struct {
	desc string
	at   time.Time
}

// Describe returns what member id says of itself on its raft port (its
// Options.Describe), asking it at the address the configuration holds for
// it unless it was asked within describedTTL. An older build says nothing
// ("" and no error).
func (g *Group) Describe(id raft.ServerID, timeout time.Duration) (string, error) {
	if id == g.id {
		if g.opts.Describe == nil {
			return "", nil
		}
		return g.opts.Describe(), nil
	}
	if g.layer == nil {
		return "", fmt.Errorf("cluster: describe %s: this node is alone", id)
	}
	addr, err := g.address(id)
	if err != nil {
		return "", err
	}
	key := string(id) + "@" + addr
	g.desc.mu.Lock()
	e, ok := g.desc.m[key]
	g.desc.mu.Unlock()
	if ok && time.Since(e.at) < describedTTL {
		return e.desc, nil
	}
	who, err := g.layer.Identify(addr, timeout)
	if err != nil {
		return "", err
	}
	if who.ID != string(id) {
		return "", fmt.Errorf("%w: %s answers at %s, not %s", raftconn.ErrWrongIdentity, who.ID, addr, id)
	}
	g.desc.mu.Lock()
	if g.desc.m == nil || len(g.desc.m) > 1024 {
		g.desc.m = map[string]describedEntry{}
	}
	g.desc.m[key] = describedEntry{desc: who.Description, at: time.Now()}
	g.desc.mu.Unlock()
	return who.Description, nil
}

// DescribeAgain is Describe without the answer kept from the last
// describedTTL: for a decision that waits on a member's next build (the
// end of a rolling upgrade), which a restart at the same address brings.
func (g *Group) DescribeAgain(id raft.ServerID, timeout time.Duration) (string, error) {
	if addr, err := g.address(id); err == nil {
		g.desc.mu.Lock()
		delete(g.desc.m, string(id)+"@"+addr)
		g.desc.mu.Unlock()
	}
	return g.Describe(id, timeout)
}

// Described returns what member id said of itself when last asked, if it
// was within describedTTL, without asking (for paths that must not wait).
func (g *Group) Described(id raft.ServerID) (string, bool) {
	if id == g.id {
		d, err := g.Describe(id, 0)
		return d, err == nil
	}
	addr, err := g.address(id)
	if err != nil {
		return "", false
	}
	g.desc.mu.Lock()
	defer g.desc.mu.Unlock()
	e, ok := g.desc.m[string(id)+"@"+addr]
	if !ok || time.Since(e.at) >= describedTTL {
		return "", false
	}
	return e.desc, true
}

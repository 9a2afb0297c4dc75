package node

import (
	"fmt"
	"os"
	"syscall"

	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/node/respnode"
	"github.com/replicator/replicator/resp"
)

// The Redis-protocol front door (docs/RESP.md): package resp speaks the
// protocol; the node gives it its Go API (package respnode) and a listener with the
// HTTP API's TLS settings and token.

// newRESPNode is the node as package resp sees it (package respnode).
func newRESPNode(n *Node) *respnode.Node {
	r := &respnode.Node{Reads: n, Sub: n.sub, Follower: n.follower, Leads: n.rep.Ready, Version: n.opts.BuildVersion,
		Links: n.links, Groups: n.keys}
	if n.multi() {
		r.Servers = func() []cluster.Server { return n.group.Status().Servers }
	}
	return r
}

// openRESP listens on Options.RESPListen and serves it (nil, nil when it
// is not set). Its goroutine exits when close closes the listener.
func openRESP(n *Node) (*resp.Door, error) {
	if n.opts.RESPListen == "" && n.opts.RESPListener == nil {
		return nil, nil
	}
	// The RESP server bounds its connections itself (--max-connections):
	// at the bound it closes the oldest connection that has not
	// authenticated to make room, which a listener's bound could not (it
	// would hold new clients in the backlog behind them).
	ln, err := n.lis.ListenBounded(n.opts.RESPListener, n.opts.RESPListen, false, 0)
	if err != nil {
		return nil, fmt.Errorf("node: RESP: %w", err)
	}
	lim := resp.DefaultLimits()
	lim.MaxBulk = max(n.opts.MaxValueBytes, n.opts.MaxKeyBytes) + 4096
	o := resp.Options{Token: n.opts.APIToken, Limits: lim, Logger: n.log, Version: n.opts.BuildVersion, MaxConns: max(n.opts.MaxConnections, 0),
		Now: n.clock.Physical}
	if key := n.opts.Testing.RESPCrashKey; key != "" {
		o.Committed = func(k string) {
			if k == key {
				n.log.Warn("testing: killed between a RESP write's commit and its answer", "key", k)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	d := resp.Open(newRESPNode(n), o, ln)
	n.log.Info("serving RESP", "addr", ln.Addr().String())
	return d, nil
}

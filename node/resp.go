package node

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/replicator/replicator/resp"
)

// The Redis-protocol front door (docs/RESP.md): package resp speaks the
// protocol; the node gives it its Go API (respNode) and a listener with the
// HTTP API's TLS settings and token.

// respDoor is the RESP listener and its server, when --resp-listen is set.
type respDoor struct {
	srv  *resp.Server
	ln   net.Listener
	errc chan error
}

// respNode is the node as package resp sees it: the same reads and writes
// the HTTP surface calls, and a Submit that queues a connection's writes in
// order (submitter).
type respNode struct {
	*Node
	submitter
	// handler is the node's HTTP surface a follower forwards writes
	// through, built once (Node.Handler builds the routes anew).
	handler http.Handler
}

func newRESPNode(n *Node) respNode {
	return respNode{Node: n, submitter: submitter{n}, handler: n.Handler()}
}

// Figures are INFO's and DBSIZE's kept figures.
func (r respNode) Figures() resp.Figures {
	n := r.Node
	f := resp.Figures{Version: n.opts.BuildVersion, Keys: n.store.Live(), Role: "replica", Nodes: 1, Quorum: 1}
	if n.lead.ready.Load() || !n.multi() {
		f.Role = "master"
	}
	if n.multi() {
		servers, voters := n.group.Status().Servers, 0
		for _, sv := range servers {
			if sv.Voter {
				voters++
			}
		}
		f.Nodes, f.Quorum = len(servers), voters/2+1
	}
	for _, l := range n.PeerStatus() {
		f.Links = append(f.Links, resp.Link{Peer: l.Peer, State: l.State, Acked: l.Acked, Last: l.Last,
			Lag: time.Duration(l.OldestUnackedAge * float64(time.Second))})
	}
	return f
}

// Keys is the kept count of live plain keys (DBSIZE).
func (r respNode) Keys() int64 { return r.store.Live() }

// Acked is each peer link's acknowledged index of this cluster's stream
// (WAIT): the leader's links, or at a follower the cursors the leader
// records in the log (0 for a link with none in the current stream).
func (r respNode) Acked() []uint64 {
	n := r.Node
	var out []uint64
	if n.lead.ready.Load() || !n.multi() {
		for _, sh := range n.repl.links() {
			out = append(out, sh.Acked())
		}
		return out
	}
	stream := n.out.Stream()
	for _, p := range n.repl.linkPeers() {
		c, ok, err := n.store.Cursor(p.Name)
		if err != nil || !ok || c.Stream != stream {
			c.Index = 0
		}
		out = append(out, c.Index)
	}
	return out
}

// openRESP listens on Options.RESPListen and serves it (nil, nil when it
// is not set). Its goroutine exits when close closes the listener.
func openRESP(n *Node) (*respDoor, error) {
	if n.opts.RESPListen == "" && n.opts.RESPListener == nil {
		return nil, nil
	}
	ln, err := n.lis.listen(n.opts.RESPListener, n.opts.RESPListen, false)
	if err != nil {
		return nil, fmt.Errorf("node: RESP: %w", err)
	}
	lim := resp.DefaultLimits()
	lim.MaxBulk = max(n.opts.MaxValueBytes, n.opts.MaxKeyBytes) + 4096
	o := resp.Options{Token: n.opts.APIToken, Limits: lim, Logger: n.log, Version: n.opts.BuildVersion}
	if key := n.opts.Testing.RESPCrashKey; key != "" {
		o.Committed = func(k string) {
			if k == key {
				n.log.Warn("testing: killed between a RESP write's commit and its answer", "key", k)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	d := &respDoor{ln: ln, errc: make(chan error, 1), srv: resp.New(newRESPNode(n), o)}
	go func() { d.errc <- d.srv.Serve(ln) }()
	n.log.Info("serving RESP", "addr", ln.Addr().String())
	return d, nil
}

// close stops taking connections and closes those open, once their
// pending writes are answered (the committer must still run).
func (d *respDoor) close() error {
	if d == nil {
		return nil
	}
	err := d.ln.Close()
	d.srv.Close()
	if serr := <-d.errc; serr != nil {
		err = errors.Join(err, serr)
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// collect exports the front door's metrics (none while it is off).
func (d *respDoor) collect(ch chan<- prometheus.Metric) {
	if d != nil {
		d.srv.Stats().Collect(ch)
	}
}

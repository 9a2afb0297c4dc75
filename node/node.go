// Package node is the composition root: it builds the parts of the packages
// below from a Deps struct each (the replica of the cluster's raft group,
// the links to the peer clusters, the rejoin protocol, anti-entropy, the
// gossip view, forwarding over the raft port, the listeners), starts and
// stops them, and serves the Go API and the doors (package httpapi, package
// resp) on its listeners. No part holds the node; a leadership term is the
// replica's, which asks the node for the term's links. cmd/replicator and
// the e2e tests build on it, and an application can embed a node through
// Open.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/acceptor"
	"github.com/replicator/replicator/antientropy"
	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/datadir"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/groups"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/options"
	"github.com/replicator/replicator/links"
	"github.com/replicator/replicator/listener"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/membership"
	"github.com/replicator/replicator/node/httpapi"
	"github.com/replicator/replicator/origin"
	"github.com/replicator/replicator/rejoin"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/resp"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/transport"
)

// Node is one cluster node. Its methods are safe for concurrent use.
type Node struct {
	opts     Options
	log      *slog.Logger
	cluster  string
	resolver string

	clock *hlc.Clock
	store *store.Store
	// members are the group's members as gossip sees them (a cluster of
	// several).
	members *membership.GroupMembers
	// rep is this node's replica of its cluster's raft group (package
	// replica): the machine, the stream, the group and the committer below
	// are its, set once it opened.
	rep     *replica.Replica
	machine *machine.Machine
	out     *machine.Outbound // the stream, as shippers read it
	group   *cluster.Group
	com     *replica.Committer
	sub     *replica.Submitter // admission and queueing to com

	// nodeID names this node within its cluster, incarnation its data
	// directory's life (raft knows the node by both: origin.Incarnation).
	nodeID      string
	incarnation string
	// fwd forwards what needs the leader to it (forward.go); svc talks
	// to the other nodes over the raft port (service.go).
	fwd *forward.Router
	svc *forward.Service
	// follower proposes the writes a follower takes in process to the
	// leader (propose.go; nil for a node alone).
	follower *forward.Follower
	// keys routes a key to its raft group (groups.go): group 0 alone, or
	// the groups after it too (Options.Groups); writes routes a write to
	// its group's leader; keeper keeps the groups in line with the
	// cluster's.
	keys   *groups.Router
	writes *writes
	keeper *groups.Keeper

	acceptor   *acceptor.Acceptor
	peerClient *http.Client
	links      *links.Set           // the links to peer clusters
	settings   *links.Settings      // the links' settings through the log
	dead       *links.DeadLetters   // what peers sent that this node set aside
	conflicts  *machine.ConflictLog // the conflict log's reads and restores
	ae         *antientropy.Runner  // comparisons and repairs with peers
	tls        *listener.TLS
	gossip     *membership.Gossip // the nodes of this cluster and the peers found
	report     *membership.Report // the cluster report

	metrics nodeMetrics
	inbound *acceptor.Metrics // the inbound lag and apply times
	sat     *links.Saturation
	rejoin  *rejoin.Rejoiner

	// fatal is closed when the node must stop for a reason a restart does
	// not fix (fatalErr says which): serve exits with it.
	fatal     chan struct{}
	fatalOnce sync.Once
	fatalErr  atomic.Pointer[error]

	// lifecycle
	closing  atomic.Bool
	stop     chan struct{}
	bg       sync.WaitGroup // background loops; exit when stop is closed
	srv      *http.Server
	resp     atomic.Pointer[resp.Door] // the RESP listener (nil: none)
	ln       net.Listener
	serveErr chan error

	peerSrv      *http.Server
	peerLn       net.Listener
	peerServeErr chan error
	pprofSrv     *http.Server
	pprofErr     chan error
	bounds       *replica.Bounds // what a write may be
	lis          *listener.Set   // the API's and the peer endpoint's
	closeMu      sync.Mutex
	closed       bool
}

// Open resolves and pins the cluster identity, opens the store and the WAL,
// re-applies WAL entries the store has not applied, and starts the write
// path. It does not listen; call Start for that.
func Open(ctx context.Context, opts *Options) (*Node, error) {
	o, err := options.Resolve(opts)
	if err != nil {
		return nil, err
	}
	r := o.resolver()
	cluster, err := origin.Resolve(ctx, r)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("node: data directory: %w", err)
	}
	// Checked now, written once the listeners are bound (Start): a start
	// that fails claims no directory for its (perhaps mistyped) cluster ID.
	prev, err := origin.CheckPin(o.DataDir, cluster, o.ReassignOrigin)
	if err != nil {
		return nil, err
	}
	log := o.Logger.With("cluster", cluster)
	if o.ReassignOrigin && prev != "" && prev != cluster {
		log.Warn("data directory reassigned to another cluster", "previous", prev, "now", cluster, "dir", o.DataDir)
	}
	n := &Node{
		opts:     o,
		log:      log,
		cluster:  cluster,
		resolver: r.String(),
		clock:    hlc.NewClock(o.Clock, o.MaxClockOffset),
		stop:     make(chan struct{}),
		fatal:    make(chan struct{}),
		inbound:  acceptor.NewMetrics(),
	}
	n.sat = links.NewSaturation(links.SaturationDeps{
		Marks: o.WaterMarks, Wait: o.AdmissionWait, Peers: o.Peers, Logger: log,
		Links:  func() []*transport.Shipper { return n.links.All() },
		Oldest: func(i uint64) (int64, bool) { return n.links.OldestCommitWall(i) },
	})
	n.store, err = datadir.OpenStore(o.DataDir, storeOptions(&o, log))
	if err != nil {
		return nil, err
	}
	if err := n.pinIfHolding(); err != nil {
		n.store.Close()
		return nil, err
	}
	n.bounds = &replica.Bounds{MaxKeyBytes: o.MaxKeyBytes, MaxValueBytes: o.MaxValueBytes, MaxReplicateBytes: o.MaxReplicateBytes,
		PinWindow: o.PinWindow, Clock: n.clock, Peers: func() []replica.PeerLimits {
			links := n.links.All()
			out := make([]replica.PeerLimits, len(links))
			for i, sh := range links {
				out[i] = replica.PeerLimits{Peer: sh.Name(), Limits: sh.Limits()}
			}
			return out
		}}
	n.tls, err = listener.NewTLS(listener.TLSOptions{Cert: o.TLSCert, Key: o.TLSKey, ClientCA: o.TLSClientCA, PeerCA: o.PeerCA, SANMode: o.PeerSANMode},
		n.cluster, n.log, func() {
			if n.peerClient != nil {
				n.peerClient.CloseIdleConnections()
			}
		})
	if err != nil {
		n.store.Close()
		return nil, err
	}
	n.lis = listener.NewSet(listener.Limits{MaxConnections: o.MaxConnections, MinBodyRate: o.MinBodyRate, BodyGrace: o.BodyGrace}, n.tls, n.log)
	if hw, err := n.store.HLCHighWater(); err == nil {
		n.clock.Observe(hw) // above every stamp the store recorded
	} else {
		n.store.Close()
		return nil, err
	}
	if n.nodeID, err = membership.ResolveNodeID(o.DataDir, o.NodeID); err != nil {
		n.store.Close()
		return nil, err
	}
	if n.multi() {
		n.incarnation, err = membership.MemberIncarnation(o.DataDir, replica.HasState(o.DataDir), n.log)
	} else {
		n.incarnation, err = membership.AloneIncarnation(o.DataDir, replica.HasState(o.DataDir))
	}
	if err != nil {
		n.store.Close()
		return nil, err
	}
	n.log = n.log.With("node", n.nodeID)
	n.gossip = membership.New(membership.Deps{Cluster: n.cluster, NodeID: n.nodeID, Logger: n.log, OnPeer: func(m api.Member) { n.links.OnPeer(m) }})
	rd, err := n.replicaDeps()
	if err != nil {
		n.store.Close()
		return nil, err
	}
	n.rep = replica.New(rd)
	n.com = n.rep.Committer()
	configured := make([]links.Configured, len(o.Peers))
	for i := range o.Peers {
		configured[i] = links.Configured{Name: o.Peers[i].Name, Filter: o.Peers[i].Filter(), Bandwidth: o.Peers[i].Bandwidth, Compression: o.Peers[i].Compression}
	}
	n.settings = links.NewSettings(links.SettingsDeps{
		Configured: configured,
		Machine:    n.rep.Machine,
		Stream:     func() entry.StreamID { return n.rep.Stream().Stream() },
		Apply:      n.rep.ApplyCommand, Commit: n.rep.CommitCommand,
		Leading:          func() bool { return n.group != nil && n.group.IsLeader() && n.rep.Ready() },
		Status:           n.PeerStatus,
		Kept:             func(peer string) *api.KeptTombstones { return n.links.Kept(peer) },
		KeptForPeerLinks: func(peer string) *api.KeptTombstones { return n.links.KeptForPeerLinks(peer) },
		SecretsKey:       o.SecretsKey, Logger: n.log,
	})
	n.links = n.newLinks()
	configuredNames := make([]string, len(o.Peers))
	for i := range o.Peers {
		configuredNames[i] = o.Peers[i].Name
	}
	n.rejoin = rejoin.New(rejoin.Deps{
		Cluster: n.cluster, Store: n.store, Clock: n.clock, Logger: n.log,
		Configured: configuredNames, InsecurePeers: o.InsecurePeers, IdentityCheckWait: o.IdentityCheckWait,
		Stream: func() entry.StreamID { return n.rep.Stream().Stream() },
		Epoch:  func() uint32 { return n.rep.Machine().Epoch() },
		Links: func() []rejoin.Link {
			links := n.links.All()
			out := make([]rejoin.Link, len(links))
			for i, sh := range links {
				out[i] = sh
			}
			return out
		},
		Link: func(peer string) (rejoin.Link, bool) {
			sh, err := n.links.Get(peer)
			return sh, err == nil
		},
		Apply: n.rep.ApplyCommand, UpdateRecord: n.rep.UpdateRecord,
		Exclusive: func(f func()) { n.com.Exclusive(f) },
		Failed:    func() error { return n.com.Failed() },
		Closing:   n.closing.Load,
	})
	n.sub = &replica.Submitter{Bounds: n.bounds, Com: n.com, Format: func() int { return n.rep.Machine().Format() },
		// The node open and in its cluster, its term begun, its stream's
		// identity confirmed, and not saturated.
		Admit: func(ctx context.Context) error { return n.admit(ctx, n.rep.AwaitTerm) }}
	n.svc = forward.NewService(o.APIToken != "" || o.AdminToken != "", n.gossip.Member)
	_, err = n.rep.Open()
	if err != nil {
		n.com.Close()
		n.store.Close()
		return nil, err
	}
	n.machine, n.out, n.group = n.rep.Machine(), n.rep.Stream(), n.rep.Group()
	if n.members != nil {
		n.members.Attach(n.group)
	}
	n.report = membership.NewReport(membership.ReportDeps{
		Cluster: n.cluster, NodeID: n.nodeID, Incarnation: n.incarnation, Mode: map[bool]string{false: "single", true: "raft"}[n.multi()],
		Group: n.group, Gossip: n.gossip, Service: n.svc,
		Applied: n.rep.Applied, Format: n.machine.Format, Ready: n.rep.Ready, URL: n.URL, Removed: n.rep.RemovedServer, RemovedAll: n.rep.RemovedRecords,
		Stream: func() string { return n.out.Stream().String() }, Groups: func() []api.GroupReport { return n.keeper.Report() },
	})
	n.svc.Attach(n.group)
	n.fwd = &forward.Router{NodeID: n.nodeID, Group: n.group, Lead: n.rep, Progress: n.rep, Service: n.svc,
		Member: n.gossip.Member, NeedsLeader: needsLeader, WriteErr: httpapi.WriteErr,
		Counted: func(how string) { n.metrics.forwards.WithLabelValues(how).Inc() },
		LegacyClient: &http.Client{CheckRedirect: forward.NoRedirects, Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
			TLSClientConfig: n.tls.Client()}},
		Removed: n.rep.Removed}
	if o.Raft != nil {
		n.fwd.ElectionTimeout = o.Raft.ElectionTimeout
	}
	n.setupReplication()
	n.follower = n.newFollower()
	if err := n.openGroups(rd); err != nil {
		n.com.Close()
		n.com.Exclusive(func() { n.group.Close(); n.store.Close() })
		return nil, err
	}
	n.dead = links.NewDeadLetters(n.store, n.rep.CommitCommand, n.log)
	n.conflicts = &machine.ConflictLog{Store: n.store, Format: n.machine.Format, Propose: n.Propose}
	n.metrics.init(n)
	return n, nil
}

// pinIfHolding pins the data directory to this cluster once it holds data
// (an embedded node that writes without serving, or a directory that held
// data before its pin could be written).
func (n *Node) pinIfHolding() error {
	empty, err := n.store.Empty()
	if err != nil || empty {
		return err
	}
	_, err = origin.Pin(n.opts.DataDir, n.cluster, n.opts.ReassignOrigin)
	return err
}

// Start listens on Options.Listen (and PeerListen) and serves the HTTP API,
// starts the background loops, and joins gossip. It returns once the
// listeners are bound.
func (n *Node) Start() error {
	ln, err := n.lis.Listen(n.opts.Listener, n.opts.Listen, false)
	if err != nil {
		return err
	}
	n.ln = ln
	if n.opts.PeerListen != "" || n.opts.PeerListener != nil {
		pln, err := n.lis.Listen(n.opts.PeerListener, n.opts.PeerListen, true)
		if err != nil {
			ln.Close()
			return err
		}
		n.peerLn = pln
	}
	if _, err := origin.Pin(n.opts.DataDir, n.cluster, n.opts.ReassignOrigin); err != nil {
		ln.Close()
		if n.peerLn != nil {
			n.peerLn.Close()
		}
		return err
	}
	if n.opts.APIToken != "" && n.opts.AdminToken == "" {
		n.log.Warn("the admin endpoints (membership, peers, detach) accept the API token: every client that may write may also join and remove nodes; give them a token of their own with --admin-token-file (docs/OPERATIONS.md)")
	}
	refused := func(code string) { n.metrics.apiRefused.WithLabelValues(code).Inc() }
	h, mux := n.handler()
	tokens := listener.Tokens{API: n.opts.APIToken, Admin: n.opts.AdminToken}
	n.srv = n.lis.Serve(ln, listener.Protect(tokens, listener.RequireToken(tokens, httpapi.NeedScope(mux, refused), h, refused), ln, refused), &n.serveErr)
	if n.opts.PprofListen != "" {
		pln, err := net.Listen("tcp", n.opts.PprofListen)
		if err != nil {
			return fmt.Errorf("node: listen %s (pprof): %w", n.opts.PprofListen, err)
		}
		n.pprofSrv = n.lis.Serve(pln, httpapi.PprofHandler(), &n.pprofErr)
	}
	if n.peerLn != nil {
		n.peerSrv = n.lis.Serve(n.peerLn, surface(n).PeerHandler(n.acceptor), &n.peerServeErr)
	}
	d, err := openRESP(n)
	if err != nil {
		return err
	}
	n.resp.Store(d)
	if n.multi() {
		d := forward.Described{API: n.URL(), Replicate: n.PeerURL(), Commands: n.rep.ReadsFormat()}
		if g := n.opts.Gossip; g != nil {
			// As others reach this node.
			d.API, d.Replicate = cmp.Or(g.APIURL, d.API), cmp.Or(g.ReplicateURL, d.Replicate)
		}
		n.svc.SetDescription(d)
		n.svc.Serve(n.lis, n.servesProposals(forward.EnforceScope(httpapi.NeedScope(mux, refused), h, refused), refused))
		n.every(time.Second, n.svc.RefreshProven)
	}
	n.every(500*time.Millisecond, n.settings.Seed)
	if n.opts.AntiEntropyInterval > 0 {
		n.every(n.opts.AntiEntropyInterval, func() { n.ae.Pass(n.stop) })
		n.every(n.opts.AntiEntropyInterval, n.ae.Check)
	}
	// Re-evaluated while no writes arrive too, so that it can clear, detach
	// links and feed the backlog gauges.
	n.every(100*time.Millisecond, func() { n.sat.Evaluate(true) })
	n.links.Start()
	n.rep.Run()
	if set := n.keys.Set; set != nil {
		set.Run()
		n.keeper.Record() // a node alone leads at once
		n.every(2*time.Second, n.keeper.Spread)
	}
	n.every(500*time.Millisecond, n.keeper.Record)
	if n.tls.On() { // after the peer client exists: a reload closes its idle links
		n.every(n.opts.TLSReloadInterval, n.tls.ReloadIfChanged)
	}
	if n.opts.Gossip != nil {
		g := n.opts.Gossip
		meta := api.MemberMeta{Stream: n.out.Stream().String(), API: cmp.Or(g.APIURL, n.URL()), Replicate: cmp.Or(g.ReplicateURL, n.PeerURL())}
		if n.multi() {
			meta.Raft, meta.Fresh, meta.Inc = n.group.Addr(), n.group.Fresh(), n.incarnation
		}
		if err := n.gossip.Start(membership.StartOptions{Bind: g.Bind, Advertise: g.Advertise, Join: g.Join, Key: g.Key, Profile: g.Profile, Meta: meta},
			n.stop, &n.bg); err != nil {
			return err
		}
		// What this node gossips stays current: fresh turns false at
		// bootstrap or at the first append; the stream changes when one
		// is minted.
		refresh := func() {
			n.gossip.Refresh(func(m *api.MemberMeta) {
				m.Stream = n.out.Stream().String()
				if n.multi() {
					m.Fresh = n.group.Fresh()
				}
			})
		}
		refresh()
		n.every(250*time.Millisecond, refresh)
	}
	if n.multi() {
		n.log.Info("serving", "addr", ln.Addr().String(), "peer_addr", n.PeerURL(), "raft", n.group.Addr(), "stream", n.out.Stream().String())
		return nil
	}
	n.log.Info("serving", "addr", ln.Addr().String(), "peer_addr", n.PeerURL(), "stream", n.out.Stream().String())
	return nil
}

// Addr is the bound API address (after Start).
func (n *Node) Addr() string {
	if n.ln == nil {
		return ""
	}
	return n.ln.Addr().String()
}

// URL is the API's base URL (after Start).
func (n *Node) URL() string { return n.tls.Scheme() + n.Addr() }

// PeerURL is the base URL peers replicate to (after Start): the peer
// listener's, or the API's.
func (n *Node) PeerURL() string {
	if n.peerLn != nil {
		return n.tls.Scheme() + n.peerLn.Addr().String()
	}
	return n.URL()
}

// ClusterID is the resolved cluster ID.
func (n *Node) ClusterID() string { return n.cluster }

// Close shuts down gracefully: stop accepting requests, let in-flight ones
// and their commits finish, stop background loops, close the WAL and store.
func (n *Node) Close() error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	n.closing.Store(true)
	var errs []error
	if err := n.gossip.Stop(); err != nil {
		n.log.Warn("leaving gossip", "err", err)
	}
	if n.srv != nil {
		errs = append(errs, n.lis.Shutdown(listener.Served{Srv: n.srv, Errc: n.serveErr}, listener.Served{Srv: n.peerSrv, Errc: n.peerServeErr},
			listener.Served{Srv: n.pprofSrv, Errc: n.pprofErr}, listener.Served{Srv: n.svc.Srv, Errc: n.svc.Errc})...)
	}
	if err := n.resp.Load().Shutdown(); err != nil {
		errs = append(errs, err)
	}
	if n.rep.Ready() && len(n.group.Status().Servers) > 1 {
		// Another node leads before this one goes: the cluster does not
		// wait an election timeout for it (a rolling restart).
		if err := n.group.TransferLeadership(); err != nil {
			n.log.Warn("handing leadership over before stopping", "err", err)
		}
	}
	close(n.stop)
	n.bg.Wait()
	if set := n.keys.Set; set != nil {
		errs = append(errs, set.Close()) // before group 0, which holds their raft port
	}
	n.rep.Stop()   // the lead loop ends the term, and the term its links
	n.links.Stop() // their loops
	n.com.Close()
	// A stream being sealed finishes first (and a later one sees closing).
	n.com.Exclusive(func() { errs = append(errs, n.pinIfHolding(), n.group.Close(), n.store.Close()) })
	return errors.Join(errs...)
}

// every runs f every d in a background goroutine, which exits when stop is
// closed (Close waits for it).
func (n *Node) every(d time.Duration, f func()) {
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-n.stop:
				return
			case <-t.C:
				f()
			}
		}
	}()
}

// CollectTombstones removes the tombstones no write can resurrect any more
// (links.Set.TombstoneCutoff), and the idempotency and conflict records
// expired, and reports how many tombstones went.
func (n *Node) CollectTombstones() (int, error) {
	total, err := n.links.CollectTombstones()
	if set := n.keys.Set; set != nil && err == nil {
		more, err := set.Collect() // the groups after 0 this node leads
		return total + more, err
	}
	return total, err
}

// Put durably writes value at key and returns once it is fsynced and
// applied.
func (n *Node) Put(ctx context.Context, key string, value []byte) (api.WriteResult, error) {
	return n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: value}})
}

// Delete durably deletes key (a tombstone, kept for the retention window).
func (n *Node) Delete(ctx context.Context, key string) (api.WriteResult, error) {
	return n.Propose(ctx, api.Write{Entry: entry.Entry{Op: entry.OpDelete, Key: key}})
}

// Get returns the live record at key, or ErrNotFound (absent or deleted).
func (n *Node) Get(key string) (store.Record, error) { return n.keys.Get(key) }

// Scan returns a page of live keys in order.
func (n *Node) Scan(o store.ScanOptions) ([]store.Item, string, error) { return n.keys.Scan(o) }

// Digest hashes the live state.
func (n *Node) Digest() (store.Digest, error) { return n.keys.Digest(nil) }

// Ready reports whether the node takes writes, and why not.
func (n *Node) Ready() error {
	if n.closing.Load() {
		return api.ErrClosed
	}
	if err := n.FatalErr(); err != nil {
		return err
	}
	if err := n.rep.Removed(); err != nil {
		return err
	}
	if err := n.com.Failed(); err != nil {
		return err
	}
	if err := n.rep.Readable(); err != nil {
		return err
	}
	if n.multi() {
		if id, _ := n.group.Leader(); id == "" {
			return fmt.Errorf("%w: this node knows no leader of its cluster (an election, or a majority down)", api.ErrNotWritten)
		}
	}
	if r := n.Saturation(); r.State == api.StateSaturated {
		return fmt.Errorf("%w: %s (peer %s)", api.ErrSaturated, r.Cause, r.Peer)
	}
	return nil
}

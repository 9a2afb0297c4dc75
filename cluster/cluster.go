// Package cluster is one cluster's raft group (issue 15, docs/CLUSTER.md):
// it forms the group from the nodes gossip finds, keeps its membership, and
// applies commands through a state machine it is given. What the commands
// mean is the state machine's business; this package decides only who
// leads, who belongs, and that a command is committed on a quorum before it
// is applied.
//
// The raft log and stable state live in package wal (tidwall/wal, fsynced); the
// raft port is raftconn (TLS both ways, the cluster checked at each end).
package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/options"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/wal"
)

// Errors. The classes a door maps are the contract's words (package api).
var (
	ErrNotLeader   = api.ErrNotLeader
	ErrQuorum      = api.ErrQuorum
	ErrUnknownNode = api.ErrUnknownNode
	ErrRemoved     = api.ErrNodeIDRemoved
	// ErrNotAlone refuses to start a node of several as a node alone.
	ErrNotAlone = errors.New("cluster: the node belongs to a cluster of several")
)

// NotLeaderError says who leads (api.NotLeaderError).
type NotLeaderError = api.NotLeaderError

// Member is a node of this cluster as gossip reports it.
type Member struct {
	// ID is the node ID; Incarnation its data directory's (docs/CLUSTER.md
	// "A node's identity"): raft knows it as ServerID(ID, Incarnation).
	ID          string
	Incarnation string
	RaftAddr    string
	Alive       bool
	// Fresh: the node holds no raft state and no data, so it may take part
	// in bootstrapping a new group.
	Fresh bool
}

// Membership is what the group needs from gossip: the nodes of its own
// cluster it currently knows of (itself included).
type Membership interface {
	Members() []Member
}

// Options configures a Group. Zero fields take defaults.
type Options struct {
	Cluster, Node string
	// Incarnation is this node's data directory's: raft knows the node as
	// ServerID(Node, Incarnation), so a node whose directory was wiped or
	// put back from a copy is a new member (empty: a directory that joined
	// a group before incarnations, known by its bare node ID).
	Incarnation string
	// Dir holds the raft log, stable state and snapshots.
	Dir string
	// Solo: the group is this node alone (a cluster of one node, as every
	// cluster was before issue 15). It needs no raft port (raft talks to
	// itself in memory) and bootstraps itself at its first start whatever
	// it holds: that is how a single node's data directory becomes a group
	// of one. Listen, Members and BootstrapExpect are not used.
	Solo bool
	// BootstrapAlone: a node without raft state bootstraps a group of
	// itself at once, on its raft port (a single node's data directory of
	// a build before the log, upgraded with the raft port given: it grows
	// as the others join). Solo groups always do.
	BootstrapAlone bool
	// Listen is the raft port; Advertise the address the others dial
	// (default: the bound address).
	Listen, Advertise string
	// Conn carries the raft port's credentials (Cluster and Node are
	// filled from above).
	Conn raftconn.Options
	// Number is the group's number among the cluster's raft groups (issue
	// 51, docs/CLUSTER.md "Several raft groups per cluster"): 0 for the
	// group that holds what is the cluster's, and the only one of a cluster
	// of one group.
	Number int
	// Port is, for a group Number >= 1, the raft port group 0 opened
	// (Group.Port): the group's connections share it, with group 0's
	// credentials and refusals, every group's members being group 0's.
	// Listen, Advertise and Conn are group 0's business then. Nil for
	// group 0, which opens the port.
	Port *raftconn.Layer
	// MemberApplied is how the leader of a group Number >= 1 learns the
	// last index a learner's state machine applied in this group, before
	// it lets the learner vote (the raft port says group 0's): required
	// for such a group of several nodes.
	MemberApplied func(id raft.ServerID, addr string) (uint64, error)
	// FormWith, for a group Number >= 1, returns the servers to form the
	// group with (nil: not now): group 0's configuration, once the caller
	// knows that none of them holds this group's state (a group formed once
	// is never formed again: gossip's freshness is group 0's). The lowest
	// ID of them bootstraps the group; the others learn of it from its
	// leader's first append. BootstrapExpect is not used then.
	FormWith func() []raft.Server
	// BootstrapExpect is how many fresh nodes form a new group (0: never
	// bootstrap; the node waits to be added).
	BootstrapExpect int
	// HasData reports that this node holds data: such a node never
	// bootstraps a new group (its data would fork from its old one).
	HasData func() bool
	// FSM applies committed commands.
	FSM raft.FSM
	// Removed says why a raft server (node ID and incarnation) may not be a
	// member ("" when it may): its node ID was removed by an operator, or
	// this incarnation was replaced or lost in a recovery. The leader never
	// adds it back, however alive gossip says it is, and the raft port
	// tells it why it is refused. Default: none is.
	Removed func(id raft.ServerID) string
	// RecordRemoved records, through the log, that a server is out for good
	// (an incarnation replaced by a newer one), before the leader takes it
	// out of the configuration. Default: nothing is recorded.
	RecordRemoved func(id raft.ServerID, why Removal) error
	// Applied reports the last log index the state machine applied (the
	// raft port tells a leader that asks, to judge a new member's
	// catch-up). Default: raft's applied index.
	Applied func() uint64
	// Describe, when set, is what this node says of itself to the nodes
	// that ask (its API and replication URLs): they trust it because it
	// crossed the raft port (service.go).
	Describe func() string
	// Admit, when set, decides whether a node may join, from what it says
	// of itself on its raft port (its Identify description; empty from a
	// build that describes nothing): the leader adds a member only when it
	// returns nil (a node that cannot read the log's commands, say). The
	// admission holds until the group calls release, once the node is in
	// the configuration or adding it failed, so that a decision of the
	// caller's that depends on who the members are (raising the log's
	// format, node/group.go) can wait for admissions in flight.
	Admit func(description string) (release func(), err error)
	// OnRefused is called when another node refuses this one (it was
	// removed, replaced, or lost in a recovery): the node must stop. Open
	// refuses to start such a node when a member says so at once.
	OnRefused func(by, why string)
	// Members is gossip's view of this cluster.
	Members Membership
	// Reconcile is how often bootstrap and membership are checked
	// (default 250ms).
	Reconcile time.Duration
	// Timing of raft (defaults: hashicorp/raft's, tuned for LAN; a solo
	// group's are 20ms, the time it waits before electing itself).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// Log configures the raft log (Logger is filled from below).
	Log wal.Options
	// Snapshots: raft snapshots the state machine when SnapshotThreshold
	// commands were applied since the last one (checked every
	// SnapshotInterval), then drops the log before it but the last
	// TrailingLogs commands. The state machine holds its state in the tree,
	// so a snapshot is cheap and the log only has to cover what followers
	// have not appended yet. Defaults: hashicorp/raft's; a solo group's
	// 1024, 10s and 128 (nobody follows it).
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	Logger            *slog.Logger
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.Reconcile == 0 {
		o.Reconcile = 250 * time.Millisecond
	}
	d := raft.DefaultConfig()
	if o.Solo {
		// Nobody to hear from: the timeouts are only how long a node
		// alone waits before it elects itself, at start and after a
		// failed append made it step down.
		d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
		if o.Members == nil {
			o.Members = soloMembers{}
		}
		d.SnapshotThreshold, d.SnapshotInterval, d.TrailingLogs = 1024, 10*time.Second, 128
	}
	if o.SnapshotThreshold == 0 {
		o.SnapshotThreshold = d.SnapshotThreshold
	}
	if o.SnapshotInterval == 0 {
		o.SnapshotInterval = d.SnapshotInterval
	}
	if o.TrailingLogs == 0 {
		o.TrailingLogs = d.TrailingLogs
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = d.HeartbeatTimeout
	}
	if o.ElectionTimeout == 0 {
		o.ElectionTimeout = d.ElectionTimeout
	}
	if o.LeaderLeaseTimeout == 0 {
		o.LeaderLeaseTimeout = min(d.LeaderLeaseTimeout, o.HeartbeatTimeout)
	}
	if o.HasData == nil {
		o.HasData = func() bool { return false }
	}
	if o.Removed == nil {
		o.Removed = func(raft.ServerID) string { return "" }
	}
	if o.RecordRemoved == nil {
		o.RecordRemoved = func(raft.ServerID, Removal) error { return nil }
	}

	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every problem at once.
func (o *Options) Validate() error {
	var errs []error
	add := func(f string, a ...any) { errs = append(errs, fmt.Errorf("cluster: "+f, a...)) }
	if o.Cluster == "" {
		add("Cluster is required")
	}
	if o.Node == "" {
		add("Node is required (--node-id)")
	}
	if o.Dir == "" {
		add("Dir is required")
	}
	if o.Listen == "" && !o.Solo && o.Number == 0 {
		add("Listen is required (--raft-listen)")
	}
	switch {
	case o.Number < 0 || o.Number > raftconn.MaxGroup:
		add("group number %d out of range (0 to %d)", o.Number, raftconn.MaxGroup)
	case o.Number == 0 && o.Port != nil:
		add("group 0 opens the raft port: Port is for the groups after it")
	case o.Number > 0 && !o.Solo && o.Port == nil:
		add("group %d needs group 0's raft port (Port)", o.Number)
	case o.Number > 0 && !o.Solo && o.MemberApplied == nil:
		add("group %d needs MemberApplied (the raft port tells group 0's applied index)", o.Number)
	}
	if o.FSM == nil {
		add("FSM is required")
	}
	if o.Members == nil {
		add("Members is required")
	}
	if o.BootstrapExpect < 0 {
		add("BootstrapExpect %d is negative", o.BootstrapExpect)
	}
	if strings.ContainsAny(o.Node, ".@") || strings.ContainsAny(o.Incarnation, ".@") {
		add("Node %q and Incarnation %q may not hold '.' or '@'", o.Node, o.Incarnation)
	}
	return errors.Join(errs...)
}

// soloMembers is a solo group's membership: nobody gossips.
type soloMembers struct{}

func (soloMembers) Members() []Member { return nil }

// Group is this node's part of its cluster's raft group.
type Group struct {
	opts  Options
	id    raft.ServerID // this node's: ServerID(Node, Incarnation)
	raft  *raft.Raft
	log   *wal.Store
	trans raft.Transport
	// layer is the raft port (nil for a group of one).
	layer *raftconn.Layer
	// refusedBy is the last refusal of this node by a member of its
	// configuration (nil: none).
	refusedBy *atomic.Pointer[raftconn.Refusal]
	// closeTrans closes the transport (the network one has a port).
	closeTrans func()
	stop       chan struct{}
	done       chan struct{}
	// beats is the leader's view of which voters answer its heartbeats
	// (heartbeats.go); obs its registration with raft.
	beats *heartbeats
	obs   *raft.Observer
	// recovery: this open rewrote the configuration from peers.json (a
	// majority was lost); nil otherwise.
	recovery atomic.Pointer[Recovery]
	// fenced: a member refused this node at open (it was removed, lost in
	// a recovery, or replaced): raft is halted, and the group stays open
	// so that the node can stay up and say so (Fenced).
	fenced error
	// desc caches what members said of themselves (service.go).
	desc described
	// unconfirmed: members whose raft port did not confirm them, and
	// until when they are left alone (members.go confirmed).
	unconfirmed struct {
		sync.Mutex
		m map[string]time.Time
	}

	// lead is the leader's bookkeeping of membership, of the run
	// goroutine only: the commit index each new member must reach before
	// it votes, and the lines already logged.
	lead struct {
		learners map[raft.ServerID]uint64
		logged   map[string]time.Time
	}

	mu struct {
		sync.Mutex
		bootstrapped bool
		// refused are the members the leader keeps out, and why.
		refused map[raft.ServerID]string
	}
}

// Open starts the node's raft: it takes part in an existing group at once,
// and forms a new one with the others once BootstrapExpect fresh nodes are
// seen.
func Open(opts *Options) (*Group, error) {
	o, err := options.Resolve(opts)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	lo := o.Log
	lo.Logger = o.Logger
	store, err := wal.Open(filepath.Join(o.Dir, "raft"), &lo)
	if err != nil {
		return nil, err
	}
	snaps, err := openSnapshots(filepath.Join(o.Dir, "snapshots"))
	if err != nil {
		store.Close()
		return nil, err
	}
	self := ServerID(o.Node, o.Incarnation)
	var started atomic.Pointer[raft.Raft]
	refusedBy := &atomic.Pointer[raftconn.Refusal]{}
	var ignoredAt atomic.Int64
	var trans raft.Transport
	var layer *raftconn.Layer
	if o.Solo {
		_, trans = raft.NewInmemTransport(raft.ServerAddress(o.Node))
	} else if o.Number > 0 {
		// The port is group 0's; this group's connections are named by
		// their preamble (raftconn groups.go).
		layer = o.Port
		gt, err := raftconn.NewGroupTransport(layer, o.Number, &raft.NetworkTransportConfig{MaxPool: 4,
			Timeout: 5 * time.Second, Logger: hclog.NewNullLogger()})
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("cluster: group %d: %w", o.Number, err)
		}
		trans = gt
	} else {
		co := o.Conn
		co.Cluster, co.Node, co.ID, co.Applied = o.Cluster, o.Node, string(self), o.Applied
		if co.Applied == nil {
			co.Applied = func() uint64 {
				if r := started.Load(); r != nil {
					return r.AppliedIndex()
				}
				return 0
			}
		}
		co.Refuse = func(sender string) string {
			// A member of the configuration is never refused: a removal
			// is recorded before the configuration change, which must
			// still reach it.
			if r := started.Load(); r != nil {
				for _, s := range r.GetConfiguration().Configuration().Servers {
					if string(s.ID) == sender {
						return ""
					}
				}
			}
			return o.Removed(raft.ServerID(sender))
		}
		co.OnRefused = func(by, addr, why string) {
			// Only a member of this node's configuration, answering at the
			// address the configuration holds for it, keeps this node out:
			// a probe of an address gossip reported (anyone can gossip)
			// must not stop a node. The member may answer as a later
			// incarnation of its node than this node's configuration
			// names (it was wiped and rejoined while this node was away):
			// it is at the member's address with the cluster's raft
			// credential, and its record of removals is the log's.
			r := started.Load()
			if r == nil {
				return
			}
			for _, s := range r.GetConfiguration().Configuration().Servers {
				if sameNode(s.ID, raft.ServerID(by)) && string(s.Address) == addr && s.ID != self {
					refusedBy.Store(&raftconn.Refusal{By: by, Reason: why, At: time.Now()})
					if o.OnRefused != nil {
						o.OnRefused(by, why)
					}
					return
				}
			}
			if now := time.Now().UnixNano(); now-ignoredAt.Load() > int64(10*time.Second) { // raft and the probes retry often
				ignoredAt.Store(now)
				o.Logger.Warn("a refusal from a node that is not a member at that address: ignored", "by", by, "addr", addr, "why", why)
			}
		}
		co.Describe = o.Describe
		if co.Logger == nil {
			co.Logger = o.Logger
		}
		var adv net.Addr
		if o.Advertise != "" {
			adv = advertised(o.Advertise)
		}
		var err error
		if layer, err = raftconn.Listen(o.Listen, adv, co); err != nil {
			store.Close()
			return nil, err
		}
		// Every RPC names the server it is meant for: a node that lost its
		// memory is another identity, and answers none of them.
		trans = raftconn.NewTransport(layer, &raft.NetworkTransportConfig{MaxPool: 4,
			Timeout: 5 * time.Second, Logger: hclog.NewNullLogger()})
	}
	cfg := raft.DefaultConfig()
	cfg.LocalID = self
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = o.HeartbeatTimeout, o.ElectionTimeout, o.LeaderLeaseTimeout
	cfg.Logger = raftLogger(o.Logger)
	cfg.SnapshotThreshold, cfg.SnapshotInterval, cfg.TrailingLogs = o.SnapshotThreshold, o.SnapshotInterval, o.TrailingLogs
	// The state machine keeps its state in Pebble and skips what it has
	// applied: a snapshot is never restored at start (the node checks that
	// the tree is at least as new as the newest snapshot before it opens
	// the group: Inspect).
	cfg.NoSnapshotRestoreOnStart = true
	closeTrans := func() {
		if c, ok := trans.(io.Closer); ok {
			c.Close()
		}
	}
	existing, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		closeTrans()
		store.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	recovery, err := recoverIfAsked(&o, cfg, store, snaps, trans)
	if err != nil {
		closeTrans()
		store.Close()
		return nil, err
	}
	r, err := raft.NewRaft(cfg, o.FSM, store, store, snaps, trans)
	if err != nil {
		closeTrans()
		store.Close()
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	started.Store(r)
	g := &Group{opts: o, id: self, refusedBy: refusedBy, raft: r, log: store, trans: trans, layer: layer, closeTrans: closeTrans, stop: make(chan struct{}),
		done: make(chan struct{})}
	g.recovery.Store(recovery)
	g.mu.bootstrapped = existing
	if o.Solo && existing {
		// A node of several started as a node alone would wait for ever
		// for the votes of nodes it cannot reach.
		cf := r.GetConfiguration()
		if cf.Error() == nil && len(cf.Configuration().Servers) > 1 {
			r.Shutdown().Error()
			closeTrans()
			store.Close()
			return nil, fmt.Errorf("%w: this node is one of %d of cluster %s (%s): start it with its raft port (--raft-listen)",
				ErrNotAlone, len(cf.Configuration().Servers), o.Cluster, serverIDs(cf.Configuration()))
		}
		if servers := cf.Configuration().Servers; cf.Error() == nil && len(servers) == 1 && servers[0].ID != self {
			// A node alone whose directory got a new incarnation (a
			// restore): it is its group's only voter, under its new name.
			r.Shutdown().Error()
			me := raft.Configuration{Servers: []raft.Server{{ID: self, Address: trans.LocalAddr()}}}
			if err := raft.RecoverCluster(cfg, o.FSM, store, store, snaps, trans, me); err != nil {
				closeTrans()
				store.Close()
				return nil, fmt.Errorf("cluster: a group of one renamed %s: %w", self, err)
			}
			if r, err = raft.NewRaft(cfg, o.FSM, store, store, snaps, trans); err != nil {
				closeTrans()
				store.Close()
				return nil, fmt.Errorf("cluster: start raft: %w", err)
			}
			started.Store(r)
			g.raft = r
			o.Logger.Info("a node alone under a new incarnation: its group of one renamed", "was", servers[0].ID, "now", self)
		}
	}
	if !o.Solo && existing {
		if err := g.fence(); err != nil {
			// Halted, not closed: a node that exits here is restarted by
			// its supervisor, refused again, in a loop; one that stays up
			// answers why (the node refuses every read and write).
			r.Shutdown().Error()
			g.fenced = err
			o.Logger.Error("a member of the cluster refuses this node: raft is halted", "err", err)
		}
	}
	if (o.Solo || o.BootstrapAlone) && !existing && g.fenced == nil {
		me := raft.Server{ID: cfg.LocalID, Address: trans.LocalAddr()}
		if err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{me}}).Error(); err != nil {
			r.Shutdown().Error()
			closeTrans()
			store.Close()
			return nil, fmt.Errorf("cluster: bootstrap a group of one: %w", err)
		}
		g.mu.bootstrapped = true
	}
	g.beats = newHeartbeats()
	g.obs = g.beats.observer()
	g.raft.RegisterObserver(g.obs)
	go g.beats.watch(g.stop) // exits at Close
	go g.run()
	return g, nil
}

func serverIDs(c raft.Configuration) string {
	var ids []string
	for _, s := range c.Servers {
		ids = append(ids, string(s.ID))
	}
	return strings.Join(ids, ", ")
}

// ReadLog calls f with the commands of the raft log under dir from index
// from through to, in order, without starting raft. Only indexes at or below
// a snapshot's are known to be committed.
func ReadLog(dir string, from, to uint64, logger *slog.Logger, f func(index uint64, data []byte) error) error {
	store, err := wal.Open(filepath.Join(dir, "raft"), &wal.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer store.Close()
	for i := from; i <= to; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			return fmt.Errorf("cluster: read log entry %d: %w", i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if err := f(i, l.Data); err != nil {
			return err
		}
	}
	return nil
}

// LogState is what a node's raft directory holds.
type LogState struct {
	// Existing: the directory holds raft state (a log, a term or a
	// snapshot).
	Existing bool
	// First and Last are the log's bounds (0 when empty).
	First, Last uint64
	// Snapshot is the newest snapshot's index (0: none), and SnapshotHead
	// the first bytes of its content (up to 4 KiB: where the state machine
	// writes what it needs to know without reading the whole snapshot).
	Snapshot     uint64
	SnapshotHead []byte
	// SnapshotTree is the newest snapshot's tree directory ("" without).
	SnapshotTree string
	// LastCommand is the last command (not one of raft's own entries) the
	// log holds (0: none); LastTerm the term of the log's last entry.
	LastCommand, LastTerm uint64
	// SnapshotTerm is the newest snapshot's term, and LogTermAtSnapshot the
	// term of the log's own entry at the snapshot's index (0: the log does
	// not hold it). When they are equal the log holds exactly the commands
	// the snapshot covers (raft's log matching); otherwise the snapshot came
	// from a leader whose log this node's tail does not match.
	SnapshotTerm, LogTermAtSnapshot uint64
}

// Inspect reads the state of the raft directory under dir without starting
// raft: a node compares it with what its state machine applied before it
// opens the group.
func Inspect(dir string, logger *slog.Logger) (LogState, error) {
	var st LogState
	if _, err := os.Stat(filepath.Join(dir, "raft")); errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	store, err := wal.Open(filepath.Join(dir, "raft"), &wal.Options{Logger: logger})
	if err != nil {
		return st, err
	}
	defer store.Close()
	snaps, err := openSnapshots(filepath.Join(dir, "snapshots"))
	if err != nil {
		return st, err
	}
	if st.Existing, err = raft.HasExistingState(store, store, snaps); err != nil {
		return st, fmt.Errorf("cluster: %w", err)
	}
	st.First, _ = store.FirstIndex()
	st.Last, _ = store.LastIndex()
	st.LastCommand = lastCommand(store, st.Last)
	if st.Last > 0 {
		var l raft.Log
		if err := store.GetLog(st.Last, &l); err == nil {
			st.LastTerm = l.Term
		}
	}
	metas, err := snaps.List()
	if err != nil {
		return st, fmt.Errorf("cluster: snapshots: %w", err)
	}
	if len(metas) > 0 {
		st.Snapshot, st.SnapshotTerm = metas[0].Index, metas[0].Term
		var l raft.Log
		if st.Snapshot >= st.First && st.Snapshot <= st.Last && store.GetLog(st.Snapshot, &l) == nil {
			st.LogTermAtSnapshot = l.Term
		}
		_, rc, err := snaps.Open(metas[0].ID)
		if err != nil {
			return st, fmt.Errorf("cluster: snapshot %s: %w", metas[0].ID, err)
		}
		if ts, ok := rc.(TreeSnapshot); ok {
			st.SnapshotTree = ts.TreeDir()
		}
		st.SnapshotHead, err = io.ReadAll(io.LimitReader(rc, 4096))
		rc.Close()
		if err != nil {
			return st, fmt.Errorf("cluster: snapshot %s: %w", metas[0].ID, err)
		}
	}
	return st, nil
}

// advertised is the raft address the others dial, when it is not the
// bound one.
type advertised string

func (a advertised) Network() string { return "tcp" }
func (a advertised) String() string  { return string(a) }

// Fresh reports whether this node may take part in forming a new group: no
// raft state, no data.
func (g *Group) Fresh() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.mu.bootstrapped && !g.opts.HasData()
}

// Addr is the advertised raft address.
func (g *Group) Addr() string { return string(g.trans.LocalAddr()) }

// Apply commits cmd on a quorum and applies it on this node (the leader),
// returning what the state machine returned. A NotLeaderError means the
// command never entered the log; any other error leaves its fate unknown
// (raft.ErrLeadershipLost: it was in flight when this node stopped leading,
// and a new leader may yet commit it).
func (g *Group) Apply(cmd []byte, timeout time.Duration) (any, error) {
	f := g.raft.Apply(cmd, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			addr, id := g.raft.LeaderWithID()
			return nil, &NotLeaderError{LeaderID: string(id), LeaderAddr: string(addr)}
		}
		return nil, fmt.Errorf("cluster: apply: %w", err)
	}
	return f.Response(), nil
}

// Snapshot snapshots the state machine now and compacts the log.
func (g *Group) Snapshot() error { return g.raft.Snapshot().Error() }

// LogBounds are the first and last indexes the raft log holds.
func (g *Group) LogBounds() (first, last uint64) {
	first, _ = g.log.FirstIndex()
	last, _ = g.log.LastIndex()
	return first, last
}

// LogStats describe the raft log's files.
func (g *Group) LogStats() wal.Stats { return g.log.Stats() }

// Barrier returns once every command committed before it is applied here:
// a new leader calls it before it stamps anything.
func (g *Group) Barrier(timeout time.Duration) error { return g.raft.Barrier(timeout).Error() }

// IsLeader reports whether this node leads now.
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// TransferLeadership asks raft to hand leadership to another voter (a
// node whose state machine stopped must not lead).
func (g *Group) TransferLeadership() error { return g.raft.LeadershipTransfer().Error() }

// TransferLeadershipTo hands this leader's leadership to member id (the
// groups' leaders spread over the nodes: SpreadMove).
func (g *Group) TransferLeadershipTo(id raft.ServerID) error {
	addr, err := g.address(id)
	if err != nil {
		return err
	}
	return g.raft.LeadershipTransferToServer(id, raft.ServerAddress(addr)).Error()
}

// Term is the current raft term.
func (g *Group) Term() uint64 { return g.raft.CurrentTerm() }

// CommitIndex is the highest log index this node knows committed.
func (g *Group) CommitIndex() uint64 { return g.raft.CommitIndex() }

// VerifyLeader confirms that this node still leads (a quorum answered it
// since it was asked): a read after it sees every write committed before.
func (g *Group) VerifyLeader(timeout time.Duration) error {
	f := g.raft.VerifyLeader()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			id, addr := g.Leader()
			return &NotLeaderError{LeaderID: id, LeaderAddr: addr}
		}
		return err
	case <-time.After(timeout):
		return fmt.Errorf("cluster: leadership not confirmed within %s", timeout)
	}
}

// HasCommand reports whether the log holds a command (not one of raft's
// own entries) at an index in [from, to].
func (g *Group) HasCommand(from, to uint64) (bool, error) {
	for i := from; i <= to; i++ {
		var l raft.Log
		if err := g.log.GetLog(i, &l); err != nil {
			return false, fmt.Errorf("cluster: read log entry %d: %w", i, err)
		}
		if l.Type == raft.LogCommand {
			return true, nil
		}
	}
	return false, nil
}

// Fenced is why a member refused this node at open (wrapping ErrRemoved),
// nil if none did: raft is halted, and the node must refuse every read and
// write.
func (g *Group) Fenced() error { return g.fenced }

// Close leaves the group's work to the others: raft stops, the port
// closes, the log is closed.
func (g *Group) Close() error {
	close(g.stop)
	<-g.done
	<-g.beats.done
	g.raft.DeregisterObserver(g.obs)
	err := g.raft.Shutdown().Error()
	g.closeTrans()
	return errors.Join(err, g.log.Close())
}

// Package cluster is one cluster's raft group (issue 15, docs/CLUSTER.md):
// it forms the group from the nodes gossip finds, keeps its membership, and
// applies commands through a state machine it is given. What the commands
// mean is the state machine's business; this package decides only who
// leads, who belongs, and that a command is committed on a quorum before it
// is applied.
//
// The raft log and stable state live in raftlog (tidwall/wal, fsynced); the
// raft port is raftconn (TLS both ways, the cluster checked at each end).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/raftlog"
)

// Errors.
var (
	// ErrNotLeader: this node cannot commit; NotLeaderError names the
	// leader when one is known.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrQuorum refuses a removal that would leave the group without a
	// quorum of live voters.
	ErrQuorum = errors.New("cluster: the change would lose quorum")
	// ErrUnknownNode is a removal of a node that is not a member.
	ErrUnknownNode = errors.New("cluster: no such node")
	// ErrNotAlone refuses to start a node of several as a node alone.
	ErrNotAlone = errors.New("cluster: the node belongs to a cluster of several")
	// ErrRemoved refuses a node ID that was removed from the group.
	ErrRemoved = errors.New("cluster: the node ID was removed")
)

// NotLeaderError says who leads (empty when nobody is known to).
type NotLeaderError struct{ LeaderID, LeaderAddr string }

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "cluster: not the leader, and no leader is known"
	}
	return fmt.Sprintf("cluster: not the leader (the leader is %s at %s)", e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// Member is a node of this cluster as gossip reports it.
type Member struct {
	ID       string
	RaftAddr string
	Alive    bool
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
	// BootstrapExpect is how many fresh nodes form a new group (0: never
	// bootstrap; the node waits to be added).
	BootstrapExpect int
	// HasData reports that this node holds data: such a node never
	// bootstraps a new group (its data would fork from its old one).
	HasData func() bool
	// FSM applies committed commands.
	FSM raft.FSM
	// Removed reports a node ID that was removed from the group: the leader
	// never adds it back, however alive gossip says it is (a removed ID is
	// not reused). Default: none is.
	Removed func(id string) bool
	// Members is gossip's view of this cluster.
	Members Membership
	// Reconcile is how often bootstrap and membership are checked
	// (default 250ms).
	Reconcile time.Duration
	// Timing of raft (defaults: hashicorp/raft's, tuned for LAN; a solo
	// group's are 20ms, the time it waits before electing itself).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// Log configures the raft log (Logger is filled from below).
	Log raftlog.Options
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
		o.Removed = func(string) bool { return false }
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
	if o.Listen == "" && !o.Solo {
		add("Listen is required (--raft-listen)")
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
	return errors.Join(errs...)
}

// soloMembers is a solo group's membership: nobody gossips.
type soloMembers struct{}

func (soloMembers) Members() []Member { return nil }

// Group is this node's part of its cluster's raft group.
type Group struct {
	opts  Options
	raft  *raft.Raft
	log   *raftlog.Store
	trans raft.Transport
	// closeTrans closes the transport (the network one has a port).
	closeTrans func()
	stop       chan struct{}
	done       chan struct{}
	// recovered: this open rewrote the configuration from peers.json (a
	// majority was lost).
	recovered bool

	mu struct {
		sync.Mutex
		bootstrapped bool
	}
}

// Open starts the node's raft: it takes part in an existing group at once,
// and forms a new one with the others once BootstrapExpect fresh nodes are
// seen.
func Open(opts *Options) (*Group, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	lo := o.Log
	lo.Logger = o.Logger
	store, err := raftlog.Open(filepath.Join(o.Dir, "raft"), &lo)
	if err != nil {
		return nil, err
	}
	snaps, err := openSnapshots(filepath.Join(o.Dir, "snapshots"))
	if err != nil {
		store.Close()
		return nil, err
	}
	var trans raft.Transport
	if o.Solo {
		_, trans = raft.NewInmemTransport(raft.ServerAddress(o.Node))
	} else {
		co := o.Conn
		co.Cluster, co.Node = o.Cluster, o.Node
		var adv net.Addr
		if o.Advertise != "" {
			adv = advertised(o.Advertise)
		}
		layer, err := raftconn.Listen(o.Listen, adv, co)
		if err != nil {
			store.Close()
			return nil, err
		}
		trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: layer, MaxPool: 4,
			Timeout: 5 * time.Second, Logger: hclog.NewNullLogger()})
	}
	cfg := raft.DefaultConfig()
	cfg.LocalID = raft.ServerID(o.Node)
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
	recovered, err := recoverIfAsked(&o, cfg, store, snaps, trans)
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
	g := &Group{opts: o, raft: r, log: store, trans: trans, closeTrans: closeTrans, stop: make(chan struct{}), done: make(chan struct{}),
		recovered: recovered}
	g.mu.bootstrapped = existing
	if o.Solo && existing {
		// A node of several started as a node alone would wait for ever
		// for the votes of nodes it cannot reach.
		if cf := r.GetConfiguration(); cf.Error() == nil && len(cf.Configuration().Servers) > 1 {
			r.Shutdown().Error()
			closeTrans()
			store.Close()
			return nil, fmt.Errorf("%w: this node is one of %d of cluster %s (%s): start it with its raft port (--raft-listen)",
				ErrNotAlone, len(cf.Configuration().Servers), o.Cluster, serverIDs(cf.Configuration()))
		}
	}
	if (o.Solo || o.BootstrapAlone) && !existing {
		self := raft.Server{ID: cfg.LocalID, Address: trans.LocalAddr()}
		if err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{self}}).Error(); err != nil {
			r.Shutdown().Error()
			closeTrans()
			store.Close()
			return nil, fmt.Errorf("cluster: bootstrap a group of one: %w", err)
		}
		g.mu.bootstrapped = true
	}
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

// raftLogger passes raft's warnings and errors to the node's log (its
// info lines are every heartbeat's business).
func raftLogger(l *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: &lineWriter{l: l, last: map[string]time.Time{}},
		DisableTime: true})
}

// lineWriter logs each line hclog writes. A peer that is down makes raft
// log a failed heartbeat or append every few milliseconds: a line of one
// kind about one peer is logged at most every repeatEvery, with how many
// were left out.
type lineWriter struct {
	l    *slog.Logger
	mu   sync.Mutex
	last map[string]time.Time
	left map[string]int
}

const repeatEvery = 10 * time.Second

func (w *lineWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	if strings.Contains(msg, "[ERROR]") {
		level = slog.LevelError
	}
	kind := lineKind(msg)
	w.mu.Lock()
	now := time.Now()
	if t, ok := w.last[kind]; ok && now.Sub(t) < repeatEvery {
		if w.left == nil {
			w.left = map[string]int{}
		}
		w.left[kind]++
		w.mu.Unlock()
		return len(p), nil
	}
	w.last[kind] = now
	left := w.left[kind]
	delete(w.left, kind)
	if len(w.last) > 1000 {
		w.last = map[string]time.Time{}
	}
	w.mu.Unlock()
	if left > 0 {
		w.l.Log(context.Background(), level, msg, "component", "raft", "repeats_left_out", left)
	} else {
		w.l.Log(context.Background(), level, msg, "component", "raft")
	}
	return len(p), nil
}

// lineKind is what makes two of raft's lines the same kind: the message
// (hclog writes "[LEVEL]  raft: message: key=value ..."), its level, and
// the peer or target it is about (a quoted value may hold spaces).
func lineKind(line string) string {
	level, rest, _ := strings.Cut(line, "raft: ")
	msg, fields, _ := strings.Cut(rest, ": ")
	kind := strings.TrimSpace(level) + " " + msg
	for _, key := range []string{"peer=", "target=", "server-id=", "id="} {
		i := strings.Index(fields, key)
		if i < 0 || (i > 0 && fields[i-1] != ' ') {
			continue
		}
		v := fields[i+len(key):]
		if strings.HasPrefix(v, `"`) {
			if end := strings.Index(v[1:], `"`); end >= 0 {
				v = v[:end+2]
			}
		} else {
			v, _, _ = strings.Cut(v, " ")
		}
		kind += " " + key + v
		break
	}
	return kind
}

// PeersFile is where an operator puts the configuration of the nodes that
// survive the loss of a majority (hashicorp/raft's peers.json, version 3:
// [{"id": "a1", "address": "10.0.0.1:7500", "non_voter": false}]), on every
// survivor, before starting them again.
const PeersFile = "peers.json"

// recoverIfAsked rewrites the group's configuration from peers.json when
// the operator put one there (raft.RecoverCluster: the log this node holds
// is applied, committed or not, and compacted into a snapshot with the new
// configuration). The file is kept as peers.json.recovered-<time>.
func recoverIfAsked(o *Options, cfg *raft.Config, store *raftlog.Store, snaps raft.SnapshotStore, trans raft.Transport) (bool, error) {
	path := filepath.Join(o.Dir, PeersFile)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if o.Solo {
		return false, fmt.Errorf("cluster: %s is a recovery of a cluster of several: start the node with its raft port (--raft-listen)", path)
	}
	conf, err := raft.ReadConfigJSON(path)
	if err != nil {
		return false, fmt.Errorf("cluster: %s: %w", path, err)
	}
	if len(conf.Servers) != 1 || string(conf.Servers[0].ID) != o.Node {
		// Each survivor would apply its own log's tail, committed or not,
		// and their trees could differ for ever: one recovers, the others
		// join it with empty data directories.
		return false, fmt.Errorf("cluster: %s must name this node (%s) alone: recover one survivor, then start the others "+
			"with empty data directories and new node IDs (they catch up from it)", path, o.Node)
	}
	if err := raft.RecoverCluster(cfg, o.FSM, store, store, snaps, trans, conf); err != nil {
		return false, fmt.Errorf("cluster: recover from %s: %w", path, err)
	}
	done := fmt.Sprintf("%s.recovered-%d", path, time.Now().Unix())
	if err := os.Rename(path, done); err != nil {
		return false, fmt.Errorf("cluster: %w", err)
	}
	o.Logger.Warn("recovered the cluster's configuration after the loss of a majority", "servers", serverIDs(conf), "kept_at", done)
	return true, nil
}

// Recovered reports whether this open recovered the configuration from
// peers.json.
func (g *Group) Recovered() bool { return g.recovered }

// ReadLog calls f with the commands of the raft log under dir from index
// from through to, in order, without starting raft. Only indexes at or below
// a snapshot's are known to be committed.
func ReadLog(dir string, from, to uint64, logger *slog.Logger, f func(index uint64, data []byte) error) error {
	store, err := raftlog.Open(filepath.Join(dir, "raft"), &raftlog.Options{Logger: logger})
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
	store, err := raftlog.Open(filepath.Join(dir, "raft"), &raftlog.Options{Logger: logger})
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

// run bootstraps when the time comes and, while leading, adds the members
// gossip reports to the configuration. It exits at Close.
func (g *Group) run() {
	defer close(g.done)
	t := time.NewTicker(g.opts.Reconcile)
	defer t.Stop()
	for {
		g.reconcile()
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
	}
}

func (g *Group) reconcile() {
	members := g.opts.Members.Members()
	if g.raft.State() == raft.Leader {
		g.addMembers(members)
		return
	}
	g.mu.Lock()
	bootstrapped := g.mu.bootstrapped
	g.mu.Unlock()
	if bootstrapped || g.opts.BootstrapExpect == 0 || g.opts.HasData() {
		return
	}
	// Consul's rule, with one writer of the first configuration: once
	// exactly the expected number of nodes is seen, all fresh (none holds a
	// group's state or data, which would mean a group exists to join), the
	// lowest ID bootstraps with all of them; the others are told of it by
	// the leader's first append.
	var fresh []Member
	for _, m := range members {
		if !m.Fresh {
			return
		}
		if m.Alive {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) != g.opts.BootstrapExpect {
		return
	}
	slices.SortFunc(fresh, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	if fresh[0].ID != g.opts.Node {
		return
	}
	var servers []raft.Server
	for _, m := range fresh {
		servers = append(servers, raft.Server{ID: raft.ServerID(m.ID), Address: raft.ServerAddress(m.RaftAddr)})
	}
	err := g.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		g.opts.Logger.Warn("bootstrap failed", "err", err)
		return
	}
	g.mu.Lock()
	g.mu.bootstrapped = true
	g.mu.Unlock()
	g.opts.Logger.Info("cluster bootstrapped", "nodes", len(servers))
}

// addMembers adds live members missing from the configuration as voters.
func (g *Group) addMembers(members []Member) {
	cf := g.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	in := map[raft.ServerID]raft.ServerAddress{}
	for _, s := range cf.Configuration().Servers {
		in[s.ID] = s.Address
	}
	for _, m := range members {
		if !m.Alive || m.ID == "" || m.RaftAddr == "" || g.opts.Removed(m.ID) {
			continue
		}
		if addr, ok := in[raft.ServerID(m.ID)]; ok && string(addr) == m.RaftAddr {
			continue
		}
		if err := g.raft.AddVoter(raft.ServerID(m.ID), raft.ServerAddress(m.RaftAddr), 0, 5*time.Second).Error(); err != nil {
			g.opts.Logger.Warn("adding a node failed", "node", m.ID, "err", err)
			continue
		}
		g.opts.Logger.Info("node added", "node", m.ID, "raft", m.RaftAddr)
	}
}

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
func (g *Group) LogStats() raftlog.Stats { return g.log.Stats() }

// Barrier returns once every command committed before it is applied here:
// a new leader calls it before it stamps anything.
func (g *Group) Barrier(timeout time.Duration) error { return g.raft.Barrier(timeout).Error() }

// IsLeader reports whether this node leads now.
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// TransferLeadership asks raft to hand leadership to another voter (a
// node whose state machine stopped must not lead).
func (g *Group) TransferLeadership() error { return g.raft.LeadershipTransfer().Error() }

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

// Join adds a node as a voter (an operator's join, or one gossip does not
// report). A removed ID is refused: node IDs are never reused.
func (g *Group) Join(id, addr string) error {
	if !g.IsLeader() {
		lid, laddr := g.Leader()
		return &NotLeaderError{LeaderID: lid, LeaderAddr: laddr}
	}
	if id == "" || addr == "" {
		return fmt.Errorf("cluster: join: a node ID and a raft address are required")
	}
	if g.opts.Removed(id) {
		return fmt.Errorf("%w: %s was removed from the cluster; a removed ID is not reused: give the node a new ID (and an empty data directory)", ErrRemoved, id)
	}
	if err := g.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 10*time.Second).Error(); err != nil {
		return fmt.Errorf("cluster: join %s at %s: %w", id, addr, err)
	}
	return nil
}

// Leader is the known leader's ID and raft address (empty: none known).
func (g *Group) Leader() (id, addr string) {
	a, i := g.raft.LeaderWithID()
	return string(i), string(a)
}

// Server is one voter of the configuration.
type Server struct {
	ID     string `json:"id"`
	Raft   string `json:"raft"`
	Leader bool   `json:"leader"`
	Alive  bool   `json:"alive"`
}

// Status is /admin/cluster's document.
type Status struct {
	Cluster string   `json:"cluster"`
	Node    string   `json:"node"`
	State   string   `json:"state"`
	Leader  string   `json:"leader"`
	Term    uint64   `json:"term"`
	Commit  uint64   `json:"commit_index"`
	Applied uint64   `json:"applied_index"`
	Last    uint64   `json:"last_log_index"`
	Servers []Server `json:"servers"`
}

// Status reports this node's view of the group.
func (g *Group) Status() Status {
	st := g.raft.Stats()
	num := func(k string) uint64 { v, _ := strconv.ParseUint(st[k], 10, 64); return v }
	leader, _ := g.Leader()
	s := Status{Cluster: g.opts.Cluster, Node: g.opts.Node, State: g.raft.State().String(), Leader: leader,
		Term: num("term"), Commit: g.raft.CommitIndex(), Applied: g.raft.AppliedIndex(), Last: num("last_log_index")}
	alive := map[string]bool{}
	for _, m := range g.opts.Members.Members() {
		alive[m.ID] = m.Alive
	}
	if cf := g.raft.GetConfiguration(); cf.Error() == nil {
		for _, sv := range cf.Configuration().Servers {
			s.Servers = append(s.Servers, Server{ID: string(sv.ID), Raft: string(sv.Address), Leader: string(sv.ID) == leader,
				Alive: alive[string(sv.ID)] || string(sv.ID) == g.opts.Node})
		}
	}
	return s
}

// Remove takes a node out of the group. It is refused when the voters left
// that gossip sees alive would not be a majority of the new configuration.
func (g *Group) Remove(id string) error { return g.RemoveWith(id, nil) }

// RemoveWith is Remove, calling before (when set) once the removal was
// found to keep a quorum and before it is made: the node records that the
// ID was removed, so that the leader never adds it back.
func (g *Group) RemoveWith(id string, before func() error) error {
	if !g.IsLeader() {
		lid, addr := g.Leader()
		return &NotLeaderError{LeaderID: lid, LeaderAddr: addr}
	}
	cf := g.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("cluster: remove %s: %w", id, err)
	}
	alive := map[string]bool{g.opts.Node: true}
	for _, m := range g.opts.Members.Members() {
		if m.Alive {
			alive[m.ID] = true
		}
	}
	found, voters, live := false, 0, 0
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id {
			found = true
			continue
		}
		if s.Suffrage == raft.Voter {
			voters++
			if alive[string(s.ID)] {
				live++
			}
		}
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrUnknownNode, id)
	}
	if voters == 0 || live < voters/2+1 {
		return fmt.Errorf("%w: removing %s leaves %d voters, %d of them alive (a quorum is %d)", ErrQuorum, id, voters, live, voters/2+1)
	}
	if before != nil {
		if err := before(); err != nil {
			return fmt.Errorf("cluster: remove %s: %w", id, err)
		}
	}
	if err := g.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second).Error(); err != nil {
		return fmt.Errorf("cluster: remove %s: %w", id, err)
	}
	return nil
}

// Close leaves the group's work to the others: raft stops, the port
// closes, the log is closed.
func (g *Group) Close() error {
	close(g.stop)
	<-g.done
	err := g.raft.Shutdown().Error()
	g.closeTrans()
	return errors.Join(err, g.log.Close())
}

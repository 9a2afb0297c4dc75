package replica

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/raftconn"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
)

// proposed are the commands this node has in flight, by their proposal
// IDs (machine/proposal.go): the FSM applies the command the proposer built
// instead of decoding its bytes again (a peer's batch was decoded once
// already, to admit it). Followers, replays and commands of encoding 1 (no
// ID) decode: the machine's tests hold the two paths to the same result
// (TestDecodedAppliesAsBuilt).
type proposed struct {
	mu sync.Mutex
	m  map[machine.ProposalID]*machine.Command
}

// Deps is what a Replica needs of its node: values and functions, never
// the node.
type Deps struct {
	// Cluster and NodeID name this node, Incarnation its data directory's
	// life; Dir is the data directory (the group lives in Dir/cluster).
	Cluster, NodeID, Incarnation string
	Dir                          string
	Store                        *store.Store
	Clock                        *hlc.Clock
	Logger                       *slog.Logger
	// Raft is the raft port's settings of a cluster of several (nil: a
	// node alone, a group of one).
	Raft *Raft
	// Committer are the committer's limits and observers (Leading,
	// NotLeader, Replays, Commit and Committed are the replica's own).
	Committer CommitEnv
	// Log are the raft log's options (AppliedIndex and OnFatal are the
	// replica's own); OnFatal stops the node for a reason a restart does
	// not fix.
	Log     wal.Options
	OnFatal func(error)
	// Describe is what this node says of itself to the others (the format
	// it reads); Reads what a member proved it reads, known or not.
	Describe func() string
	Reads    func(id raft.ServerID) (commands int, known bool)
	// Terms (each of a cluster of several's leader; a node alone's only
	// one, from Open to Stop): Identity checks the stream's identity at
	// the first term of the process (checked: another leader or the
	// stream's creation already did); BeginTerm makes the links of a
	// term; Seal seals a stream the recovery from a lost majority left
	// (a cluster of several).
	Identity  func(checked bool) error
	BeginTerm func() (Term, error)
	Seal      func(stream entry.StreamID, why string) error
	// ReadsFormat is the newest command encoding this build reads (0:
	// machine.ReadsFormat; tests set less); CommandFault fails a command
	// before it is proposed (tests).
	ReadsFormat  int
	CommandFault func(*machine.Command) error
}

// Raft is the raft group of a cluster of several nodes.
type Raft struct {
	Conn              raftconn.Options
	Listen, Advertise string
	BootstrapExpect   int
	// ElectionTimeout bounds a failover's detection.
	ElectionTimeout                 time.Duration
	SnapshotThreshold, TrailingLogs uint64
	SnapshotInterval                time.Duration // 0: 30 s
	// Members is the gossip view of the cluster's nodes.
	Members cluster.Membership
	// Number, Port and MemberApplied place the replica's group among its
	// cluster's several (issue 51, cluster.Options): a group after 0
	// shares group 0's raft port. Removed is then group 0's record of the
	// servers kept out, which every group keeps out (group 0's log records
	// removals; the others record none); FormWith the servers to form the
	// group with (cluster.Options.FormWith).
	Number        int
	Port          *raftconn.Layer
	MemberApplied func(id raft.ServerID, addr string) (uint64, error)
	Removed       func(id raft.ServerID) string
	FormWith      func() []raft.Server
}

// Term is a leadership term's links, as the replica begins and ends them
// (links.Term).
type Term interface {
	Run()
	Abort()
	End()
}

// Replica is this node's replica of its cluster's raft group: it opens the
// machine and the group (and migrates an old directory into them), proposes
// commands and waits for them to apply, hands raft's FSM its callbacks,
// raises the log's format once every node reads it, follows its
// leadership in terms, and gates local reads after a start.
type Replica struct {
	d   Deps
	log *slog.Logger
	m   *metrics

	machine  *machine.Machine
	out      *machine.Outbound // the stream, as shippers read it
	group    *cluster.Group
	fsm      *machine.FSM
	com      *Committer
	proposer *machine.Proposer
	// proposed are the commands in flight (the FSM applies them as built)
	proposed proposed
	// progress is the last log index the state machine applied; applied
	// the last index of the stream applied to the store.
	progress progress
	applied  atomic.Uint64
	// restoring is set while a snapshot's tree replaces the store's: local
	// reads are refused.
	restoring atomic.Bool
	reads     readGate
	lead      leadState
	// stop ends the lead loop; loop waits for it.
	stop chan struct{}
	loop sync.WaitGroup

	// removed is why the cluster keeps this node out (nil: it does not).
	removed atomic.Pointer[error]
	// opened is the group once cluster.Open returned it: a refusal can
	// come from the raft port during the open itself (on another
	// goroutine), before r.group is set.
	opened atomic.Pointer[cluster.Group]
	// formatMu is held by RaiseFormat and by each admission of a member
	// until it is in the configuration.
	formatMu sync.Mutex
}

// New builds a replica of d and its committer (the state machine reports a
// failed apply to it); Open opens it.
func New(d Deps) *Replica {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	r := &Replica{d: d, log: d.Logger, proposer: machine.NewProposer(d.NodeID), stop: make(chan struct{}), m: newMetrics()}
	env := d.Committer
	env.Clock, env.Logger = d.Clock, d.Logger
	env.Leading, env.NotLeader, env.Committed = r.lead.ready.Load, r.notLeader, r.m.committed
	env.Replays = func(key string, fp []byte, now int64, e *entry.Entry) bool { return r.machine.Replays(key, fp, now, e) }
	env.Commit = func(cmd *machine.Command, enc *machine.Encoder) (any, error) {
		r.identify(cmd)
		data, err := enc.Encode(cmd)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrEncode, err)
		}
		t0 := time.Now()
		out, err := r.apply(data, cmd)
		observe(r.m.fsyncSeconds, t0)
		return out, err
	}
	r.com = NewCommitter(env)
	return r
}

// multi reports a replica of a cluster of several nodes. A node alone takes
// the same path (a raft group of one, the same committer, machine and FSM;
// its term is ready once Open returns); what multi() still forks is only
// what has no meaning without other nodes: terms that begin and end while
// the process runs, snapshots that carry a tree for a follower, and the
// starts a voter must refuse instead of beginning a new stream.
func (r *Replica) multi() bool { return r.d.Raft != nil }

// Machine is the state machine; Stream the cluster's stream; Group the raft
// group; FSM raft's state machine; Committer the write path's committer.
// Each is set once Open returned.
func (r *Replica) Machine() *machine.Machine   { return r.machine }
func (r *Replica) Stream() *machine.Outbound   { return r.out }
func (r *Replica) Group() *cluster.Group       { return r.group }
func (r *Replica) FSM() *machine.FSM           { return r.fsm }
func (r *Replica) Committer() *Committer       { return r.com }
func (r *Replica) Proposer() *machine.Proposer { return r.proposer }

// StreamApplied is the last stream index applied to the store.
func (r *Replica) StreamApplied() uint64 { return r.applied.Load() }

// Restoring reports a snapshot's tree replacing the store's.
func (r *Replica) Restoring() bool { return r.restoring.Load() }

// Removed is why the cluster keeps this node out (nil: it does not).
func (r *Replica) Removed() error {
	if p := r.removed.Load(); p != nil {
		return *p
	}
	return nil
}

// restoreClock raises the clock to the tree's high-water mark.
func (r *Replica) restoreClock() error {
	hw, err := r.d.Store.HLCHighWater()
	if err != nil {
		return err
	}
	r.d.Clock.Observe(hw)
	return nil
}

func (p *proposed) add(c *machine.Command) {
	if c.ID.IsZero() {
		return
	}
	p.mu.Lock()
	if p.m == nil {
		p.m = map[machine.ProposalID]*machine.Command{}
	}
	p.m[c.ID] = c
	p.mu.Unlock()
}

func (p *proposed) remove(c *machine.Command) {
	if c.ID.IsZero() {
		return
	}
	p.mu.Lock()
	delete(p.m, c.ID)
	p.mu.Unlock()
}

func (p *proposed) get(data []byte) *machine.Command {
	p.mu.Lock()
	none := len(p.m) == 0
	p.mu.Unlock()
	if none {
		return nil // a follower, or a replay: nothing of this node's in flight, no ID to read
	}
	id, ok := machine.PeekID(data)
	if !ok {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[id]
}

// ReadsFormat is the newest command encoding this node reads.
func (r *Replica) ReadsFormat() int {
	if f := r.d.ReadsFormat; f > 0 {
		return f
	}
	return machine.ReadsFormat
}

// AdmitMember lets a node join only if it reads the commands the log carries
// now (cluster.Options.Admit): once the log went to encoding 2, a build
// before it would stop at its first command. A build that describes
// nothing is before it. The admission holds formatMu until the group
// released it (the node is in the configuration, or adding it failed), so
// RaiseFormat, which holds it too, never checks the members while one it
// does not see yet is being added.
func (r *Replica) AdmitMember(description string) (release func(), err error) {
	r.formatMu.Lock()
	if err := r.admissible(description); err != nil {
		r.formatMu.Unlock()
		return nil, err
	}
	return r.formatMu.Unlock, nil
}

// admissible reports whether a node that describes itself so reads the
// log's commands.
func (r *Replica) admissible(description string) error {
	f := r.machine.Format()
	if f <= 1 {
		return nil
	}
	var d struct {
		Commands int `json:"commands"`
	}
	if description != "" {
		if err := json.Unmarshal([]byte(description), &d); err != nil {
			return fmt.Errorf("its description does not read: %w", err)
		}
	}
	if d.Commands < f {
		return fmt.Errorf("it reads commands of encoding %d at most, the log carries encoding %d: upgrade it first", max(d.Commands, 1), f)
	}
	return nil
}

// RaiseFormat moves the log to the newest command encoding once every
// member of the configuration reads it (after a rolling upgrade, the first
// term of a new cluster, or at once for a node alone): one Format command,
// after which proposals carry their IDs. Only the leader proposes it.
func (r *Replica) RaiseFormat() {
	want := r.ReadsFormat()
	if r.machine.Format() >= want || !r.group.IsLeader() || !r.lead.ready.Load() {
		return
	}
	// From the check of every member to the Format command's commit, no
	// node is added (AdmitMember): one added in between might not read it.
	r.formatMu.Lock()
	defer r.formatMu.Unlock()
	if r.multi() {
		for _, sv := range r.group.Status().Servers {
			id := cluster.ServerID(sv.ID, sv.Incarnation)
			if id == r.group.ID() {
				continue
			}
			if c, known := r.d.Reads(id); known && c >= want {
				continue
			}
			// Not known to read it (yet): asked afresh, since the member
			// may have restarted on a new build at the same address.
			s, err := r.group.DescribeAgain(id, time.Second)
			if err != nil || s == "" || commandsOf(s) < want {
				return // asked again at the next round
			}
		}
	}
	if err := r.ApplyCommand(&machine.Command{Format: &machine.FormatCmd{Version: uint8(want)}}); err != nil {
		r.log.Warn("could not move the log to the newest command encoding; trying again later", "format", want, "err", err)
		return
	}
	r.log.Info("the log's commands now carry proposal IDs: every member reads encoding "+fmt.Sprint(want), "format", want)
}

// identify gives c a proposal ID once the log says every node reads
// commands that carry one (machine.Format).
func (r *Replica) identify(c *machine.Command) {
	if r.machine.Format() >= 2 {
		c.ID = r.proposer.Next()
	}
}

// apply commits data, the encoding of c, and returns what the state
// machine returned. A group of one steps down after a failed append (a full
// disk) and elects itself again a moment later: a command refused for want
// of a leader never entered the log, so it is sent again once this node
// leads.
func (r *Replica) apply(data []byte, c *machine.Command) (any, error) {
	r.proposed.add(c)
	defer r.proposed.remove(c)
	t0 := time.Now()
	out, err := r.group.Apply(data, EnqueueTimeout)
	if err == nil {
		observe(r.m.commitSeconds, t0)
	}
	if r.multi() {
		return out, err // another node leads: the caller hears so
	}
	for try := 0; try < 3 && errors.As(err, new(*cluster.NotLeaderError)); try++ {
		if r.awaitLead(time.Second) != nil {
			break
		}
		out, err = r.group.Apply(data, EnqueueTimeout)
	}
	return out, err
}

// SealFile, after a recovery from the loss of a majority by a build before
// the recovery's record (cluster.RecoveryFile), names the stream the next
// term seals.
func (r *Replica) SealFile() string { return filepath.Join(r.groupDir(), "SEAL") }

// groupDir holds the raft log, its stable state and snapshots.
func (r *Replica) groupDir() string { return groupDir(r.d.Dir) }

func groupDir(dir string) string { return filepath.Join(dir, "cluster") }

// Open opens the machine, squares it with the raft directory, starts
// the group, and waits until the node leads and has applied its whole log.
// It reports whether the stream is new (minted now).
func (r *Replica) Open() (created bool, err error) {
	if err := machine.FinishRestore(r.groupDir(), r.d.Store, r.log); err != nil {
		return false, err
	}
	m, err := machine.Open(r.d.Store, machine.Options{Cluster: r.d.Cluster, Logger: r.log, ReadsFormat: r.d.ReadsFormat})
	if err != nil {
		return false, err
	}
	migrated, err := r.migrateWAL(m)
	if err != nil {
		return false, err
	}
	var lostWAL string
	if !migrated && !m.Logged() && !m.Stream().IsZero() {
		// A build before the log wrote this tree, and its WAL is gone:
		// entries past what the store applied may have been appended and
		// shipped, then lost, so the stream cannot go on (as that build
		// did, a new stream begins).
		lostWAL = fmt.Sprintf("the store applied stream %s up to %d but its WAL is gone", m.Stream(), m.Outbound().Last())
	}
	if migrated {
		if m, err = machine.Open(r.d.Store, machine.Options{Cluster: r.d.Cluster, Logger: r.log, ReadsFormat: r.d.ReadsFormat}); err != nil {
			return false, err
		}
	}
	r.machine, r.out = m, m.Outbound()
	r.fsm = machine.NewFSM(machine.Deps{
		Machine: m, Store: r.d.Store, Dir: r.groupDir(), Trees: r.multi(), Logger: r.log,
		Proposed:  r.proposed.get,
		Applied:   r.onApplied,
		Broken:    r.com.Fail,
		Restoring: r.restoring.Store,
		Installed: r.onInstalled,
	})
	mint, err := r.reconcileLog(m)
	if err != nil {
		return false, err
	}
	if mint == "" {
		mint = lostWAL
	}
	r.machine, r.out = m, m.Outbound()
	r.applied.Store(r.out.Last())
	r.progress.set(m.Applied())
	if r.multi() && mint != "" {
		return false, fmt.Errorf("node: %s; a node of a cluster of several never begins a stream of its own: "+
			"set this data directory aside and start the node with an empty one (it comes back as a new incarnation and catches up from the leader)", mint)
	}
	co := &cluster.Options{
		Cluster:     r.d.Cluster,
		Node:        r.d.NodeID,
		Incarnation: r.d.Incarnation,
		Dir:         r.groupDir(),
		Solo:        !r.multi(),
		FSM:         r.fsm,
		Applied:     r.progress.get,
		Describe:    r.d.Describe,
		Admit:       r.AdmitMember,
		Logger:      r.log,
		Log:         r.d.Log,
	}
	// A tripwire: raft never cuts a committed entry, and only committed
	// entries are applied.
	co.Log.AppliedIndex, co.Log.OnFatal = r.progress.get, r.d.OnFatal
	if rf := r.d.Raft; rf != nil {
		co.Conn = rf.Conn
		co.Listen, co.Advertise, co.BootstrapExpect = rf.Listen, rf.Advertise, rf.BootstrapExpect
		// The election timeout is the operator's bound on a failover's
		// detection: raft's followers campaign after one to two heartbeat
		// timeouts without a leader, so that is half of it.
		co.HeartbeatTimeout, co.ElectionTimeout, co.LeaderLeaseTimeout = rf.ElectionTimeout/2, rf.ElectionTimeout/2, rf.ElectionTimeout/4
		co.SnapshotThreshold, co.TrailingLogs = rf.SnapshotThreshold, rf.TrailingLogs
		// Snapshots are checkpoints (cheap): take them often enough that
		// the log a node keeps for its followers stays small even when its
		// commands are large (bulk loads: up to a MiB each).
		if co.SnapshotThreshold == 0 {
			co.SnapshotThreshold = 4096
		}
		if co.TrailingLogs == 0 {
			co.TrailingLogs = 4096
		}
		co.SnapshotInterval = cmp.Or(rf.SnapshotInterval, 30*time.Second)
		co.Members = rf.Members
		co.HasData = r.hasData
		co.Removed = r.RemovedServer
		co.OnRefused = func(by, why string) {
			r.refused(fmt.Errorf("%w: %w: %s refuses this node (%s): %s; start it with an empty data directory: it comes back as a new member",
				api.ErrRemoved, cluster.ErrRemoved, by, cluster.ServerID(r.d.NodeID, r.d.Incarnation), why))
		}
		co.RecordRemoved = func(id raft.ServerID, why cluster.Removal) error {
			node, inc := cluster.SplitServerID(id)
			return r.ApplyCommand(&machine.Command{RemoveNode: &machine.RemoveNodeCmd{ID: machine.RemovalKey(node, inc), Why: byte(why)}})
		}
		// A single node's directory of a build before the log, upgraded
		// with its raft port: the cluster it was goes on as a group of it,
		// and grows as the others join.
		co.BootstrapAlone = migrated
		co.Number, co.Port, co.MemberApplied, co.FormWith = rf.Number, rf.Port, rf.MemberApplied, rf.FormWith
		if rf.Removed != nil {
			co.Removed, co.RecordRemoved = rf.Removed, nil
		}
	}
	g, err := cluster.Open(co)
	if err != nil {
		return false, err
	}
	r.group = g
	r.opened.Store(g)
	if r.removed.Load() != nil {
		g.Halt() // refused while it opened
	}
	if err := g.Fenced(); err != nil {
		r.refused(fmt.Errorf("%w: %w; start it with an empty data directory: it comes back as a new member", api.ErrRemoved, err))
	}
	if rec := g.Recovery(); rec != nil {
		// Writes the lost majority committed and shipped may be missing
		// here: the stream's next indexes could mean two writes. The first
		// term seals the stream the recovery left (term.go); a start after
		// that seal keeps the stream it began.
		if err := rec.SetStream(r.out.Stream().String()); err != nil {
			g.Close()
			return false, err
		}
	}
	if r.multi() {
		return false, nil // the first term mints the stream (term.go)
	}
	r.group = g
	if err := r.awaitLead(30 * time.Second); err != nil {
		r.group.Close()
		return false, err
	}
	if m.Stream().IsZero() || mint != "" {
		old := m.Stream()
		if err := r.ApplyCommand(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
			r.group.Close()
			return false, fmt.Errorf("node: start the stream: %w", err)
		}
		if mint != "" {
			r.log.Error("the stream lost entries; started a new stream (peers need a re-seed)",
				"why", mint, "old_stream", old, "new_stream", m.Stream())
		}
		created = true
	}
	// A node alone checks its stream's identity now (a cluster of several:
	// at its first term), and its term is ready once its log is applied
	// and its stream begun: from here it takes the path a leader of
	// several takes.
	if err := r.d.Identity(created); err != nil {
		r.group.Close()
		return false, err
	}
	r.lead.began = true
	// Its only term's links are made now and run from Run to Stop.
	links, err := r.d.BeginTerm()
	if err != nil {
		r.group.Close()
		return false, err
	}
	r.lead.links = links
	r.lead.ready.Store(true)
	r.RaiseFormat()
	return created, nil
}

// hasData reports that this node holds data, so that it never takes part
// in forming a new cluster (its data would fork from its old one).
func (r *Replica) hasData() bool {
	if r.progress.get() > 0 || !r.out.Stream().IsZero() {
		return true
	}
	empty, err := r.d.Store.Empty()
	return err != nil || !empty
}

// awaitLead waits up to wait for the group to elect this node and for every
// command in its log to be applied (a barrier): nothing is stamped before.
func (r *Replica) awaitLead(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for !r.group.IsLeader() {
		if time.Now().After(deadline) {
			return fmt.Errorf("node: the group of one did not elect itself in %s", wait)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := r.group.Barrier(wait); err != nil {
		return fmt.Errorf("node: apply the log: %w", err)
	}
	if err := r.fsm.Err(); err != nil {
		return fmt.Errorf("node: apply the log: %w", err)
	}
	return nil
}

// ApplyCommand commits a command of the node's own (not a write group) and
// applies it.
func (r *Replica) ApplyCommand(c *machine.Command) error {
	_, err := r.CommitCommand(c)
	return err
}

// CommitCommand commits a command and returns what the machine decided.
func (r *Replica) CommitCommand(c *machine.Command) (*machine.Result, error) {
	if f := r.d.CommandFault; f != nil && c.Kind() != machine.KindLocal && c.Kind() != machine.KindInbound {
		if err := f(c); err != nil {
			return nil, err
		}
	}
	r.identify(c)
	enc := encoders.Get().(*machine.Encoder)
	data, err := enc.Encode(c)
	encoders.Put(enc)
	if err != nil {
		return nil, err
	}
	if c.Kind() != machine.KindLocal && c.Kind() != machine.KindInbound {
		// The leader applies what it built, the followers what they decode:
		// a command the decoder would refuse must not enter the log (it
		// would stop every follower's machine). Local groups and inbound
		// batches are checked by the codecs that built them.
		if _, err := machine.Decode(data); err != nil {
			return nil, fmt.Errorf("node: a %s command this build would not read back: %w", c.Kind(), err)
		}
	}
	out, err := r.apply(data, c)
	if err != nil {
		return nil, fmt.Errorf("node: commit a %s command: %w", c.Kind(), err)
	}
	if e, ok := out.(error); ok {
		return nil, fmt.Errorf("node: apply a %s command: %w", c.Kind(), e)
	}
	res := out.(*machine.Result)
	if res.Skipped {
		return nil, fmt.Errorf("node: a %s command was skipped as applied", c.Kind())
	}
	return res, nil
}

// SetFromPeer records, through the log, the peer's own filter toward this
// cluster (acceptor.Log): relays of its writes are kept to it.
func (r *Replica) SetFromPeer(peer string, f entry.Filter, onward []entry.TargetSpans) error {
	if r.machine.Format() < machine.FormatOriginFilters {
		return nil // the acceptor does not ask before it (TakesOriginFilters)
	}
	_, err := r.CommitCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetFromPeer: true, Filter: f, Onward: onward}})
	return err
}

// SetOpenStreams records, through the log, the peer's open streams as its
// heartbeat told them (acceptor.Log): tombstone collection waits for the
// least advanced.
func (r *Replica) SetOpenStreams(peer string, open []entry.StreamID) error {
	if r.machine.Format() < machine.FormatOpenStreams {
		return nil // the acceptor does not ask before it (TakesOpenStreams)
	}
	_, err := r.CommitCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetOpen: true, Open: open}})
	return err
}

// UpdateReseed changes a peer's re-seed record through the log
// (acceptor.Log).
func (r *Replica) UpdateReseed(peer string, f func(byte) byte) (byte, error) {
	return r.UpdateRecord(peer, machine.RecordReseed, f)
}

// UpdateRecord changes a peer's re-seed request flags or this node's rejoin
// phase with it through the log (acceptor.Log); it returns what the record
// held before.
func (r *Replica) UpdateRecord(peer string, record byte, f func(byte) byte) (byte, error) {
	return machine.UpdateRecord(r.d.Store, r.CommitCommand, peer, record, f)
}

// encoders are the command encoders of inbound batches (many at once).
var encoders = sync.Pool{New: func() any { return machine.NewEncoder() }}

// ApplyInbound commits a batch the acceptor admitted through the group and
// returns what the machine decided (acceptor.Log). A failed commit is
// answered as a refusal the sender retries; the high-water mark makes a
// batch that did commit a duplicate then.
func (r *Replica) ApplyInbound(in *machine.Inbound, raw []byte) (*machine.InboundResult, error) {
	in.Raw = raw
	res, err := r.CommitCommand(&machine.Command{Inbound: in})
	if err != nil {
		return nil, err
	}
	return res.Inbound, nil
}

// onApplied follows the commands the FSM applied: the clock observes their
// stamps, and readers and waiters see the stream and the log advance.
func (r *Replica) onApplied(index uint64, res *machine.Result) {
	if !res.High.IsZero() {
		r.d.Clock.Observe(res.High)
	}
	r.applied.Store(r.out.Last())
	r.progress.set(index)
}

// onInstalled follows a snapshot's tree installed in place of the store's.
func (r *Replica) onInstalled(applied uint64) error {
	if err := r.restoreClock(); err != nil {
		return err
	}
	r.applied.Store(r.out.Last())
	r.progress.set(applied)
	return nil
}

// refused puts the node out of its cluster for good, as a member told it:
// no vote, append or apply from here on, and every read and write refused
// with err (api.ErrRemoved). The process stays up, failing /readyz, so that
// a supervisor does not restart it in a loop; the operator wipes it to
// bring it back as a new member (docs/OPERATIONS.md).
func (r *Replica) refused(err error) {
	if !r.removed.CompareAndSwap(nil, &err) {
		return
	}
	r.log.Error("this node was removed from its cluster: it refuses reads and writes, and stays up until it is stopped", "err", err)
	if r.fsm != nil {
		r.fsm.Break(err)
	}
	if g := r.opened.Load(); g != nil {
		g.Halt()
	}
}

// CheckRemoved puts the node out when the cluster's log, as this node
// applied it, records its own removal: a node removed while it runs may
// never be refused by a member (once it holds the configuration without
// itself, it asks nobody for a vote), and must not go on serving reads.
// It runs every second (Start).
func (r *Replica) CheckRemoved() {
	if r.removed.Load() != nil {
		return
	}
	id := r.group.ID()
	node, inc := cluster.SplitServerID(id)
	why, err := r.machine.Removed(machine.RemovalKey(node, inc))
	if err != nil || why == 0 {
		return
	}
	r.refused(fmt.Errorf("%w: %w: the cluster's log records this node (%s) as %s; start it with an empty data directory: it comes back as a new member",
		api.ErrRemoved, cluster.ErrRemoved, id, cluster.Removal(why)))
}

// commandsOf reads the command encoding a member's description says it
// reads (0: none said).
func commandsOf(description string) int {
	var d struct {
		Commands int `json:"commands"`
	}
	if json.Unmarshal([]byte(description), &d) != nil {
		return 0
	}
	return d.Commands
}

// RemovedServer says why a raft server may not be a member ("" when it
// may), from what the log recorded.
func (r *Replica) RemovedServer(id raft.ServerID) string {
	node, inc := cluster.SplitServerID(id)
	why, err := r.machine.Removed(machine.RemovalKey(node, inc))
	switch {
	case err != nil:
		return "its removal record could not be read: " + err.Error()
	case why == 0:
		return ""
	}
	return cluster.Removal(why).String()
}

// RemovedRecords lists the log's removal records, oldest ID first, each
// with why (for the cluster report).
func (r *Replica) RemovedRecords() []api.RemovedNode {
	recs, err := r.machine.RemovedAll()
	if errors.Is(err, store.ErrClosed) {
		return nil // the node stopped: its report says what it knew of itself
	}
	if err != nil {
		return []api.RemovedNode{{ID: "?", Why: "the removal records could not be read: " + err.Error()}}
	}
	out := make([]api.RemovedNode, 0, len(recs))
	for id, why := range recs {
		out = append(out, api.RemovedNode{ID: strings.TrimSuffix(id, "."), Why: cluster.Removal(why).String()})
	}
	slices.SortFunc(out, func(a, b api.RemovedNode) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// HasState reports raft state in the group directory of the data directory
// dir.
func HasState(dir string) bool { return cluster.HasState(groupDir(dir)) }

// Halt stops the replica for a reason a restart does not fix: every
// proposal is refused with err, the state machine applies nothing more and
// the group neither votes, appends nor applies.
func (r *Replica) Halt(err error) {
	r.com.Fail(err)
	if r.fsm != nil {
		r.fsm.Break(err)
	}
	if g := r.opened.Load(); g != nil {
		g.Halt()
	}
}

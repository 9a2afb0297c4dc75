package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/forward"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/legacywal"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/membership"
	"github.com/replicator/replicator/replica"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wal"
	"github.com/replicator/replicator/wire"
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

// consensus is the node's side of its raft group: it opens the group (and
// migrates an old directory into it), proposes commands and waits for them
// to apply, hands raft's FSM its callbacks, and raises the log's format
// once every node reads it.
type consensus struct {
	n *Node
	// removed is why the cluster keeps this node out (nil: it does not).
	removed atomic.Pointer[error]
	// opened is the group once cluster.Open returned it: a refusal can
	// come from the raft port during the open itself (on another
	// goroutine), before n.group is set.
	opened atomic.Pointer[cluster.Group]
	// formatMu is held by raiseFormat and by each admission of a member
	// until it is in the configuration.
	formatMu sync.Mutex
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

// readsFormat is the newest command encoding this node reads.
func (cs *consensus) readsFormat() int {
	n := cs.n
	if f := n.opts.Testing.ReadsFormat; f > 0 {
		return f
	}
	return machine.ReadsFormat
}

// admitMember lets a node join only if it reads the commands the log carries
// now (cluster.Options.Admit): once the log went to encoding 2, a build
// before it would stop at its first command. A build that describes
// nothing is before it. The admission holds formatMu until the group
// released it (the node is in the configuration, or adding it failed), so
// raiseFormat, which holds it too, never checks the members while one it
// does not see yet is being added.
func (cs *consensus) admitMember(description string) (release func(), err error) {
	cs.formatMu.Lock()
	if err := cs.admissible(description); err != nil {
		cs.formatMu.Unlock()
		return nil, err
	}
	return cs.formatMu.Unlock, nil
}

// admissible reports whether a node that describes itself so reads the
// log's commands.
func (cs *consensus) admissible(description string) error {
	n := cs.n
	f := n.machine.Format()
	if f <= 1 {
		return nil
	}
	var d forward.Described
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

// raiseFormat moves the log to the newest command encoding once every
// member of the configuration reads it (after a rolling upgrade, the first
// term of a new cluster, or at once for a node alone): one Format command,
// after which proposals carry their IDs. Only the leader proposes it.
func (cs *consensus) raiseFormat() {
	n := cs.n
	want := cs.readsFormat()
	if n.machine.Format() >= want || !n.group.IsLeader() || !n.lead.ready.Load() {
		return
	}
	// From the check of every member to the Format command's commit, no
	// node is added (admitMember): one added in between might not read it.
	cs.formatMu.Lock()
	defer cs.formatMu.Unlock()
	if n.multi() {
		for _, sv := range n.group.Status().Servers {
			id := cluster.ServerID(sv.ID, sv.Incarnation)
			if id == n.group.ID() {
				continue
			}
			if d, state := n.svc.Proven(id, false); state == forward.DescKnown && d.Commands >= want {
				continue
			}
			// Not known to read it (yet): asked afresh, since the member
			// may have restarted on a new build at the same address.
			s, err := n.group.DescribeAgain(id, time.Second)
			var d forward.Described
			if err != nil || s == "" || json.Unmarshal([]byte(s), &d) != nil || d.Commands < want {
				return // asked again at the next round
			}
		}
	}
	if err := cs.applyCommand(&machine.Command{Format: &machine.FormatCmd{Version: uint8(want)}}); err != nil {
		n.log.Warn("could not move the log to the newest command encoding; trying again later", "format", want, "err", err)
		return
	}
	n.log.Info("the log's commands now carry proposal IDs: every member reads encoding "+fmt.Sprint(want), "format", want)
}

// identify gives c a proposal ID once the log says every node reads
// commands that carry one (machine.Format).
func (cs *consensus) identify(c *machine.Command) {
	n := cs.n
	if n.machine.Format() >= 2 {
		c.ID = n.proposer.Next()
	}
}

// apply commits data, the encoding of c, and returns what the state
// machine returned. A group of one steps down after a failed append (a full
// disk) and elects itself again a moment later: a command refused for want
// of a leader never entered the log, so it is sent again once this node
// leads.
func (cs *consensus) apply(data []byte, c *machine.Command) (any, error) {
	n := cs.n
	n.proposed.add(c)
	defer n.proposed.remove(c)
	t0 := time.Now()
	out, err := n.group.Apply(data, replica.EnqueueTimeout)
	if err == nil && n.metrics.commitSeconds != nil {
		n.metrics.commitSeconds.Observe(time.Since(t0).Seconds())
	}
	if n.multi() {
		return out, err // another node leads: the caller hears so
	}
	for try := 0; try < 3 && errors.As(err, new(*cluster.NotLeaderError)); try++ {
		if cs.awaitLead(time.Second) != nil {
			break
		}
		out, err = n.group.Apply(data, replica.EnqueueTimeout)
	}
	return out, err
}

// sealFile, after a recovery from the loss of a majority by a build before
// the recovery's record (cluster.RecoveryFile), names the stream the next
// term seals.
func (cs *consensus) sealFile() string { return filepath.Join(cs.groupDir(), "SEAL") }

// groupDir holds the raft log, its stable state and snapshots.
func (cs *consensus) groupDir() string { return filepath.Join(cs.n.opts.DataDir, "cluster") }

// openGroup opens the machine, squares it with the raft directory, starts
// the group, and waits until the node leads and has applied its whole log.
// It reports whether the stream is new (minted now).
func (cs *consensus) openGroup() (created bool, err error) {
	n := cs.n
	if err := machine.FinishRestore(cs.groupDir(), n.store, n.log); err != nil {
		return false, err
	}
	m, err := machine.Open(n.store, machine.Options{Cluster: n.cluster, Logger: n.log, ReadsFormat: n.opts.Testing.ReadsFormat})
	if err != nil {
		return false, err
	}
	migrated, err := cs.migrateWAL(m)
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
		if m, err = machine.Open(n.store, machine.Options{Cluster: n.cluster, Logger: n.log, ReadsFormat: n.opts.Testing.ReadsFormat}); err != nil {
			return false, err
		}
	}
	n.machine, n.out = m, m.Outbound()
	n.fsm = machine.NewFSM(machine.Deps{
		Machine: m, Store: n.store, Dir: cs.groupDir(), Trees: n.multi(), Logger: n.log,
		Proposed:  n.proposed.get,
		Applied:   cs.onApplied,
		Broken:    n.com.Fail,
		Restoring: n.restoring.Store,
		Installed: cs.onInstalled,
	})
	mint, err := cs.reconcileLog(m)
	if err != nil {
		return false, err
	}
	if mint == "" {
		mint = lostWAL
	}
	n.machine, n.out = m, m.Outbound()
	n.applied.Store(n.out.Last())
	n.progress.set(m.Applied())
	if n.multi() && mint != "" {
		return false, fmt.Errorf("node: %s; a node of a cluster of several never begins a stream of its own: "+
			"set this data directory aside and start the node with an empty one (it comes back as a new incarnation and catches up from the leader)", mint)
	}
	co := &cluster.Options{
		Cluster:     n.cluster,
		Node:        n.nodeID,
		Incarnation: n.incarnation,
		Dir:         cs.groupDir(),
		Solo:        !n.multi(),
		FSM:         n.fsm,
		Applied:     n.progress.get,
		Describe:    n.svc.DescribeSelf,
		Admit:       cs.admitMember,
		Logger:      n.log,
		Log: wal.Options{
			SegmentSize: n.opts.WALSegmentSize,
			NoSync:      n.opts.UnsafeNoSync,
			BeforeWrite: n.opts.Testing.diskFull(),
			// A tripwire: raft never cuts a committed entry, and only
			// committed entries are applied.
			AppliedIndex: n.progress.get,
			OnFatal:      n.stopFatal,
		},
	}
	if r := n.opts.Raft; r != nil {
		if co.Conn, err = cs.raftConn(); err != nil {
			return false, err
		}
		co.Listen, co.Advertise, co.BootstrapExpect = r.Listen, r.Advertise, r.BootstrapExpect
		// The election timeout is the operator's bound on a failover's
		// detection: raft's followers campaign after one to two heartbeat
		// timeouts without a leader, so that is half of it.
		co.HeartbeatTimeout, co.ElectionTimeout, co.LeaderLeaseTimeout = r.ElectionTimeout/2, r.ElectionTimeout/2, r.ElectionTimeout/4
		co.SnapshotThreshold, co.TrailingLogs = r.SnapshotThreshold, r.TrailingLogs
		// Snapshots are checkpoints (cheap): take them often enough that
		// the log a node keeps for its followers stays small even when its
		// commands are large (bulk loads: up to a MiB each).
		if co.SnapshotThreshold == 0 {
			co.SnapshotThreshold = 4096
		}
		if co.TrailingLogs == 0 {
			co.TrailingLogs = 4096
		}
		co.SnapshotInterval = 30 * time.Second
		gm := &membership.GroupMembers{Gossip: n.gossip, NodeID: n.nodeID, Incarnation: n.incarnation}
		co.Members = gm
		defer func() {
			if n.group != nil {
				gm.Attach(n.group)
			}
		}()
		co.HasData = cs.hasData
		co.Removed = cs.removedServer
		co.OnRefused = func(by, why string) {
			cs.refused(fmt.Errorf("%w: %w: %s refuses this node (%s): %s; start it with an empty data directory: it comes back as a new member",
				api.ErrRemoved, cluster.ErrRemoved, by, cluster.ServerID(n.nodeID, n.incarnation), why))
		}
		co.RecordRemoved = func(id raft.ServerID, why cluster.Removal) error {
			node, inc := cluster.SplitServerID(id)
			return cs.applyCommand(&machine.Command{RemoveNode: &machine.RemoveNodeCmd{ID: machine.RemovalKey(node, inc), Why: byte(why)}})
		}
		// A single node's directory of a build before the log, upgraded
		// with its raft port: the cluster it was goes on as a group of it,
		// and grows as the others join.
		co.BootstrapAlone = migrated
	}
	g, err := cluster.Open(co)
	if err != nil {
		return false, err
	}
	n.group = g
	cs.opened.Store(g)
	if cs.removed.Load() != nil {
		g.Halt() // refused while it opened
	}
	if err := g.Fenced(); err != nil {
		cs.refused(fmt.Errorf("%w: %w; start it with an empty data directory: it comes back as a new member", api.ErrRemoved, err))
	}
	if rec := g.Recovery(); rec != nil {
		// Writes the lost majority committed and shipped may be missing
		// here: the stream's next indexes could mean two writes. The first
		// term seals the stream the recovery left (term.go); a start after
		// that seal keeps the stream it began.
		if err := rec.SetStream(n.out.Stream().String()); err != nil {
			g.Close()
			return false, err
		}
	}
	if n.multi() {
		return false, nil // the first term mints the stream (term.go)
	}
	n.group = g
	if err := cs.awaitLead(30 * time.Second); err != nil {
		n.group.Close()
		return false, err
	}
	if m.Stream().IsZero() || mint != "" {
		old := m.Stream()
		if err := cs.applyCommand(&machine.Command{Mint: &machine.MintCmd{Stream: entry.NewStreamID()}}); err != nil {
			n.group.Close()
			return false, fmt.Errorf("node: start the stream: %w", err)
		}
		if mint != "" {
			n.log.Error("the stream lost entries; started a new stream (peers need a re-seed)",
				"why", mint, "old_stream", old, "new_stream", m.Stream())
		}
		created = true
	}
	// A node alone's term is ready once its log is applied and its stream
	// begun: from here it takes the path a leader of several takes.
	n.lead.ready.Store(true)
	cs.raiseFormat()
	return created, nil
}

// hasData reports that this node holds data, so that it never takes part
// in forming a new cluster (its data would fork from its old one).
func (cs *consensus) hasData() bool {
	n := cs.n
	if n.progress.get() > 0 || !n.out.Stream().IsZero() {
		return true
	}
	empty, err := n.store.Empty()
	return err != nil || !empty
}

// awaitLead waits up to wait for the group to elect this node and for every
// command in its log to be applied (a barrier): nothing is stamped before.
func (cs *consensus) awaitLead(wait time.Duration) error {
	n := cs.n
	deadline := time.Now().Add(wait)
	for !n.group.IsLeader() {
		if time.Now().After(deadline) {
			return fmt.Errorf("node: the group of one did not elect itself in %s", wait)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := n.group.Barrier(wait); err != nil {
		return fmt.Errorf("node: apply the log: %w", err)
	}
	if err := n.fsm.Err(); err != nil {
		return fmt.Errorf("node: apply the log: %w", err)
	}
	return nil
}

// applyCommand commits a command of the node's own (not a write group) and
// applies it.
func (cs *consensus) applyCommand(c *machine.Command) error {
	_, err := cs.commitCommand(c)
	return err
}

// commitCommand commits a command and returns what the machine decided.
func (cs *consensus) commitCommand(c *machine.Command) (*machine.Result, error) {
	if f := cs.n.opts.Testing.CommandFault; f != nil && c.Kind() != machine.KindLocal && c.Kind() != machine.KindInbound {
		if err := f(c); err != nil {
			return nil, err
		}
	}
	cs.identify(c)
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
	out, err := cs.apply(data, c)
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
func (cs *consensus) SetFromPeer(peer string, f entry.Filter, onward []entry.TargetSpans) error {
	n := cs.n
	if n.machine.Format() < machine.FormatOriginFilters {
		return nil // the acceptor does not ask before it (TakesOriginFilters)
	}
	_, err := cs.commitCommand(&machine.Command{Link: &machine.LinkCmd{Peer: peer, SetFromPeer: true, Filter: f, Onward: onward}})
	return err
}

// UpdateReseed changes a peer's re-seed record through the log
// (acceptor.Log).
func (cs *consensus) UpdateReseed(peer string, f func(byte) byte) (byte, error) {
	return cs.UpdateRecord(peer, machine.RecordReseed, f)
}

// UpdateRecord changes a peer's re-seed request flags or this node's rejoin
// phase with it through the log (acceptor.Log); it returns what the record
// held before.
func (cs *consensus) UpdateRecord(peer string, record byte, f func(byte) byte) (byte, error) {
	n := cs.n
	return machine.UpdateRecord(n.store, cs.commitCommand, peer, record, f)
}

// encoders are the command encoders of inbound batches (many at once).
var encoders = sync.Pool{New: func() any { return machine.NewEncoder() }}

// ApplyInbound commits a batch the acceptor admitted through the group and
// returns what the machine decided (acceptor.Log). A failed commit is
// answered as a refusal the sender retries; the high-water mark makes a
// batch that did commit a duplicate then.
func (cs *consensus) ApplyInbound(in *machine.Inbound, raw []byte) (*machine.InboundResult, error) {
	in.Raw = raw
	res, err := cs.commitCommand(&machine.Command{Inbound: in})
	if err != nil {
		return nil, err
	}
	return res.Inbound, nil
}

// reconcileLog squares the machine's applied index with the raft directory
// before raft starts, since raft applies from its newest snapshot onward
// and numbers new commands after its last one:
//
//   - the tree lacks commands up to the snapshot (the store directory
//     restored alone from an older backup) that the log still holds: they
//     are committed, so the machine applies them from the log first;
//   - the log lost commands the tree applied (a raft directory damaged,
//     wiped, or older than the tree; a torn append never does this, since
//     the tree applies a command only after its append is synced): the tree
//     holds what it applied, but the tree's commits are not synced, so a
//     crash may have taken later commands from both after their entries
//     were shipped; their indexes must not mean other writes: the directory
//     is set aside and a new stream is minted (the returned reason), as
//     the WAL before the log did;
//   - the tree lacks commands the log no longer holds: the same, for the
//     same reason.
func (cs *consensus) reconcileLog(m *machine.Machine) (mint string, err error) {
	n := cs.n
	ls, err := cluster.Inspect(cs.groupDir(), n.log)
	if err != nil {
		return "", err
	}
	// What this node may have acknowledged before it stopped is in its log:
	// local reads wait until it applied that much (readable).
	applied := m.Applied()
	n.reads.startLast = max(ls.LastCommand, applied)
	// The snapshot's index counts raft's own entries too; what the tree
	// must hold is the last command the machine had applied when it was
	// taken, which the snapshot records.
	var snap machine.SnapshotHead
	if ls.Snapshot > 0 {
		if snap, err = machine.DecodeSnapshotHead(ls.SnapshotHead); err != nil {
			return "", fmt.Errorf("node: the raft directory's snapshot at %d: %w", ls.Snapshot, err)
		}
	}
	// The log's own commands up to the snapshot are the committed ones only
	// when its entry at the snapshot's index has the snapshot's term (a
	// snapshot installed from the leader, the node stopped before its tree
	// was: the tail may be a deposed leader's, never committed).
	logMatches := ls.LogTermAtSnapshot != 0 && ls.LogTermAtSnapshot == ls.SnapshotTerm
	if applied < snap.Applied && ls.First > 0 && ls.First <= applied+1 && logMatches {
		err := cluster.ReadLog(cs.groupDir(), applied+1, ls.Snapshot, n.log, func(i uint64, data []byte) error {
			res, err := m.Apply(i, data)
			if err == nil && !res.High.IsZero() {
				n.clock.Observe(res.High)
			}
			return err
		})
		if err != nil {
			return "", fmt.Errorf("node: apply the log's committed commands the store lacks: %w", err)
		}
		n.log.Warn("the store lacked committed commands the log holds: applied them", "from", applied+1, "to", ls.Snapshot)
		applied = m.Applied()
	}
	if applied < snap.Applied && n.multi() && snap.Tree && ls.SnapshotTree != "" {
		// A node of several keeps the tree in its snapshot: the store
		// restored alone from an older backup takes it back.
		if err := n.fsm.InstallTree(ls.SnapshotTree, snap.Applied); err != nil {
			return "", err
		}
		applied = m.Applied()
	}
	var why string
	switch {
	case applied < snap.Applied:
		why = fmt.Sprintf("the store applied the log up to %d, its snapshot holds up to %d", applied, snap.Applied)
		mint = why
	case applied > max(ls.Last, ls.Snapshot):
		why = fmt.Sprintf("the log ends at %d, the store applied up to %d", max(ls.Last, ls.Snapshot), applied)
		mint = why
	default:
		return "", nil
	}
	if n.multi() {
		// A voter never sets its raft directory aside (its term and vote
		// are in it) nor forgets its log: the start is refused, and stays
		// refused, with both as they are.
		return mint, nil
	}
	if ls.Existing {
		aside := fmt.Sprintf("%s.lost-%d", cs.groupDir(), time.Now().UnixNano())
		if err := os.Rename(cs.groupDir(), aside); err != nil {
			return "", fmt.Errorf("node: set the raft directory aside: %w", err)
		}
		n.log.Warn("raft directory set aside", "why", why, "kept_at", aside)
	}
	return mint, m.ForgetLog()
}

// migrateWAL moves a data directory of a build before the cluster's log
// into it, in place: the WAL's entries the store has not applied are applied,
// its retained entries become the stream's outbound entries in the tree, and
// the stream is kept. The WAL is kept as wal.migrated-<stream> for the
// operator to remove. It reports whether there was a WAL to migrate.
func (cs *consensus) migrateWAL(m *machine.Machine) (bool, error) {
	n := cs.n
	dir := filepath.Join(n.opts.DataDir, "wal")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if m.Applied() > 0 {
		return false, fmt.Errorf("node: %s exists beside the cluster's log: set it aside, or remove it if it was migrated", dir)
	}
	l, err := legacywal.Open(dir, &legacywal.Options{Origin: n.cluster, Logger: n.log})
	if errors.Is(err, legacywal.ErrEmpty) {
		// A WAL its build never began: nothing to migrate (a tree with a
		// stream and no WAL begins a new stream, as that build did).
		aside := fmt.Sprintf("%s.empty-%d", dir, time.Now().UnixNano())
		n.log.Warn("the WAL directory holds no stream: set aside", "kept_at", aside)
		return false, os.Rename(dir, aside)
	}
	if err != nil {
		return false, err
	}
	stream, first, last := l.Stream(), l.First(), l.Last()
	err = cs.migrateEntries(l)
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("node: migrate the WAL: %w", err)
	}
	// Marked before the WAL goes aside: a start that then finds no WAL and
	// no mark would take the tree for one whose WAL was lost, and begin a
	// new stream. (A crash before the mark migrates again, which changes
	// nothing: the store's applied index skips what was applied.)
	if err := m.ForgetLog(); err != nil {
		return false, fmt.Errorf("node: migrate the WAL: %w", err)
	}
	aside := fmt.Sprintf("%s.migrated-%s", dir, stream)
	if err := os.Rename(dir, aside); err != nil {
		return false, fmt.Errorf("node: set the migrated WAL aside: %w", err)
	}
	n.log.Info("migrated the WAL into the cluster's log; the stream goes on", "stream", stream,
		"entries", last+1-first, "last_index", last, "kept_at", aside)
	return true, nil
}

// migrateEntries applies what the store lacks of the WAL and copies its
// retained entries into the tree, synced, with the stream and its end.
func (cs *consensus) migrateEntries(l *legacywal.Log) error {
	n := cs.n
	ap, err := n.store.LocalApplied()
	if err != nil {
		return err
	}
	stream, first, last := l.Stream(), l.First(), l.Last()
	if ap.Stream == stream && ap.Index > last {
		// The WAL lost entries the store applied (the case a new stream
		// answered before the log): the stream cannot go on.
		return fmt.Errorf("the WAL holds [%d, %d] but the store applied up to %d; set the WAL aside to start a new stream", first, last, ap.Index)
	}
	from := ap.Index + 1
	if ap.Stream != stream {
		from = first
	}
	if from < first && from <= last {
		return fmt.Errorf("the store applied up to %d, the WAL holds [%d, %d]; set the WAL aside to start a new stream", ap.Index, first, last)
	}
	codec := wire.NewCodec()
	var commit hlc.Timestamp
	for i := first; i <= last; {
		b := n.store.NewBatch()
		to := min(last, i+1023)
		for ; i <= to; i++ {
			raw, err := l.ReadRaw(i)
			if err != nil {
				b.Close()
				return err
			}
			e, err := codec.DecodeEntry(raw, l.Defaults())
			if err != nil {
				b.Close()
				return err
			}
			commit = e.Commit
			n.clock.Observe(e.Commit)
			if i >= from {
				if _, err := b.ApplyEntry(&e); err != nil {
					b.Close()
					return fmt.Errorf("entry %d: %w", i, err)
				}
			}
			if err := b.PutOutbound(stream, i, raw); err != nil {
				b.Close()
				return err
			}
		}
		err := errors.Join(b.RaiseHLC(n.clock.Last()), b.Commit(true))
		b.Close()
		if err != nil {
			return err
		}
	}
	if first > last && ap.Stream == stream {
		// every entry was shipped and cut: the store knows the last commit
		commit = ap.Commit
	}
	b := n.store.NewBatch()
	defer b.Close()
	return errors.Join(b.SetLocalApplied(store.AppliedIndex{Stream: stream, Index: last, Commit: commit}), b.Commit(true))
}

// onApplied follows the commands the FSM applied: the clock observes their
// stamps, and readers and waiters see the stream and the log advance.
func (cs *consensus) onApplied(index uint64, res *machine.Result) {
	n := cs.n
	if !res.High.IsZero() {
		n.clock.Observe(res.High)
	}
	n.applied.Store(n.out.Last())
	n.progress.set(index)
}

// onInstalled follows a snapshot's tree installed in place of the store's.
func (cs *consensus) onInstalled(applied uint64) error {
	n := cs.n
	if err := n.restoreClock(); err != nil {
		return err
	}
	n.applied.Store(n.out.Last())
	n.progress.set(applied)
	return nil
}

// refused puts the node out of its cluster for good, as a member told it:
// no vote, append or apply from here on, and every read and write refused
// with err (api.ErrRemoved). The process stays up, failing /readyz, so that
// a supervisor does not restart it in a loop; the operator wipes it to
// bring it back as a new member (docs/OPERATIONS.md).
func (cs *consensus) refused(err error) {
	if !cs.removed.CompareAndSwap(nil, &err) {
		return
	}
	n := cs.n
	n.log.Error("this node was removed from its cluster: it refuses reads and writes, and stays up until it is stopped", "err", err)
	if n.fsm != nil {
		n.fsm.Break(err)
	}
	if g := cs.opened.Load(); g != nil {
		g.Halt()
	}
}

// checkRemoved puts the node out when the cluster's log, as this node
// applied it, records its own removal: a node removed while it runs may
// never be refused by a member (once it holds the configuration without
// itself, it asks nobody for a vote), and must not go on serving reads.
// It runs every second (Start).
func (cs *consensus) checkRemoved() {
	n := cs.n
	if cs.removed.Load() != nil {
		return
	}
	id := n.group.ID()
	node, inc := cluster.SplitServerID(id)
	why, err := n.machine.Removed(machine.RemovalKey(node, inc))
	if err != nil || why == 0 {
		return
	}
	cs.refused(fmt.Errorf("%w: %w: the cluster's log records this node (%s) as %s; start it with an empty data directory: it comes back as a new member",
		api.ErrRemoved, cluster.ErrRemoved, id, cluster.Removal(why)))
}

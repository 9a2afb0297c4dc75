// Package machine is a cluster's state machine: every mutation of a
// cluster's state is a command of its replicated log, and Apply turns one
// command into one Pebble batch, with nothing else read than the tree and
// nothing else written than the batch (no clock, no network, no files). Every
// node of a cluster applies the same commands in the same order to the same
// state, so each decides the same: conditions, idempotency and counters are
// decided here, never twice across a leader change (docs/CLUSTER.md).
//
// Each batch records the log index it applies, and a command at or below the
// recorded index is skipped: replaying the log after a crash changes
// nothing. A local write's outbound entry, with its dense index in the
// cluster's stream, is written in the same batch under a prefix of its own;
// shippers read the stream back through Outbound.
package machine

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

var (
	// ErrNoStream refuses local writes before the cluster's stream is
	// minted: nothing is written.
	ErrNoStream = errors.New("machine: the cluster has no stream yet")
	// ErrStaleStamp refuses a write stamped at or below the stream's last
	// commit (a deposed leader's proposal): commit HLCs must grow with
	// stream indexes. Nothing is written; the caller may retry.
	ErrStaleStamp = errors.New("machine: stamped below the stream's last commit")
	// ErrFirstRefused answers a retry in the same group whose first attempt
	// was refused.
	ErrFirstRefused = errors.New("machine: the first attempt under the key was refused")
)

// Options configure a machine.
type Options struct {
	// Cluster is this cluster's ID: the origin of every local write.
	Cluster string
	// Logger receives what the machine notices (planted idempotency
	// records); nil discards.
	Logger *slog.Logger
	// ReadsFormat, when 1, makes the machine read the log as a build before
	// command encoding 2 did: it refuses a command of encoding 2 and a
	// Format command. Tests of a mixed-version cluster play such a build
	// with it; 0 reads everything this build reads.
	ReadsFormat int
}

// Machine applies a cluster's commands to its tree. Apply is called from
// one goroutine at a time (raft's FSM goroutine, or a group of one's
// committer); the accessors are safe from any.
type Machine struct {
	st      *store.Store
	cluster string
	log     *slog.Logger
	codec   *wire.Codec
	// lastRaw is the size of the last group's encodings (writeLocal sizes
	// the next one's buffer by it).
	lastRaw int
	out     *Outbound
	// logged: the tree has applied commands of a log (or forgot one); a
	// tree without it was written by a build before the log.
	logged bool

	// Changed only by Apply.
	applied    uint64
	stream     entry.StreamID
	last       uint64        // the last index of the stream
	lastCommit hlc.Timestamp // its commit HLC
	// epoch is the stream's counter epoch (read by the node too).
	epoch atomic.Uint32
	// format is the command encoding the log says every node reads (read
	// by proposers).
	format atomic.Uint32
	// readsFormat is Options.ReadsFormat.
	readsFormat int
	// links is what the log says of every link (replaced whole on change).
	links atomic.Pointer[map[string]entry.LinkSettings]
	// slots is the cluster's slot map (nil: one group; groups.go).
	slots atomic.Pointer[slot.Map]
}

// Open reads the machine's state from st. st must stay open while the
// machine is used.
func Open(st *store.Store, opts Options) (*Machine, error) {
	if opts.Cluster == "" {
		return nil, errors.New("machine: open: no cluster ID")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Machine{st: st, cluster: opts.Cluster, log: opts.Logger, codec: wire.NewCodec(), readsFormat: opts.ReadsFormat}
	if err := m.load(); err != nil {
		return nil, err
	}
	return m, nil
}

// load reads the machine's state from the tree.
func (m *Machine) load() error {
	st := m.st
	var err error
	if m.applied, m.logged, err = st.MachineApplied(); err != nil {
		return fmt.Errorf("machine: open: %w", err)
	}
	a, err := st.LocalApplied()
	if err != nil {
		return fmt.Errorf("machine: open: %w", err)
	}
	m.stream, m.last, m.lastCommit = a.Stream, a.Index, a.Commit
	f, err := st.CommandFormat()
	switch {
	case err != nil:
		return fmt.Errorf("machine: open: %w", err)
	case f == 0:
		m.format.Store(commandV1)
	case f < commandV2 || f > ReadsFormat:
		return fmt.Errorf("machine: open: %w: the log carries command encoding %d (this build reads up to %d)", store.ErrCorrupt, f, ReadsFormat)
	default:
		m.format.Store(uint32(f))
	}
	m.epoch.Store(0)
	if !m.stream.IsZero() {
		epoch, err := st.CounterEpoch(m.stream)
		if err != nil {
			return fmt.Errorf("machine: open: %w", err)
		}
		m.epoch.Store(epoch)
	}
	if err := m.loadLinks(); err != nil {
		return err
	}
	if err := m.loadSlots(); err != nil {
		return err
	}
	if m.out == nil {
		m.out, err = openOutbound(st, m.stream, m.last)
		return err
	}
	return m.out.load(m.stream, m.last)
}

// Reload reads the machine's state again after the tree was replaced (a
// snapshot installed): the outbound view is the same object, reloaded.
// Not for use while commands are being applied.
func (m *Machine) Reload() error { return m.load() }

// Applied is the last log index applied.
func (m *Machine) Applied() uint64 { return m.applied }

// Stream is the cluster's stream (zero before one is minted).
func (m *Machine) Stream() entry.StreamID { return m.out.Stream() }

// Logged reports whether the tree was ever written through a log (false: a
// new tree, or one a build before the log wrote).
func (m *Machine) Logged() bool { return m.logged }

// Format is the command encoding the log says every node reads: a
// proposer writes commands of it (1: no proposal IDs).
func (m *Machine) Format() int { return int(m.format.Load()) }

// Epoch is the stream's counter epoch (entry.Component).
func (m *Machine) Epoch() uint32 { return m.epoch.Load() }

// ForgetLog records that the log the applied index counted in is gone (a
// raft directory lost or set aside): the next log starts again from index
// 1, and its commands must apply. The tree, the stream and its entries stay.
// Not for use while commands are being applied.
func (m *Machine) ForgetLog() error {
	if err := m.st.ForgetMachineLog(); err != nil {
		return fmt.Errorf("machine: %w", err)
	}
	m.applied, m.logged = 0, true
	return nil
}

// Outbound is the cluster's outbound log, for shippers.
func (m *Machine) Outbound() *Outbound { return m.out }

// Result is what applying a command decided.
type Result struct {
	// Skipped: the command was at or below the applied index and changed
	// nothing (a replay).
	Skipped bool
	// Writes answers a local group, one per proposal in its order.
	Writes []Write
	// High is the highest stamp the command wrote: a node observes it so
	// that, leading later, it stamps above.
	High hlc.Timestamp
	// Inbound answers an inbound batch.
	Inbound *InboundResult
	// Swapped: a record command found what it expected and set it.
	Swapped bool
	// Collected, CollectedIdem and CollectedConflicts count what a collect
	// command dropped.
	Collected, CollectedIdem, CollectedConflicts int
	// Kept counts, per link, what a collection left below its cutoff
	// because the link's filter held the deletes back (CollectCmd.Keep).
	Kept map[string]KeptCount
	// Found: a dead-letter command found its dead letter.
	Found bool
	// Repair answers a repair command.
	Repair *RepairResult
}

// Write is what became of one proposal.
type Write struct {
	// Err is the refusal (ErrPrecondition, ErrKindConflict,
	// ErrCounterRange, ErrIdempotencyConflict, ErrStaleStamp, ErrNoStream,
	// ErrFirstRefused): nothing was written for it.
	Err error
	// Replay is the recorded answer of an earlier request under the same
	// key: nothing was written for it.
	Replay *store.IdemRecord
	// Entry is the write as applied: origin, stream, index, stamps, a
	// counter's totals and the idempotency record filled in.
	Entry entry.Entry
	// Outcome is what the write did to the tree.
	Outcome entry.Outcome
	// CounterValue is an increment's counter here once it applied.
	CounterValue int64
	// Existed is, for a delete or a batch, how many of the keys it deletes
	// held a live value just before it, in commit order (RESP's DEL count).
	// A delete of keys that hold no value writes nothing: Entry then has
	// no index.
	Existed int
}

// Apply applies the command at log index. An error is a failure of the
// tree (a read or the batch's commit): nothing of the command was applied,
// and the caller must stop applying, since the next command assumes this one.
func (m *Machine) Apply(index uint64, data []byte) (*Result, error) {
	if index <= m.applied {
		return &Result{Skipped: true}, nil
	}
	c, err := Decode(data)
	if err == nil && m.readsFormat == commandV1 && (data[0] != commandV1 || c.Format != nil) {
		err = fmt.Errorf("%w: version %d or kind %s (this build plays one that reads version 1 only)", ErrMalformed, data[0], c.Kind())
	}
	if err == nil && m.readsFormat == commandV2 && (c.Link != nil || (c.Format != nil && c.Format.Version > commandV2)) {
		err = fmt.Errorf("%w: kind %s (this build plays one that reads format 2 at most)", ErrMalformed, c.Kind())
	}
	if err == nil && m.readsFormat == FormatLinks && c.Format != nil && c.Format.Version > FormatLinks {
		err = fmt.Errorf("%w: format %d (this build plays one that reads format 3 at most)", ErrMalformed, c.Format.Version)
	}
	if err == nil && m.readsFormat == FormatConflicts && (c.Repair != nil || (c.Format != nil && c.Format.Version > FormatConflicts)) {
		err = fmt.Errorf("%w: kind %s (this build plays one that reads format 4 at most)", ErrMalformed, c.Kind())
	}
	if err == nil && m.readsFormat == FormatRepair && c.Format != nil && c.Format.Version > FormatRepair {
		err = fmt.Errorf("%w: format %d (this build plays one that reads format 5 at most)", ErrMalformed, c.Format.Version)
	}
	if err == nil && m.readsFormat >= FormatRejoinHorizon && c.Format != nil && int(c.Format.Version) > m.readsFormat {
		err = fmt.Errorf("%w: format %d (this build plays one that reads format %d at most)", ErrMalformed, c.Format.Version, m.readsFormat)
	}
	if err != nil {
		return nil, fmt.Errorf("machine: apply %d: %w", index, err)
	}
	return m.ApplyCommand(index, &c)
}

// ApplyCommand is Apply of a decoded command.
func (m *Machine) ApplyCommand(index uint64, c *Command) (*Result, error) {
	if index <= m.applied {
		return &Result{Skipped: true}, nil
	}
	var (
		res  *Result
		next func()
		err  error
		dec  *decided
	)
	kind := c.Kind()
	if kind == KindLocal {
		// Decisions read the tree before the batch takes the store's apply
		// lock (reads of range tombstones take it too).
		if dec, err = m.decideLocal(c.Local); err != nil {
			return nil, fmt.Errorf("machine: apply %d (%s): %w", index, kind, err)
		}
	}
	b := m.st.NewBatch()
	defer func() { b.Close() }()
	b.LegacyRangePieces = m.format.Load() < FormatRangePieces
	if m.format.Load() >= FormatConflicts {
		// Versions carry contexts: every merge reads what its key holds
		// and moves its conflict records along (an inbound batch also
		// judges what it discards, applyInbound).
		j := &conflictJudge{b: b, local: true, ownLine: m.format.Load() >= FormatConflictClaims,
			aliases: m.format.Load() >= FormatConflictAliases}
		b.Track(j.judge)
	}
	switch kind {
	case KindLocal:
		res, next, err = m.writeLocal(b, dec)
	case KindCursor:
		res, err = &Result{}, m.applyCursor(b, c.Cursor.Peer, c.Cursor.At)
	case KindTruncate:
		res, next, err = m.applyTruncate(b, c.Truncate.Stream, c.Truncate.First)
	case KindMint:
		res, next, err = m.applyMint(b, c.Mint.Stream, c.Mint.Epoch)
	case KindRecord:
		res = &Result{}
		res.Swapped, err = m.applyRecord(b, c.Record)
	case KindCollect:
		res, err = m.applyCollect(b, c.Collect)
	case KindDeadLetter:
		res, err = m.applyDeadLetter(b, c.DeadLetter)
	case KindRemoveNode:
		why := max(c.RemoveNode.Why, 1)
		res, err = &Result{}, b.SetNodeRemoved(c.RemoveNode.ID, why)
	case KindInbound:
		var ir *InboundResult
		if ir, err = m.applyInbound(b, c.Inbound); err == nil {
			res = &Result{Inbound: ir, High: c.Inbound.HLC}
			if ir.Err != nil {
				// A refused batch applies nothing: only the log index is
				// recorded.
				b.Close()
				b = m.st.NewBatch()
			}
		}
	case KindLink:
		res, next, err = m.applyLink(b, c.Link)
	case KindRepair:
		res, err = m.applyRepair(b, c.Repair)
	case KindPeer:
		res, next, err = m.applyPeer(b, index, c.Peer)
	case KindGroups:
		res, next, err = m.applyGroups(b, c.Groups)
	case KindFormat:
		// Only raised: a command of a later encoding may already be in the
		// log behind a second Format of the same version.
		v := c.Format.Version
		res = &Result{}
		if uint32(v) > m.format.Load() {
			err = b.SetCommandFormat(v)
			next = func() { m.format.Store(uint32(v)) }
		}
	default:
		err = fmt.Errorf("%w: a command of no one kind", ErrMalformed)
	}
	if err != nil {
		return nil, fmt.Errorf("machine: apply %d (%s): %w", index, kind, err)
	}
	if err := b.SetMachineApplied(index); err != nil {
		return nil, fmt.Errorf("machine: apply %d: %w", index, err)
	}
	// The log is the redo log and is already synced: Pebble's own WAL need
	// not be.
	if err := b.Commit(false); err != nil {
		return nil, fmt.Errorf("machine: apply %d (%s): %w", index, kind, err)
	}
	m.applied, m.logged = index, true
	if next != nil {
		next()
	}
	return res, nil
}

// decided is a local group as decided, before it is written.
type decided struct {
	res        *Result
	accepted   []int // the proposals written, in order
	last       uint64
	lastCommit hlc.Timestamp
}

// decideLocal decides a group in order: what each proposal becomes.
func (m *Machine) decideLocal(props []Proposal) (*decided, error) {
	res := &Result{Writes: make([]Write, len(props))}
	if m.stream.IsZero() {
		for i := range res.Writes {
			res.Writes[i].Err = ErrNoStream
		}
		return &decided{res: res}, nil
	}
	ov := NewOverlay(m.st, entry.Component(m.cluster, m.stream, m.epoch.Load()))
	ov.Floors = m.format.Load() >= FormatCounterFloors
	ov.Reserve(keysOf(props))
	keyed := map[string]int{} // key -> the group's first proposal under it
	last, lastCommit := m.last, m.lastCommit
	var accepted []int
	for i := range props {
		p, w := &props[i], &res.Writes[i]
		if k := p.Keyed; k != nil {
			if first, ok := keyed[k.Key]; ok {
				m.settleRepeat(w, &props[first], &res.Writes[first], p)
				continue
			}
			keyed[k.Key] = i
			d, rec, err := ov.LookupKey(k.Key, k.Fingerprint, p.Entry.Commit.Wall, &p.Entry)
			switch {
			case err != nil:
				return nil, err
			case d == KeyConflict:
				w.Err = fmt.Errorf("%w: key %q", ErrIdempotencyConflict, k.Key)
				continue
			case d == KeyReplay:
				w.Replay = rec
				continue
			case d == KeyPlanted:
				m.log.Warn("idempotency record without its write here: ignored, the request is written",
					"idempotency_key", k.Key, "recorded_version", rec.Stamp.String(), "key", p.Entry.Key)
			}
		}
		if !lastCommit.Less(p.Entry.Commit) {
			w.Err = fmt.Errorf("%w: %s at or below %s", ErrStaleStamp, p.Entry.Commit, lastCommit)
			continue
		}
		e := p.Entry
		v, err := ov.Decide(&e, p.Cond, p.Delta)
		if errors.Is(err, ErrUnreadable) {
			return nil, err
		}
		if err != nil {
			w.Err = err
			continue
		}
		if w.Existed, err = ov.Existed(&e); err != nil {
			return nil, err
		}
		if p.Keyed == nil && p.Cond == nil && m.format.Load() >= FormatDeletesOfNothing {
			// A delete removes only the versions this cluster holds
			// (docs/DATAMODEL.md "Deletes"): of a key that holds none
			// here it writes nothing, neither a tombstone nor an entry of
			// the stream (a keyed one is written: its answer is recorded).
			// Only once every member decides so (the format): each node
			// of the cluster numbers the stream the same.
			nothing, err := ov.DropAbsentDeletes(&e)
			if err != nil {
				return nil, err
			}
			if nothing {
				w.Entry = entry.Entry{Op: e.Op, Key: e.Key}
				continue
			}
		}
		last++
		e.Origin, e.Stream, e.Index = m.cluster, m.stream, last
		if e.Stamp.IsZero() {
			e.Stamp = e.Commit
		}
		w.CounterValue = v
		if k := p.Keyed; k != nil {
			st, body := Answer(k.Answer, &e, v, k.OpID)
			e.Idem = &entry.Idem{Key: k.Key, Fingerprint: k.Fingerprint, Status: st, Body: body, Expires: k.Expires}
		}
		ov.Record(&e)
		lastCommit = e.Commit
		w.Entry = e
		accepted = append(accepted, i)
		res.High = maxStamp(res.High, e.Commit, e.Stamp)
	}
	return &decided{res: res, accepted: accepted, last: last, lastCommit: lastCommit}, nil
}

// writeLocal writes a decided group. next publishes the new entries once
// the batch committed.
func (m *Machine) writeLocal(b *store.Batch, d *decided) (*Result, func(), error) {
	res, last, lastCommit := d.res, d.last, d.lastCommit
	if len(d.accepted) == 0 {
		return res, nil, nil
	}
	sizes := make([]int, 0, len(d.accepted))
	// The group's encodings, one after another: written to the batch, then
	// kept as they are by the stream's tail for shippers (never reused).
	raw := make([]byte, 0, m.lastRaw)
	keys := 0
	for _, i := range d.accepted {
		keys += max(1, len(res.Writes[i].Entry.Ops))
	}
	b.Reserve(keys)
	for _, i := range d.accepted {
		w := &res.Writes[i]
		out, err := b.ApplyLocal(&w.Entry)
		if err == nil && m.format.Load() >= FormatConflicts {
			err = markRestored(b, &w.Entry)
		}
		if err != nil {
			return nil, nil, err
		}
		w.Outcome = out
		n := len(raw)
		raw = m.codec.AppendEntry(raw, &w.Entry, wire.Defaults{Origin: m.cluster, Stream: m.stream})
		sizes = append(sizes, len(raw)-n)
	}
	m.lastRaw = len(raw)
	// The outbound entries go into the batch after every record, one run of
	// consecutive keys, so that the memtable's inserter places each next to
	// the one before (measured: no change beyond the spread, the entries'
	// inserts being a small part; docs/PERFORMANCE.md, issue 50).
	rest := raw
	for j, i := range d.accepted {
		if err := b.PutOutbound(m.stream, res.Writes[i].Entry.Index, rest[:sizes[j]:sizes[j]]); err != nil {
			return nil, nil, err
		}
		rest = rest[sizes[j]:]
	}
	err := errors.Join(
		b.SetLocalApplied(store.AppliedIndex{Stream: m.stream, Index: last, Commit: lastCommit}),
		b.RaiseHLC(res.High),
	)
	if err != nil {
		return nil, nil, err
	}
	return res, func() {
		m.last, m.lastCommit = last, lastCommit
		m.out.appended(sizes, raw)
	}, nil
}

// keysOf is about how many keys a group writes.
func keysOf(props []Proposal) int {
	n := 0
	for i := range props {
		n += max(1, len(props[i].Entry.Ops))
	}
	return n
}

// settleRepeat answers a proposal repeating a key an earlier proposal of the
// group (first, answered by fw) used: a replay of that one's answer, or a
// conflict when it is another request.
func (m *Machine) settleRepeat(w *Write, first *Proposal, fw *Write, p *Proposal) {
	k := p.Keyed
	switch {
	case string(first.Keyed.Fingerprint) != string(k.Fingerprint):
		w.Err = fmt.Errorf("%w: key %q", ErrIdempotencyConflict, k.Key)
	case fw.Replay != nil:
		w.Replay = fw.Replay
	case fw.Err != nil:
		w.Err = fmt.Errorf("%w: %w", ErrFirstRefused, fw.Err)
	default:
		id := fw.Entry.Idem
		w.Replay = &store.IdemRecord{Key: k.Key, Fingerprint: id.Fingerprint, Status: id.Status, Body: id.Body,
			Stamp: fw.Entry.LWW(), Expires: id.Expires}
	}
}

func maxStamp(ts ...hlc.Timestamp) hlc.Timestamp {
	var hi hlc.Timestamp
	for _, t := range ts {
		if hi.Less(t) {
			hi = t
		}
	}
	return hi
}

// applyCursor records where a link stands with a peer: what the shipper
// last recorded, in log order (a link rewinds when a peer shows it lost
// entries). A cursor only decides where shipping resumes, so one an old
// leader recorded late costs a resend the peer drops, never a lost entry.
func (m *Machine) applyCursor(b *store.Batch, peer string, c entry.Cursor) error {
	return b.SetCursor(peer, c)
}

// applyRecord sets a peer record if it holds what the proposer read.
func (m *Machine) applyRecord(b *store.Batch, c *RecordCmd) (bool, error) {
	get, set := b.ReseedRequest, b.SetReseedRequestIn
	if c.Record == RecordRejoin {
		get, set = b.RejoinPhase, b.SetRejoinIn
	}
	cur, err := get(c.Peer)
	if err != nil || cur != c.Expect {
		return false, err
	}
	return true, set(c.Peer, c.Set)
}

// UpdateRecord changes a peer record to f of what it holds, through apply
// (a log, or Direct): read, propose a compare-and-set, again if another
// change came first. It returns what the record held before.
func UpdateRecord(st *store.Store, apply func(*Command) (*Result, error), peer string, record byte, f func(byte) byte) (byte, error) {
	for try := 0; ; try++ {
		var recs map[string]byte
		var err error
		if record == RecordRejoin {
			recs, err = st.Rejoin()
		} else {
			recs, err = st.ReseedRequests()
		}
		if err != nil {
			return 0, err
		}
		cur := recs[peer]
		next := f(cur)
		if next == cur {
			return cur, nil
		}
		res, err := apply(&Command{Record: &RecordCmd{Peer: peer, Record: record, Expect: cur, Set: next}})
		if err != nil {
			return cur, err
		}
		if res.Swapped {
			return cur, nil
		}
		if try == 100 {
			return cur, fmt.Errorf("machine: record %c of %s kept changing under 100 attempts", record, peer)
		}
	}
}

// applyCollect drops what the leader found no peer can need any more.
func (m *Machine) applyCollect(b *store.Batch, c *CollectCmd) (*Result, error) {
	res := &Result{}
	var err error
	if !c.Cutoff.IsZero() {
		var keep store.Keeper
		if len(c.Keep) > 0 {
			k := &keeper{ranges: c.Keep, kept: map[string]KeptCount{}}
			keep, res.Kept = k, k.kept
		}
		if res.Collected, err = b.CollectTombstonesKeeping(c.Cutoff, c.Max, keep); err != nil {
			return nil, err
		}
		// The horizon a 404 reports (CollectedBelow): only raised.
		if prev, err := m.CollectedBelow(); err != nil {
			return nil, err
		} else if prev.Less(c.Cutoff) {
			if err := b.SetCollectedBelow(c.Cutoff); err != nil {
				return nil, err
			}
		}
	}
	if c.IdemBefore > 0 {
		if res.CollectedIdem, err = b.CollectIdem(c.IdemBefore, c.Max); err != nil {
			return nil, err
		}
	}
	if !c.ConflictsBefore.IsZero() || c.ConflictsMaxBytes > 0 {
		if res.CollectedConflicts, err = b.CollectConflicts(c.ConflictsBefore, c.ConflictsMaxBytes, c.Max); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// KeptCount is what a collection left for one link (CollectCmd.Keep): its
// tombstones and range tombstones below the cutoff, and the bytes they hold.
type KeptCount struct {
	Tombstones, Ranges int
	Bytes              int64
}

// keeper is a store.Keeper of a collect command's kept ranges, counting
// what it keeps for each link.
type keeper struct {
	ranges []KeepRanges
	kept   map[string]KeptCount
}

func (k *keeper) Keep(start, end, origin string, isRange bool) bool {
	for _, r := range k.ranges {
		if k.holds(r, start, end, origin, isRange) {
			return true
		}
	}
	return false
}

func (k *keeper) holds(r KeepRanges, start, end, origin string, isRange bool) bool {
	if r.Origin != "" && r.Origin != origin {
		return false
	}
	if !isRange {
		return entry.SpanHolds(r.Spans, start)
	}
	return entry.SpansMeet(r.Spans, start, end)
}

func (k *keeper) Kept(start, end, origin string, isRange bool, bytes int) {
	for _, r := range k.ranges {
		if k.holds(r, start, end, origin, isRange) {
			c := k.kept[r.keptName()]
			if !isRange {
				c.Tombstones++
			} else {
				c.Ranges++
			}
			c.Bytes += int64(bytes)
			k.kept[r.keptName()] = c
		}
	}
}

// applyDeadLetter replays a dead letter (applies its entry as it is) or
// discards it; either way it goes.
func (m *Machine) applyDeadLetter(b *store.Batch, c *DeadLetterCmd) (*Result, error) {
	d, ok, err := b.DeadLetter(c.Origin, c.Stream, c.Index)
	if err != nil || !ok {
		return &Result{}, err
	}
	if c.Action == DeadReplay {
		e, err := m.codec.DecodeEntry(d.Entry, wire.Defaults{})
		if err != nil {
			// Stored by this build from an entry the codec took: the
			// tree is damaged.
			return nil, fmt.Errorf("dead letter %s: %w: %v", d.ID(), store.ErrCorrupt, err)
		}
		if _, err := b.ApplyEntry(&e); err != nil {
			return nil, err
		}
	}
	return &Result{Found: true}, b.DeleteDeadLetter(d)
}

// CollectedBelow is the newest cutoff below which tombstones were collected
// here (zero: none ever was): a key of which nothing is kept was never
// written, or deleted by a delete stamped below it.
func (m *Machine) CollectedBelow() (hlc.Timestamp, error) { return m.st.CollectedBelow() }

// Replays reports whether a keyed write would be answered from its record
// (one exists, unexpired at now, for this fingerprint, and its write is
// here): the leader then checks nothing else of it, its pinned stamp
// included (a retry at a new leader whose clock is behind must get the
// first attempt's answer, not a refusal). Safe beside Apply: a read.
func (m *Machine) Replays(key string, fingerprint []byte, now int64, e *entry.Entry) bool {
	ov := NewOverlay(m.st, entry.Component(m.cluster, m.Stream(), m.epoch.Load()))
	d, _, err := ov.LookupKey(key, fingerprint, now, e)
	return err == nil && d == KeyReplay
}

// RemovalKey is what a KindRemoveNode command names for one incarnation of
// a node ("node." for a node known before incarnations).
func RemovalKey(node, incarnation string) string { return node + "." + incarnation }

// RemovedAll lists every removal record (RemovalKey, or a node ID) with
// its why, as Removed reads it.
func (m *Machine) RemovedAll() (map[string]byte, error) {
	recs, err := m.st.RemovedNodes()
	for id, why := range recs {
		recs[id] = max(why, 1)
	}
	return recs, err
}

// Removed reports whether node id (a node ID, or "node.inc" for one
// incarnation) was removed from the cluster, and why (the command's Set: 1
// an operator's removal, 2 replaced by a newer incarnation, 3 lost in a
// recovery; 0 when it was not removed). An incarnation is out when its node
// ID is.
func (m *Machine) Removed(id string) (byte, error) {
	node, _, one := strings.Cut(id, ".")
	keys := []string{node}
	if one {
		keys = append(keys, id)
	}
	for _, k := range keys {
		why, removed, err := m.st.NodeRemoved(k)
		if err != nil {
			return 0, err
		}
		if !removed {
			continue
		}
		return max(why, 1), nil
	}
	return 0, nil
}

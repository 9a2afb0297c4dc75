package replica

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/replicator/replicator/backup"
	"github.com/replicator/replicator/cluster"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/legacywal"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Recovery at open: the tree squared with the raft directory, and a data
// directory of a build before the log migrated into it.

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
func (r *Replica) reconcileLog(m *machine.Machine) (mint string, err error) {
	ls, err := cluster.Inspect(r.groupDir(), r.log)
	if err != nil {
		return "", err
	}
	// What this node may have acknowledged before it stopped is in its log:
	// local reads wait until it applied that much (readable).
	applied := m.Applied()
	r.reads.startLast = max(ls.LastCommand, applied)
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
		err := cluster.ReadLog(r.groupDir(), applied+1, ls.Snapshot, r.log, func(i uint64, data []byte) error {
			res, err := m.Apply(i, data)
			if err == nil && !res.High.IsZero() {
				r.d.Clock.Observe(res.High)
			}
			return err
		})
		if err != nil {
			return "", fmt.Errorf("node: apply the log's committed commands the store lacks: %w", err)
		}
		r.log.Warn("the store lacked committed commands the log holds: applied them", "from", applied+1, "to", ls.Snapshot)
		applied = m.Applied()
	}
	if applied < snap.Applied && r.multi() && snap.Tree && ls.SnapshotTree != "" {
		// A node of several keeps the tree in its snapshot: the store
		// restored alone from an older backup takes it back.
		if err := r.fsm.InstallTree(ls.SnapshotTree, snap.Applied); err != nil {
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
	if r.multi() {
		if !ls.Existing && r.restoredBackup() {
			// An online backup restored as a new incarnation: no vote of
			// its was ever cast, and its tree is the cluster's up to
			// applied. It joins as a new member; the leader's log (whose
			// commands up to applied the machine skips) or snapshot
			// brings what the copy lacks. The stream is the cluster's.
			r.log.Info("started from an online backup as a new member: the leader brings what the copy lacks", "applied", applied)
			return "", nil
		}
		// A voter never sets its raft directory aside (its term and vote
		// are in it) nor forgets its log: the start is refused, and stays
		// refused, with both as they are.
		return mint, nil
	}
	if ls.Existing {
		aside := fmt.Sprintf("%s.lost-%d", r.groupDir(), time.Now().UnixNano())
		if err := os.Rename(r.groupDir(), aside); err != nil {
			return "", fmt.Errorf("node: set the raft directory aside: %w", err)
		}
		r.log.Warn("raft directory set aside", "why", why, "kept_at", aside)
	}
	return mint, m.ForgetLog()
}

// migrateWAL moves a data directory of a build before the cluster's log
// into it, in place: the WAL's entries the store has not applied are applied,
// its retained entries become the stream's outbound entries in the tree, and
// the stream is kept. The WAL is kept as wal.migrated-<stream> for the
// operator to remove. It reports whether there was a WAL to migrate.
func (r *Replica) migrateWAL(m *machine.Machine) (bool, error) {
	dir := filepath.Join(r.d.Dir, "wal")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if m.Applied() > 0 {
		return false, fmt.Errorf("node: %s exists beside the cluster's log: set it aside, or remove it if it was migrated", dir)
	}
	l, err := legacywal.Open(dir, &legacywal.Options{Origin: r.d.Cluster, Logger: r.log})
	if errors.Is(err, legacywal.ErrEmpty) {
		// A WAL its build never began: nothing to migrate (a tree with a
		// stream and no WAL begins a new stream, as that build did).
		aside := fmt.Sprintf("%s.empty-%d", dir, time.Now().UnixNano())
		r.log.Warn("the WAL directory holds no stream: set aside", "kept_at", aside)
		return false, os.Rename(dir, aside)
	}
	if err != nil {
		return false, err
	}
	stream, first, last := l.Stream(), l.First(), l.Last()
	err = r.migrateEntries(l)
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
	r.log.Info("migrated the WAL into the cluster's log; the stream goes on", "stream", stream,
		"entries", last+1-first, "last_index", last, "kept_at", aside)
	return true, nil
}

// migrateEntries applies what the store lacks of the WAL and copies its
// retained entries into the tree, synced, with the stream and its end.
func (r *Replica) migrateEntries(l *legacywal.Log) error {
	ap, err := r.d.Store.LocalApplied()
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
		b := r.d.Store.NewBatch()
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
			r.d.Clock.Observe(e.Commit)
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
		err := errors.Join(b.RaiseHLC(r.d.Clock.Last()), b.Commit(true))
		b.Close()
		if err != nil {
			return err
		}
	}
	if first > last && ap.Stream == stream {
		// every entry was shipped and cut: the store knows the last commit
		commit = ap.Commit
	}
	b := r.d.Store.NewBatch()
	defer b.Close()
	return errors.Join(b.SetLocalApplied(store.AppliedIndex{Stream: stream, Index: last, Commit: commit}), b.Commit(true))
}

// restoredBackup reports a data directory extracted from an online backup
// (backup.ManifestFile) that `replicator restore` gave a new incarnation.
// The same incarnation would be a voter that forgot its votes: refused.
func (r *Replica) restoredBackup() bool {
	m, ok, err := backup.Read(r.d.Dir)
	return err == nil && ok && m.Incarnation != r.d.Incarnation
}

package wire

import (
	"errors"

	"github.com/replicator/replicator/entry"
)

// Parts of an inbound batch (issue 51, docs/CLUSTER.md "A stream per
// group, and the peers' streams"). A peer's stream carries keys of every
// slot; a cluster of several raft groups applies each key in the group
// that owns its slot. The acceptor splits an admitted batch into one part
// per group, each proposed to its group's log: the entries of the group's
// keys, and the runs of the others as foreign runs, which the group covers
// without applying (its mark of the stream moves past them). Each group's
// mark is then its coverage of the stream: dedup by WAL identity stays
// exact per group (a part applied before a crash or a lost answer
// collapses there), and the peer's frontier here is the least of the
// groups' marks, from which a sender resends.

// SplitInbound splits an admitted batch into one part per group, in group
// order, every group's part present (an empty one moves the group's mark).
// groupOf names the group of a key. What is not one key's goes to every
// group: a filtered marker (the sender's filter held the run back from
// every group), a range delete (each group deletes its keys in the range
// and keeps the range's tombstone), an entry with no key (an oversize
// stub); an atomic batch (OpMulti) is split by its operations' keys, each
// group's piece keeping the entry's index, commit and stamp: each piece is
// atomic, the whole is not. A dead letter's decision stays with each part
// holding its entry, as a snapshot's marks of its own and unknown relays.
// A snapshot's header (its beginning, its trailer with the marks it
// raises, a backfill's end) is in every part: each group opens, stages,
// reveals and ends it for its keys, and raises its own marks.
func SplitInbound(in *Inbound, groups int, groupOf func(key string) int) ([]*Inbound, error) {
	if groups < 1 {
		return nil, errors.New("wire: split into no group")
	}
	bt := in.Batch
	parts := make([]*Inbound, groups)
	for g := range parts {
		p := *in
		p.Raw, p.Own, p.Unknown, p.Dead, p.Foreign = nil, nil, nil, nil, nil
		nb := *bt
		nb.Raw, nb.Entries = nil, nil
		p.Batch = &nb
		parts[g] = &p
	}
	pieces := make([]*entry.Entry, groups)
	for i := range bt.Entries {
		e := &bt.Entries[i]
		clear(pieces)
		switch {
		case e.Op == entry.OpMulti && len(e.Ops) > 0:
			ops := make([][]entry.BatchOp, groups)
			for _, op := range e.Ops {
				if op.Op == entry.OpDeleteRange {
					for g := range ops {
						ops[g] = append(ops[g], op)
					}
					continue
				}
				g := groupOf(op.Key)
				ops[g] = append(ops[g], op)
			}
			for g := range ops {
				if len(ops[g]) > 0 {
					piece := *e
					piece.Ops = ops[g]
					pieces[g] = &piece
				}
			}
		case e.IsMarker() || e.Op == entry.OpDeleteRange || e.Key == "":
			for g := range pieces {
				pieces[g] = e
			}
		default:
			pieces[groupOf(e.Key)] = e
		}
		for g, piece := range pieces {
			p := parts[g]
			if piece == nil {
				p.Foreign = appendForeign(p.Foreign, e)
				continue
			}
			p.Batch.Entries = append(p.Batch.Entries, *piece)
			if why, ok := in.Dead[e.Index]; ok {
				if p.Dead == nil {
					p.Dead = map[uint64]string{}
				}
				p.Dead[e.Index] = why
			}
			p.Own = markIndex(p.Own, in.Own, e.Index)
			p.Unknown = markIndex(p.Unknown, in.Unknown, e.Index)
		}
	}
	return parts, nil
}

// markIndex adds i to a part's set when the batch's set holds it.
func markIndex(part, whole map[uint64]bool, i uint64) map[uint64]bool {
	if !whole[i] {
		return part
	}
	if part == nil {
		part = map[uint64]bool{}
	}
	part[i] = true
	return part
}

// appendForeign adds entry e's indexes to a part's foreign runs, joining
// the last run when it ends right before e.
func appendForeign(runs []ForeignRun, e *entry.Entry) []ForeignRun {
	to := e.Last()
	if n := len(runs); n > 0 && runs[n-1].To+1 == e.Index {
		runs[n-1].To, runs[n-1].Commit = to, e.Commit
		return runs
	}
	return append(runs, ForeignRun{From: e.Index, To: to, Commit: e.Commit})
}

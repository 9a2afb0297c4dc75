package machine

import (
	"bytes"
	"crypto/sha256"
	"slices"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
)

// The conflict log (docs/DATAMODEL.md "Conflicts"). From format 4 every
// version carries a causal context; when last-writer-wins discards a version
// that the winner's context does not cover, the discard is a conflict and
// the machine logs it in the apply's own batch, so every node of the cluster
// holds the same log. Only replicated entries are judged: a local write's
// context covers what its key held by construction, and re-seed and backfill
// entries carry versions, not new writes.

// FormatConflicts is the format from which versions carry causal contexts
// and the log keeps conflict records: a node of an older build would apply
// the same commands without them and its tree would diverge.
const FormatConflicts = 4

// ConflictValueMax is the largest discarded value a record keeps whole by
// default (the acceptor's Inbound command may say otherwise, so every node
// keeps the same); a larger one is kept as its length and hash.
const ConflictValueMax = 4096

// conflictJudge decides the discards of one inbound batch.
type conflictJudge struct {
	b *store.Batch
	// peer is the link the batch came over, at the applying command's
	// stamp, with tombstones collected below collected.
	peer      string
	at        hlc.Timestamp
	collected hlc.Timestamp
	valueMax  int
	// local: a batch of this cluster's own writes, which discard nothing
	// that is a conflict but move the key's records along.
	local bool
	// aliases: a record named against a key's new version keeps its
	// earlier IDs (from FormatConflictAliases).
	aliases bool
	// ownLine: only the loser's own line retires a record (from
	// FormatConflictClaims).
	ownLine bool
	// logged and superseded count what the batch did to the log.
	logged, superseded int
}

// judge is a store.Judge: the conflict of one merge, and what a version
// arriving does to the records the key holds.
func (j *conflictJudge) judge(prev *store.Record, w *store.Write, out entry.Outcome) (bool, error) {
	conflicted := prev != nil && prev.Conflicted
	if w.Range {
		return conflicted, nil
	}
	if conflicted && len(w.Ctx) > 0 {
		var err error
		if conflicted, err = j.follow(w, out); err != nil {
			return false, err
		}
	}
	if j.local || prev == nil || prev.Kind != store.KindPlain {
		// A local write's context covers what its key held.
		return conflicted, nil
	}
	in := version{stamp: w.Stamp, ctx: w.Ctx, tomb: w.Tombstone, value: w.Value, expires: w.Expires}
	st := version{stamp: prev.Stamp, ctx: prev.Ctx, tomb: prev.Tombstone, value: prev.Value, expires: prev.Expires}
	var c *entry.Conflict
	switch out {
	case entry.Applied:
		c = j.decide(w.Key, st, in, false)
	case entry.Stale:
		c = j.decide(w.Key, in, st, true)
	}
	if c == nil {
		return conflicted, nil
	}
	wrote, err := j.b.PutConflict(c)
	if err != nil {
		return false, err
	}
	if wrote {
		j.logged++
	}
	return true, nil
}

// follow moves the key's records along with a version that arrives (or is
// written here) and says whether any is left:
//
//   - it is the loser's author's (its origin) and descends from a record's
//     loser but not from its winner: the loser's author moved on before it
//     learned of the conflict, so the loser is no longer what was lost; the
//     record goes (the version is judged in its place). Another origin's
//     context claiming the loser does not retire it (contexts are
//     unsigned: a peer could erase any record by claiming it), from
//     FormatConflictClaims: the record stays as it is, as for a version
//     that saw both;
//   - it replaces the key's version and does not descend from a record's
//     loser: the loss stands, against the version the key holds now, and
//     the record names it as the winner (under its new ID). Every cluster
//     that applies the versions, in whatever order, then ends with the
//     same records: each loser named against the key's final version.
//
// A restored record stays as it is.
func (j *conflictJudge) follow(w *store.Write, out entry.Outcome) (bool, error) {
	recs, err := j.b.ConflictsOf(w.Key)
	if err != nil {
		return false, err
	}
	for i := range recs {
		r := &recs[i]
		if r.Restored.Origin != "" {
			continue
		}
		// Only the loser's own line can say it moved on: a context is the
		// writer's claim, unsigned, and another origin's claim to have
		// seen the loser must not erase the only record of a lost write.
		seesLoser, seesWinner := w.Ctx.Covers(r.Loser), w.Ctx.Covers(r.Winner)
		// The loser's line moved on only if the version is the loser's
		// own (from FormatConflictClaims).
		ownLine := !j.ownLine || w.Stamp.Origin == r.Loser.Origin
		switch {
		case seesLoser && !seesWinner && ownLine:
			if err := j.b.DeleteConflict(r); err != nil {
				return false, err
			}
			j.superseded++
			recs[i].Key = "" // gone
		case !seesLoser && out == entry.Applied && r.Winner != w.Stamp:
			if err := j.b.DeleteConflict(r); err != nil {
				return false, err
			}
			moved := *r
			moved.Winner, moved.Possible = w.Stamp, false
			moved.ID = entry.ConflictID(moved.Key, moved.Loser, moved.Winner)
			if j.aliases {
				// The ID an alert or a ticket named still finds it.
				moved.Aliases = append(slices.Clone(r.Aliases), r.ID)
				if n := len(moved.Aliases); n > entry.MaxConflictAliases {
					moved.Aliases = moved.Aliases[n-entry.MaxConflictAliases:]
				}
			}
			if _, err := j.b.PutConflict(&moved); err != nil {
				return false, err
			}
		}
	}
	for _, r := range recs {
		if r.Key != "" {
			return true, nil
		}
	}
	return false, nil
}

// markRestored marks the records of the loser a restore brought back as
// restored by it, at every cluster the restore reaches.
func markRestored(b *store.Batch, e *entry.Entry) error {
	if e.Restores == nil {
		return nil
	}
	recs, err := b.ConflictsOf(e.Key)
	if err != nil {
		return err
	}
	for i := range recs {
		if r := &recs[i]; r.Loser == e.Restores.Loser && r.Restored.Origin == "" {
			r.Restored = e.LWW()
			if err := b.UpdateConflict(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// version is one side of a discard.
type version struct {
	stamp   entry.Stamp
	ctx     entry.Context
	tomb    bool
	value   []byte
	expires int64
}

// decide says whether discarding loser for winner is a conflict, and its
// record if so (nil: it is not).
func (j *conflictJudge) decide(key string, loser, winner version, incoming bool) *entry.Conflict {
	switch {
	case loser.stamp.Origin == winner.stamp.Origin:
		// One origin's versions are ordered by its own log.
		return nil
	case loser.tomb == winner.tomb && bytes.Equal(loser.value, winner.value) && loser.expires == winner.expires:
		// The same outcome written twice (a keyed retry at two
		// clusters): nothing was lost.
		return nil
	case loser.tomb && loser.stamp.HLC.Less(j.collected):
		// A delete older than the collection horizon: its successors
		// may have lost it from their context when it was collected.
		return nil
	case len(winner.ctx) > 0 && winner.ctx.Covers(loser.stamp):
		return nil // the winner's author had seen it
	}
	h := sha256.Sum256(loser.value)
	c := &entry.Conflict{
		ID:  entry.ConflictID(key, loser.stamp, winner.stamp),
		Key: key, Loser: loser.stamp, Winner: winner.stamp,
		LoserTombstone: loser.tomb, LoserLen: len(loser.value), LoserHash: h[:], LoserExpires: loser.expires,
		Incoming: incoming, Peer: j.peer, At: j.at,
		Possible: len(winner.ctx) == 0,
	}
	if len(loser.value) <= j.valueMax {
		c.LoserValue = bytes.Clone(loser.value)
	}
	return c
}

package machine

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
)

// ConflictLog reads the conflict log the machine keeps (conflict.go,
// docs/DATAMODEL.md "Conflicts") in the API's words, and restores a loser
// as a new write. It holds what it uses: the tree, the log's command
// format, and the write path.
type ConflictLog struct {
	Store   *store.Store
	Format  func() int
	Propose func(ctx context.Context, w api.Write) (api.WriteResult, error)
}

// MaxConflictsLimit bounds a page of the conflict log.
const MaxConflictsLimit = 1000

// Conflicts reads one page of the conflict log, in key order.
func (c *ConflictLog) Conflicts(q api.ConflictQuery) (api.ConflictPage, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	if q.Limit > MaxConflictsLimit {
		return api.ConflictPage{}, fmt.Errorf("%w: limit %d: at most %d", api.ErrBadRequest, q.Limit, MaxConflictsLimit)
	}
	sq := store.ConflictQuery{Key: q.Key, Prefix: q.Prefix, After: q.After, Limit: q.Limit}
	if !q.Since.IsZero() {
		sq.Since = hlc.Timestamp{Wall: q.Since.UnixNano()}
	}
	recs, next, err := c.Store.Conflicts(sq)
	if err != nil {
		return api.ConflictPage{}, fmt.Errorf("%w: %w", api.ErrBadRequest, err)
	}
	page := api.ConflictPage{Items: make([]api.Conflict, 0, len(recs)), Next: next}
	for i := range recs {
		page.Items = append(page.Items, conflictReport(&recs[i]))
	}
	return page, nil
}

// RestoreConflict writes a logged loser back as a new write of this
// cluster, only while the key still holds the conflict's winner (otherwise
// a precondition error says what it holds). The write's context covers the
// loser and the winner, so no cluster logs it as a conflict, and every
// cluster it reaches marks its records of that loser restored.
func (c *ConflictLog) RestoreConflict(ctx context.Context, id string) (api.WriteResult, error) {
	if v := c.Format(); v < FormatConflicts {
		return api.WriteResult{}, fmt.Errorf("%w: the cluster's log is at command format %d; restores need format %d, "+
			"which the log moves to once every node runs a build that reads it", api.ErrNotWritten, v, FormatConflicts)
	}
	rec, ok, err := c.Store.ConflictByID(id)
	switch {
	case err != nil && errors.Is(err, store.ErrCorrupt):
		return api.WriteResult{}, err
	case err != nil:
		return api.WriteResult{}, fmt.Errorf("%w: %w", api.ErrBadRequest, err)
	case !ok:
		return api.WriteResult{}, fmt.Errorf("%w: no conflict %s in this cluster's log", api.ErrNotFound, id)
	case rec.ID != strings.ToLower(id):
		// An alias: the key moved on since, and the loss now stands
		// against its new version, as another record. Restoring it is
		// the operator's decision, made knowing that.
		return api.WriteResult{}, &api.PreconditionError{Key: rec.Key, Current: rec.Winner.String(),
			Why: fmt.Sprintf("conflict %s was superseded: the key moved on to version %s (%s), and the loss stands against it as conflict %s; restore that one",
				id, rec.Winner, rec.Winner.HLC.Time().Format(time.RFC3339Nano), rec.ID)}
	case rec.Restored.Origin != "":
		return api.WriteResult{}, fmt.Errorf("%w: conflict %s was restored by the write %s", api.ErrRestored, id, rec.Restored)
	case rec.LoserValue == nil && !rec.LoserTombstone && rec.LoserLen > 0:
		return api.WriteResult{}, fmt.Errorf("%w: conflict %s kept only the length (%d bytes) and hash of the lost value, "+
			"not the value: it cannot be restored from the log", api.ErrBadRequest, id, rec.LoserLen)
	}
	w := api.Write{Entry: entry.Entry{Op: entry.OpSet, Key: rec.Key, Value: rec.LoserValue,
		Restores: &entry.Restore{Loser: rec.Loser, Winner: rec.Winner}}}
	if rec.LoserTombstone {
		w.Entry.Op, w.Entry.Value = entry.OpDelete, nil
	} else if w.Entry.Value == nil {
		w.Entry.Value = []byte{}
	}
	if !rec.LoserTombstone {
		w.Entry.Expires = rec.LoserExpires // back as it was, expired or not
	}
	return c.Propose(ctx, w)
}

// conflictReport is a record as the API shows it.
func conflictReport(r *entry.Conflict) api.Conflict {
	out := api.Conflict{ID: r.ID, Key: r.Key, Peer: r.Peer, At: r.At.String(), Time: r.At.Time(), Possible: r.Possible,
		Loser: api.ConflictVersion{Version: r.Loser.String(), Time: r.Loser.HLC.Time(), Origin: r.Loser.Origin, Deleted: r.LoserTombstone,
			Value: r.LoserValue, ValueLen: r.LoserLen, ValueSHA256: hex.EncodeToString(r.LoserHash),
			ValueOmitted: r.LoserValue == nil && r.LoserLen > 0},
		Winner:    api.ConflictVersion{Version: r.Winner.String(), Time: r.Winner.HLC.Time(), Origin: r.Winner.Origin},
		Discarded: "stored",
		Aliases:   r.Aliases,
	}
	if r.LoserExpires != 0 {
		x := time.Unix(0, r.LoserExpires).UTC()
		out.Loser.Expires = &x
	}
	if r.Incoming {
		out.Discarded = "incoming"
	}
	if r.Restored.Origin != "" {
		out.Restored = r.Restored.String()
	}
	return out
}

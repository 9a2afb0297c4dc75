package node

import (
	"encoding/hex"
	"fmt"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/node/api"
	"github.com/replicator/replicator/store"
)

// conflictLog is the node's part that reads the conflict log the machine
// keeps (machine/conflict.go, docs/DATAMODEL.md "Conflicts").
type conflictLog struct{ n *Node }

// MaxConflictsLimit bounds a page of the conflict log.
const MaxConflictsLimit = 1000

// Conflicts reads one page of the conflict log, in key order.
func (c conflictLog) Conflicts(q client.ConflictQuery) (client.ConflictPage, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	if q.Limit > MaxConflictsLimit {
		return client.ConflictPage{}, fmt.Errorf("%w: limit %d: at most %d", api.ErrBadRequest, q.Limit, MaxConflictsLimit)
	}
	sq := store.ConflictQuery{Key: q.Key, Prefix: q.Prefix, After: q.After, Limit: q.Limit}
	if !q.Since.IsZero() {
		sq.Since = hlc.Timestamp{Wall: q.Since.UnixNano()}
	}
	recs, next, err := c.n.store.Conflicts(sq)
	if err != nil {
		return client.ConflictPage{}, fmt.Errorf("%w: %w", api.ErrBadRequest, err)
	}
	page := client.ConflictPage{Items: make([]client.Conflict, 0, len(recs)), Next: next}
	for i := range recs {
		page.Items = append(page.Items, conflictReport(&recs[i]))
	}
	return page, nil
}

// conflictReport is a record as the API shows it.
func conflictReport(r *entry.Conflict) client.Conflict {
	out := client.Conflict{ID: r.ID, Key: r.Key, Peer: r.Peer, At: r.At.String(), Time: r.At.Time(), Possible: r.Possible,
		Loser: client.ConflictVersion{Version: r.Loser.String(), Origin: r.Loser.Origin, Deleted: r.LoserTombstone,
			Value: r.LoserValue, ValueLen: r.LoserLen, ValueSHA256: hex.EncodeToString(r.LoserHash),
			ValueOmitted: r.LoserValue == nil && r.LoserLen > 0},
		Winner:    client.ConflictVersion{Version: r.Winner.String(), Origin: r.Winner.Origin},
		Discarded: "stored",
	}
	if r.Incoming {
		out.Discarded = "incoming"
	}
	if r.Restored.Origin != "" {
		out.Restored = r.Restored.String()
	}
	return out
}

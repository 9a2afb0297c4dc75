package resp

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/replicator/replicator/api"
)

// cursors keeps each SCAN's place (the key to resume after: up to 4 KiB,
// which a client's integer cursor cannot carry). A cursor is a random
// number, not a sequence: one client cannot guess, take or expire another's.
// Any connection may use it (a pooled client pages over several). Bounded:
// a connection holds at most perConnCursors (its next one pushes out its
// own oldest), the table maxCursors (then the oldest goes), and a place
// older than cursorTTL expires. A cursor may be used again (a client
// retrying a page); the next page gets a new one, and once that one is
// used the one before it goes, so a scan in progress holds at most two
// places.
type cursors struct {
	mu    sync.Mutex
	byID  map[uint64]place
	order []uint64 // ids in the order they were given
	// of counts the places each connection holds.
	of map[int64]int
}

type place struct {
	after, prefix string
	at            time.Time
	prev          uint64 // the cursor whose page gave this one (0: the first)
	owner         int64  // the connection that read the page
}

const (
	maxCursors     = 10000
	perConnCursors = 8
	cursorTTL      = 10 * time.Minute
)

// put keeps the place after which the next page starts; prev is the cursor
// the page was read from (0 for a scan's first page), owner the connection.
func (cs *cursors) put(after, prefix string, prev uint64, owner int64) uint64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.byID == nil {
		cs.byID, cs.of = map[uint64]place{}, map[int64]int{}
	}
	now := time.Now()
	for len(cs.order) > 0 {
		id := cs.order[0]
		p, ok := cs.byID[id]
		if ok && len(cs.byID) < maxCursors && now.Sub(p.at) < cursorTTL {
			break
		}
		cs.dropLocked(id)
		cs.order = cs.order[1:]
	}
	if cs.of[owner] >= perConnCursors {
		for _, id := range cs.order {
			if p, ok := cs.byID[id]; ok && p.owner == owner {
				cs.dropLocked(id)
				break
			}
		}
	}
	id := cs.newIDLocked()
	cs.byID[id] = place{after, prefix, now, prev, owner}
	cs.of[owner]++
	cs.order = append(cs.order, id)
	if len(cs.order) > 2*maxCursors {
		// Ids dropped out of order leave holes: compact them away.
		kept := cs.order[:0]
		for _, id := range cs.order {
			if _, ok := cs.byID[id]; ok {
				kept = append(kept, id)
			}
		}
		cs.order = kept
	}
	return id
}

// newIDLocked is a fresh random cursor: non-zero, below 2^63 (clients
// parse cursors as signed or unsigned 64-bit numbers).
func (cs *cursors) newIDLocked() uint64 {
	for {
		id := rand.Uint64() >> 1
		if _, taken := cs.byID[id]; id != 0 && !taken {
			return id
		}
	}
}

func (cs *cursors) dropLocked(id uint64) {
	if p, ok := cs.byID[id]; ok {
		delete(cs.byID, id)
		if cs.of[p.owner]--; cs.of[p.owner] <= 0 {
			delete(cs.of, p.owner)
		}
	}
}

func (cs *cursors) take(id uint64, prefix string) (string, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	p, ok := cs.byID[id]
	if !ok || p.prefix != prefix || time.Since(p.at) >= cursorTTL {
		return "", false
	}
	// The client moved on: it will not retry the page before.
	cs.dropLocked(p.prev)
	return p.after, true
}

// scanOptions is a SCAN page as the store reads it.
func scanOptions(prefix, after string, count int) api.ScanOptions {
	return api.ScanOptions{Prefix: prefix, After: after, Limit: count}
}

package resp

import (
	"sync"
	"time"

	"github.com/replicator/replicator/store"
)

// cursors keeps each SCAN's place (the key to resume after: up to 4 KiB,
// which a client's integer cursor cannot carry). Bounded: past maxCursors
// the oldest goes; a place older than cursorTTL expires. A cursor may be
// used again (a client retrying a page); the next page gets a new one, and
// once that one is used the one before it goes, so a scan in progress holds
// at most two places: one client paging through millions of keys does not
// push other clients' cursors out.
type cursors struct {
	mu    sync.Mutex
	next  uint64
	byID  map[uint64]place
	order []uint64 // ids in the order they were given
}

type place struct {
	after, prefix string
	at            time.Time
	prev          uint64 // the cursor whose page gave this one (0: the first)
}

const (
	maxCursors = 10000
	cursorTTL  = 10 * time.Minute
)

// put keeps the place after which the next page starts; prev is the cursor
// the page was read from (0 for a scan's first page).
func (cs *cursors) put(after, prefix string, prev uint64) uint64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.byID == nil {
		cs.byID = map[uint64]place{}
	}
	now := time.Now()
	for len(cs.order) > 0 {
		id := cs.order[0]
		p, ok := cs.byID[id]
		if ok && len(cs.byID) < maxCursors && now.Sub(p.at) < cursorTTL {
			break
		}
		delete(cs.byID, id)
		cs.order = cs.order[1:]
	}
	cs.next++
	cs.byID[cs.next] = place{after, prefix, now, prev}
	cs.order = append(cs.order, cs.next)
	return cs.next
}

func (cs *cursors) take(id uint64, prefix string) (string, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	p, ok := cs.byID[id]
	if !ok || p.prefix != prefix || time.Since(p.at) >= cursorTTL {
		return "", false
	}
	// The client moved on: it will not retry the page before.
	delete(cs.byID, p.prev)
	return p.after, true
}

// scanOptions is a SCAN page as the store reads it.
func scanOptions(prefix, after string, count int) store.ScanOptions {
	return store.ScanOptions{Prefix: prefix, After: after, Limit: count}
}

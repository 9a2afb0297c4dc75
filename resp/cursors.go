package resp

import (
	"sync"
	"time"

	"github.com/replicator/replicator/store"
)

// cursors keeps each SCAN's place (the key to resume after: up to 4 KiB,
// which a client's integer cursor cannot carry). Bounded: past maxCursors
// the oldest goes; a place older than cursorTTL expires. A cursor may be
// used again (a client retrying a page); the next page gets a new one.
type cursors struct {
	mu    sync.Mutex
	next  uint64
	byID  map[uint64]place
	order []uint64 // ids in the order they were given
}

type place struct {
	after, prefix string
	at            time.Time
}

const (
	maxCursors = 10000
	cursorTTL  = 10 * time.Minute
)

func (cs *cursors) put(after, prefix string) uint64 {
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
	cs.byID[cs.next] = place{after, prefix, now}
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
	return p.after, true
}

// scanOptions is a SCAN page as the store reads it.
func scanOptions(prefix, after string, count int) store.ScanOptions {
	return store.ScanOptions{Prefix: prefix, After: after, Limit: count}
}

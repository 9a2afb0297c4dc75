package store

import (
	"sync/atomic"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hashtree"
)

// The version cache (issue 50): for keys written recently, what the tree
// holds for them, without the value. A tracked merge reads its key's version
// to give a local write its context, to judge what it discards and to move
// the key's leaf; through the levels of the tree that read was a sixth of a
// write's CPU. Most writes descend from the version they replace (a local
// write always does; a peer's write of one origin's key or one whose context
// covers it does), and those need the version's stamp, context, flags and
// digest, never its value: the cache answers them. Anything else (a write
// that may conflict with it, a conflicted key, a write the version beats)
// reads the tree as before.
//
// Exact, not approximate: the cache is filled and emptied only at a batch's
// commit, under the apply lock, from what the batch wrote (Commit): every
// record a tracked merge wrote is put, every other data key the batch wrote or
// deleted is dropped, and a tree replaced or written beneath is forgotten
// whole. A key absent from the cache is read from the tree; a cached one is
// what the tree holds.
//
// A record rotted beneath a cached version is overwritten by the key's next
// write without being read: the write descends from what the cluster held,
// as the cache says (CheckLeaves finds rot in keys not written again).
//
// A key enters at its first overwrite: a workload of fresh keys pays
// nothing for it. Bounded by two generations of at most half the keys each: when the
// current one fills it becomes the old one and the old one goes, so a key
// written within about the last half of the bound is always found.

// cachedVersion is a record without its value.
type cachedVersion struct {
	stamp      entry.Stamp
	ctx        entry.Context
	digest     hashtree.Sum // the record's leaf digest (versionDigest)
	expires    int64
	kind       Kind
	tombstone  bool
	conflicted bool
}

// versionCache is guarded by the store's applyMu.
type versionCache struct {
	half     int // keys per generation; 0: no cache
	cur, old map[string]cachedVersion
	// hits and misses count lookups of keys the keys filter says the tree
	// may hold, keys what it holds (VersionCacheStats): atomics, so that a
	// scrape never waits for a batch.
	hits, misses atomic.Uint64
	keys         atomic.Int64
}

func newVersionCache(keys int) *versionCache {
	c := &versionCache{half: max(keys, 0) / 2}
	if c.half > 0 {
		c.cur = make(map[string]cachedVersion, min(c.half, 1<<12))
	}
	return c
}

func (c *versionCache) get(key string) (cachedVersion, bool) {
	if c.half == 0 {
		return cachedVersion{}, false
	}
	if v, ok := c.cur[key]; ok {
		return v, true
	}
	v, ok := c.old[key]
	return v, ok
}

func (c *versionCache) put(key string, v cachedVersion) {
	if c.half == 0 {
		return
	}
	if _, ok := c.cur[key]; !ok && len(c.cur) >= c.half {
		c.old, c.cur = c.cur, make(map[string]cachedVersion, c.half)
	}
	c.cur[key] = v
}

func (c *versionCache) drop(key string) {
	if c.half == 0 {
		return
	}
	delete(c.cur, key)
	delete(c.old, key)
}

// clear forgets every key (the tree was replaced or written beneath).
func (c *versionCache) clear() {
	if c.half == 0 {
		return
	}
	c.old, c.cur = nil, make(map[string]cachedVersion, min(c.half, 1<<12))
	c.count()
}

// count publishes how many keys the cache holds (VersionCacheStats).
func (c *versionCache) count() { c.keys.Store(int64(len(c.cur) + len(c.old))) }

func versionOf(r *Record, digest hashtree.Sum) cachedVersion {
	return cachedVersion{stamp: r.Stamp, ctx: r.Ctx, digest: digest, expires: r.Expires, kind: r.Kind,
		tombstone: r.Tombstone, conflicted: r.Conflicted}
}

// answers reports whether v, as w's key's version, decides w's merge without
// its value: w is newer and descends from it (it is local, of v's origin, or
// its context covers v), and no conflict record of the key needs following.
// Then the merge applies w, and the conflict judge finds nothing to log.
func (v *cachedVersion) answers(w *Write) bool {
	if v.conflicted || w.Stamp.Compare(v.stamp) <= 0 {
		return false
	}
	return w.Local || w.Stamp.Origin == v.stamp.Origin || w.Ctx.Covers(v.stamp)
}

// record is v as a Record with no value (answers said none is read).
func (v *cachedVersion) record() *Record {
	return &Record{Stamp: v.stamp, Tombstone: v.tombstone, Kind: v.kind, Ctx: v.ctx, Conflicted: v.conflicted, Expires: v.expires}
}

// VersionCacheStats are the version cache's lookups since the store opened.
type VersionCacheStats struct {
	// Keys is how many keys it holds now.
	Keys int
	// Hits are merges it answered; Misses those that read the tree
	// (of keys the tree may hold: a key it never held is read by neither).
	Hits, Misses uint64
}

// VersionCacheStats reports the version cache's figures.
func (s *Store) VersionCacheStats() VersionCacheStats {
	c := s.versions
	return VersionCacheStats{Keys: int(c.keys.Load()), Hits: c.hits.Load(), Misses: c.misses.Load()}
}

// cacheCommittedLocked brings the cache up to what the batch just committed:
// the records its tracked merges wrote, and no other key it wrote or deleted.
func (b *Batch) cacheCommittedLocked() {
	c := b.s.versions
	if c.half == 0 {
		return
	}
	for key, p := range b.pending {
		switch {
		case p.rec == nil:
			c.drop(key)
		case p.held:
			c.put(key, versionOf(p.rec, p.digest))
		}
		// else: the key's first version. The keys filter said the tree
		// never held it, so the cache does not either (it holds only
		// keys written, which the filter keeps): nothing to drop, and it
		// is cached from its second version on, so that writes of fresh
		// keys, which would never be answered, cost no insertion.
	}
	for _, key := range b.deletedRecords {
		c.drop(key)
	}
	c.count()
}

// deleteRecordLocked deletes key's record (data key dk) in the batch: the
// only way a record leaves the tree outside ReplaceFrom, so that the
// version cache forgets it at the commit.
func (b *Batch) deleteRecordLocked(key string, dk []byte) error {
	b.deletedRecords = append(b.deletedRecords, key)
	return b.pb.Delete(dk, nil)
}

package store

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
)

// A backfill (a link's filter widened) brings the newly included ranges of
// the sender's tree. At its end, the receiver drops each key of those
// ranges that the backfill did not carry, that another cluster wrote, and
// whose stamp is below the sender's horizon (the cutoff below which it had
// collected tombstones when its snapshot was taken): the sender applied
// that write and holds nothing of the key, so it deleted it and collected
// the delete while the range did not cross. The keys a backfill carried
// are marked here (B records) until its end.

func backfilledKey(sender, key string) []byte {
	k := make([]byte, 0, 2+len(sender)+len(key))
	k = append(k, prefixBackfill)
	k = append(k, sender...)
	k = append(k, 0)
	return append(k, key...)
}

// MarkBackfilled records in the batch that a backfill from sender carried
// key.
func (b *Batch) MarkBackfilled(sender, key string) error {
	if b.backfilled == nil {
		b.backfilled = map[string]bool{}
	}
	b.backfilled[string(backfilledKey(sender, key))] = true
	return b.pb.Set(backfilledKey(sender, key), nil, nil)
}

// ClearBackfilled forgets every key a backfill from sender carried.
func (b *Batch) ClearBackfilled(sender string) error {
	lo := backfilledKey(sender, "")
	hi := append(bytes.Clone(lo[:len(lo)-1]), 1)
	for k := range b.backfilled {
		if strings.HasPrefix(k, string(lo)) {
			delete(b.backfilled, k)
		}
	}
	if b.backfillCleared == nil {
		b.backfillCleared = map[string]bool{}
	}
	b.backfillCleared[sender] = true
	return b.pb.DeleteRange(lo, hi, nil)
}

// carried reports whether a backfill from sender carried key, as the batch
// sees it (its own marks and clears first: the batch is not indexed).
func (b *Batch) carried(sender, key string) (bool, error) {
	bk := backfilledKey(sender, key)
	if b.backfilled[string(bk)] {
		return true, nil
	}
	if b.backfillCleared[sender] {
		return false, nil
	}
	_, closer, err := b.s.db.Get(bk)
	if err == pebble.ErrNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	closer.Close()
	return true, nil
}

// DropUncarried drops the keys of [start, end) that a backfill from sender
// did not carry, written by another cluster than local below horizon, and
// reports how many it dropped. Counters keep their totals (a counter's
// components only grow; a backfill carries them whole).
func (b *Batch) DropUncarried(sender, local string, start, end string, horizon hlc.Timestamp) (int, error) {
	if horizon.IsZero() {
		return 0, nil
	}
	upper := []byte{prefixData + 1}
	if end != "" {
		upper = dataKey(end)
	}
	it, err := b.s.db.NewIter(&pebble.IterOptions{LowerBound: dataKey(start), UpperBound: upper})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		key := string(it.Key()[1:])
		if _, ok := b.pending[key]; ok {
			continue // written by this batch
		}
		st, flags, err := decodeStampOnly(it.Value())
		if err != nil {
			return n, fmt.Errorf("store: key %q: %w", key, err)
		}
		// Only the sender's own writes: it surely applied those; a third
		// cluster's write may never have reached it (that cluster's link
		// to it may filter the key), so its absence there proves nothing.
		if flags&flagCounter != 0 || st.Origin == local || st.Origin != sender || !st.HLC.Less(horizon) {
			continue
		}
		if carried, err := b.carried(sender, key); err != nil || carried {
			if err != nil {
				return n, err
			}
			continue
		}
		if flags&flagTombstone == 0 {
			r, err := DecodeRecord(it.Value())
			if err != nil {
				return n, fmt.Errorf("store: key %q: %w", key, err)
			}
			prev := versionDigest(&b.digester, key, &r)
			b.moveLeafLocked(key, prev, hashtree.Sum{})
			if err := b.movePlainLiveLocked(key, prev, hashtree.Sum{}); err != nil {
				return n, err
			}
		}
		if err := b.deleteRecordLocked(key, dataKey(key)); err != nil {
			return n, err
		}
		if flags&flagTombstone != 0 {
			if err := b.pb.Delete(tombstoneKey(st.HLC, key), nil); err != nil {
				return n, err
			}
		}
		n++
	}
	return n, it.Error()
}

// CollectedBelow is the cutoff below which the snapshot's tree had
// collected tombstones (zero: none ever was).
func (sn *Snapshot) CollectedBelow() (hlc.Timestamp, error) {
	v, closer, err := sn.snap.Get(keyCollectedBelow)
	if err == pebble.ErrNotFound {
		return hlc.Timestamp{}, nil
	}
	if err != nil {
		return hlc.Timestamp{}, err
	}
	defer closer.Close()
	return hlc.Decode(v)
}

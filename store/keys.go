package store

import (
	"bytes"
	"encoding/binary"

	"github.com/replicator/replicator/hlc"
)

// The key spaces of the tree. Every key begins with one byte naming its
// space, an ASCII letter (ReplaceFrom clears the whole tree by that). This is
// every key space, of every package:
//
//	d<key>                              data record (AppendRecord, record.go)
//	t<hlc:12><key>                      empty: tombstone index, ordered by stamp, for collection
//	m\x00<name>                         node metadata, one record per name (below)
//	k<key>                              PN-counter (appendCounter, counter.go)
//	r<hlc:12><origin>\x00<start>        range tombstone: end (ranges.go)
//	h<origin>\x00<stream:16>            acceptor high-water mark: index(8) | commit hlc(12) |
//	                                    merged(8) | dead-lettered(8) | seeded(8) [| filtered(8)] (marks.go)
//	c<peer>                             shipper cursor: stream(16) | acked index(8) (marks.go)
//	R<peer>                             flags(1): what this node owes a peer or waits for from it (marks.go)
//	J<peer>                             phase(1) of this node's own rejoin with a peer (marks.go)
//	q<origin>\x00<stream:16><index:8>   dead letter: at(8) | len(reason)(2) | reason | entry (deadletter.go)
//	i<key>                              idempotency record (appendIdem, idem.go)
//	x<expires:8><key>                   empty: idempotency expiry index, for collection (idem.go)
//	o<stream:16><index:8>               outbound entry, as the WAL codec encodes it (outbound.go)
//	L<peer>                             a link's settings the log recorded: JSON of entry.LinkSettings (marks.go)
//	B<sender>\x00<key>                  empty: a key the running backfill from sender carried (backfill.go)
//	S<sender>\x00<stream:16>            an open re-seed or backfill: kind(1) | begun(1) | real stream(16) | index(8) (opensnap.go)
//	U<sender>\x00<stream:16>\x00<author>  empty: an author whose relays that open snapshot brought were not taken (opensnap.go)
//	G<sender>\x00<stream:16><index:8>   an entry of that open snapshot staged until its trailer, as the sender encoded it (staged.go)
//	F<peer>                             the peer's kept-home windows: JSON of []KeptHome (kepthome.go)
//	X<key>\x00<id:16>                   a conflict record: JSON of entry.Conflict (conflicts.go)
//	Y<at:12><id:16>                     a conflict record's key, by the time it was logged (conflicts.go)
//	W<id:16>                            a conflict record's key, by its ID (conflicts.go)
//
// The m keys:
//
//	m\x00applied                  last local WAL index applied: stream(16) | index(8) | commit hlc(12) (meta.go)
//	m\x00hlc                      clock high-water mark: hlc(12) (meta.go)
//	m\x00maxstamp                 highest stamp ever merged: hlc(12) | origin (meta.go)
//	m\x00ctrepoch                 counter epoch: stream(16) | epoch(4) (counter.go)
//	m\x00machine.applied          the state machine's last log index applied: index(8) (machine.go)
//	m\x00machine.format           the command encoding the log carries: version(1) (machine.go)
//	m\x00machine.collected        cutoff below which tombstones were collected: hlc(12) (machine.go)
//	m\x00machine.removed/<id>     a node ID or incarnation removed from the cluster: why(1) (machine.go)
//	m\x00machine.slots            the cluster's slot map, in group 0 (package slot's encoding) (machine.go)
//	m\x00conflicts               the conflict log's records(8) | bytes(8) | dropped by retention(8) (conflicts.go)
//
// No other package writes a key of the tree: each record has its reader and
// writer here, and a new key belongs in this table.
const (
	prefixData      = 'd'
	prefixTombstone = 't'
	prefixMeta      = 'm'
)

// The m keys of this package.
var (
	keyLocalApplied = []byte("m\x00applied")
	keyHLC          = []byte("m\x00hlc")
	keyMaxStamp     = []byte("m\x00maxstamp")
	keyCtrEpoch     = []byte("m\x00ctrepoch")

	keyMachineApplied = []byte("m\x00machine.applied")
	keyCommandFormat  = []byte("m\x00machine.format")
	keyCollectedBelow = []byte("m\x00machine.collected")
	keyConflictStats  = []byte("m\x00conflicts")
	keySlotMap        = []byte("m\x00machine.slots")
)

// removedNodeKey records a node ID removed from the cluster, or one
// incarnation of it ("node.inc").
func removedNodeKey(id string) []byte { return append([]byte("m\x00machine.removed/"), id...) }

// The other key spaces, laid out as the table above says.
const (
	prefixCounter    = 'k' // PN-counters (counter.go)
	prefixRange      = 'r' // range tombstones (ranges.go)
	prefixHWM        = 'h' // acceptor high-water marks (marks.go)
	prefixCursor     = 'c' // shipper cursors (marks.go)
	prefixReseedReq  = 'R' // re-seed flags per peer (marks.go)
	prefixRejoin     = 'J' // rejoin phase per peer (marks.go)
	prefixDead       = 'q' // dead letters (deadletter.go)
	prefixIdem       = 'i' // idempotency records (idem.go)
	prefixIdemExpiry = 'x' // their expiry index (idem.go)
	prefixOutbound   = 'o' // outbound entries (outbound.go)
	prefixLink       = 'L' // link settings: filters, bandwidth (marks.go)
	prefixBackfill   = 'B' // keys a running backfill carried (backfill.go)
	prefixOpenSnap   = 'S' // open re-seeds and backfills (opensnap.go)
	prefixUnheard    = 'U' // authors an open snapshot's relays were not taken of (opensnap.go)
	prefixStaged     = 'G' // an open snapshot's entries, staged until its trailer (staged.go)
	prefixKeptHome   = 'F' // ranges a peer's filter kept home, not backfilled since (kepthome.go)

	prefixExpiry       = 'e' // versions that expire, by expiry (collect.go)
	prefixConflict     = 'X' // the conflict log, by key (conflicts.go)
	prefixConflictTime = 'Y' // its time index
	prefixConflictID   = 'W' // its ID index
)

func dataKey(key string) []byte {
	k := make([]byte, 0, 1+len(key))
	k = append(k, prefixData)
	return append(k, key...)
}

func tombstoneKey(ts hlc.Timestamp, key string) []byte {
	k := make([]byte, 0, 1+hlc.EncodedLen+len(key))
	k = append(k, prefixTombstone)
	k = ts.AppendTo(k)
	return append(k, key...)
}

// expiryKey indexes a version that expires: expires(8, big-endian) | key.
// An entry outlives the version it was written for when the key is written
// again; collection recognises it as stale.
func expiryKey(expires int64, key string) []byte {
	k := make([]byte, 0, 9+len(key))
	k = append(k, prefixExpiry)
	k = binary.BigEndian.AppendUint64(k, uint64(expires))
	return append(k, key...)
}

func counterKey(key string) []byte { return append([]byte{prefixCounter}, key...) }

func rangeKey(r *RangeTombstone) []byte {
	k := []byte{prefixRange}
	k = r.Stamp.HLC.AppendTo(k)
	k = append(k, r.Stamp.Origin...)
	k = append(k, 0)
	return append(k, r.Start...)
}

func hwmKey(origin string, stream [16]byte) []byte {
	k := make([]byte, 0, 2+len(origin)+16)
	k = append(k, prefixHWM)
	k = append(k, origin...)
	k = append(k, 0)
	return append(k, stream[:]...)
}

func cursorKey(peer string) []byte { return append([]byte{prefixCursor}, peer...) }

func reseedReqKey(peer string) []byte { return append([]byte{prefixReseedReq}, peer...) }

func rejoinKey(peer string) []byte { return append([]byte{prefixRejoin}, peer...) }

func deadKey(origin string, stream [16]byte, index uint64) []byte {
	k := append([]byte{prefixDead}, origin...)
	k = append(k, 0)
	k = append(k, stream[:]...)
	return binary.BigEndian.AppendUint64(k, index)
}

func idemKey(k string) []byte { return append([]byte{prefixIdem}, k...) }

func idemExpiryKey(expires int64, k string) []byte {
	b := binary.BigEndian.AppendUint64([]byte{prefixIdemExpiry}, uint64(expires))
	return append(b, k...)
}

func outboundKey(stream [16]byte, index uint64) []byte {
	k := make([]byte, 0, 1+16+8)
	k = append(k, prefixOutbound)
	k = append(k, stream[:]...)
	return binary.BigEndian.AppendUint64(k, index)
}

// prefixEnd returns the smallest key above every key with prefix p, or nil.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
)

const (
	hwmValueLenV1 = 8 + hlc.EncodedLen + 8 + 8
	hwmValueLenV2 = hwmValueLenV1 + 8 // with seeded
	// hwmValueLen adds filtered, written only once a marker counted one,
	// so a record without filtered entries still reads in a build before it.
	hwmValueLen = hwmValueLenV2 + 8
)

func decodeHWM(key, v []byte) (entry.HWM, error) {
	var h entry.HWM
	if len(key) < 1+1+1+16 || key[len(key)-17] != 0 || (len(v) != hwmValueLen && len(v) != hwmValueLenV2 && len(v) != hwmValueLenV1) {
		return h, fmt.Errorf("%w: high-water mark record", ErrCorrupt)
	}
	h.Origin = string(key[1 : len(key)-17])
	copy(h.Stream[:], key[len(key)-16:])
	h.Index = binary.BigEndian.Uint64(v[:8])
	ts, err := hlc.Decode(v[8 : 8+hlc.EncodedLen])
	if err != nil {
		return h, fmt.Errorf("%w: high-water mark: %v", ErrCorrupt, err)
	}
	h.Commit = ts
	h.Merged = binary.BigEndian.Uint64(v[8+hlc.EncodedLen:])
	h.DeadLettered = binary.BigEndian.Uint64(v[16+hlc.EncodedLen:])
	if len(v) >= hwmValueLenV2 {
		h.Seeded = binary.BigEndian.Uint64(v[24+hlc.EncodedLen:])
	}
	if len(v) == hwmValueLen {
		h.Filtered = binary.BigEndian.Uint64(v[32+hlc.EncodedLen:])
	}
	return h, nil
}

// HWM reads the committed high-water mark of one origin stream (the batch's
// own changes are not in it until it commits).
func (b *Batch) HWM(origin string, stream [16]byte) (entry.HWM, error) {
	if h, ok := b.s.marks[origin][stream]; ok {
		return h, nil
	}
	return entry.HWM{Origin: origin, Stream: stream}, nil
}

// HWM reads the committed high-water mark of one origin stream.
func (s *Store) HWM(origin string, stream [16]byte) (entry.HWM, error) {
	b := s.NewBatch()
	defer b.Close()
	return b.HWM(origin, stream)
}

// HWMsOfExcept lists the committed high-water marks of every stream of one
// origin but one, ordered by stream.
func (s *Store) HWMsOfExcept(origin string, except [16]byte) ([]entry.HWM, error) {
	b := s.NewBatch()
	defer b.Close()
	return b.HWMsOfExcept(origin, except)
}

// HWMsOf lists the committed high-water marks of every stream of one origin
// cluster, ordered by stream.
func (b *Batch) HWMsOf(origin string) ([]entry.HWM, error) {
	return b.hwmsOf(origin, nil), nil
}

// HWMsOfExcept lists the committed high-water marks of every stream of one
// origin but one (the stream being applied), ordered by stream.
func (b *Batch) HWMsOfExcept(origin string, except [16]byte) ([]entry.HWM, error) {
	return b.hwmsOf(origin, &except), nil
}

func (b *Batch) hwmsOf(origin string, except *[16]byte) []entry.HWM {
	var out []entry.HWM
	for st, h := range b.s.marks[origin] {
		if except == nil || st != *except {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(x, y entry.HWM) int { return bytes.Compare(x.Stream[:], y.Stream[:]) })
	return out
}

// markChange is a high-water mark a batch sets, or deletes (Delete).
type markChange struct {
	entry.HWM
	Delete bool
}

// loadMarks reads every committed high-water mark into the store's copy.
func (s *Store) loadMarks() error {
	all, err := s.HWMs()
	if err != nil {
		return err
	}
	s.marks = map[string]map[[16]byte]entry.HWM{}
	for _, h := range all {
		s.setMarkLocked(markChange{HWM: h})
	}
	return nil
}

func (s *Store) setMarkLocked(c markChange) {
	m := s.marks[c.Origin]
	if c.Delete {
		delete(m, c.Stream)
		if len(m) == 0 {
			delete(s.marks, c.Origin)
		}
		return
	}
	if m == nil {
		m = map[[16]byte]entry.HWM{}
		s.marks[c.Origin] = m
	}
	m[c.Stream] = c.HWM
}

// hwmsIn appends to out the marks of r in [lower, upper), only those whose
// key is keyLen bytes long when keyLen is not 0 (a longer origin's keys can
// share the range).
func hwmsIn(r pebble.Reader, out []entry.HWM, lower, upper []byte, keyLen int) ([]entry.HWM, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if keyLen != 0 && len(it.Key()) != keyLen {
			continue
		}
		h, err := decodeHWM(it.Key(), it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, it.Error()
}

// SetHWM raises an origin stream's high-water mark in the batch.
func (b *Batch) SetHWM(h entry.HWM) error {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, hwmValueLen), h.Index)
	v = h.Commit.AppendTo(v)
	v = binary.BigEndian.AppendUint64(v, h.Merged)
	v = binary.BigEndian.AppendUint64(v, h.DeadLettered)
	v = binary.BigEndian.AppendUint64(v, h.Seeded)
	if h.Filtered > 0 {
		v = binary.BigEndian.AppendUint64(v, h.Filtered)
	}
	if err := b.pb.Set(hwmKey(h.Origin, h.Stream), v, nil); err != nil {
		return err
	}
	b.marks = append(b.marks, markChange{HWM: h})
	return nil
}

// DeleteHWM forgets an origin stream's high-water mark in the batch (a
// re-seed's one-off snapshot stream, once its trailer committed).
func (b *Batch) DeleteHWM(origin string, stream [16]byte) error {
	if err := b.pb.Delete(hwmKey(origin, stream), nil); err != nil {
		return err
	}
	b.marks = append(b.marks, markChange{HWM: entry.HWM{Origin: origin, Stream: stream}, Delete: true})
	return nil
}

// HWMs lists every origin stream this node has applied entries of.
func (s *Store) HWMs() ([]entry.HWM, error) {
	return hwmsIn(s.db, nil, []byte{prefixHWM}, []byte{prefixHWM + 1}, 0)
}

// Cursor reads the cursor of a peer; ok is false when none was ever stored.
func (s *Store) Cursor(peer string) (c entry.Cursor, ok bool, err error) {
	v, closer, err := s.db.Get(cursorKey(peer))
	if errors.Is(err, pebble.ErrNotFound) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("store: read cursor of %s: %w", peer, err)
	}
	defer closer.Close()
	if len(v) != 24 {
		return c, false, fmt.Errorf("%w: cursor of %s", ErrCorrupt, peer)
	}
	copy(c.Stream[:], v[:16])
	c.Index = binary.BigEndian.Uint64(v[16:])
	return c, true, nil
}

// InitCursor stores a peer's first cursor, synced.
func (s *Store) InitCursor(peer string, c entry.Cursor) error {
	v := append(append(make([]byte, 0, 24), c.Stream[:]...), binary.BigEndian.AppendUint64(nil, c.Index)...)
	if err := s.db.Set(cursorKey(peer), v, pebble.Sync); err != nil {
		return fmt.Errorf("store: write cursor of %s: %w", peer, err)
	}
	return nil
}

// Empty reports whether the tree holds no key, tombstone, range tombstone
// or counter.
func (s *Store) Empty() (bool, error) {
	for _, p := range []byte{prefixData, prefixCounter, prefixRange} {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
		if err != nil {
			return false, err
		}
		found := it.First()
		if err := it.Close(); err != nil {
			return false, err
		}
		if found {
			return false, nil
		}
	}
	return true, nil
}

// SetCursor stores a peer's cursor in the batch.
func (b *Batch) SetCursor(peer string, c entry.Cursor) error {
	return b.pb.Set(cursorKey(peer), append(append(make([]byte, 0, 24), c.Stream[:]...), binary.BigEndian.AppendUint64(nil, c.Index)...), nil)
}

// SetCursor stores a peer's cursor. It is not synced: a cursor that a crash
// takes back only makes the shipper resend what the peer drops as duplicates.
func (s *Store) SetCursor(peer string, c entry.Cursor) error {
	v := append(append(make([]byte, 0, 24), c.Stream[:]...), binary.BigEndian.AppendUint64(nil, c.Index)...)
	if err := s.db.Set(cursorKey(peer), v, pebble.NoSync); err != nil {
		return fmt.Errorf("store: write cursor of %s: %w", peer, err)
	}
	return nil
}

// Re-seed bookkeeping (key spaces R and J, keys.go), kept per peer cluster
// and synced, so that a restart in the middle of a re-seed or a rejoin
// resumes it.

// Flags of a peer's R record (entry.ReseedRequested, entry.AwaitRejoin).
const (
	ReseedRequested = entry.ReseedRequested
	AwaitRejoin     = entry.AwaitRejoin
)

// Phases of this node's rejoin with one peer (its J record).
const (
	// RejoinRequesting: waiting for the peer to record the request, then
	// for its snapshot.
	RejoinRequesting byte = 1
	// RejoinSeeding: the peer's snapshot arrived; this node owes the peer
	// a snapshot of its own (what only this node, or only some peers, had).
	RejoinSeeding byte = 2
)

func peerRecords(db *pebble.DB, prefix byte) (map[string]byte, error) {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := map[string]byte{}
	for valid := it.First(); valid; valid = it.Next() {
		if len(it.Value()) != 1 || len(it.Key()) < 2 {
			return nil, fmt.Errorf("%w: peer record %q", ErrCorrupt, it.Key())
		}
		out[string(it.Key()[1:])] = it.Value()[0]
	}
	return out, it.Error()
}

// ReseedRequests lists the R records (peer -> flags).
func (s *Store) ReseedRequests() (map[string]byte, error) { return peerRecords(s.db, prefixReseedReq) }

// SetReseedRequestIn stores a peer's R flags in the batch (0 deletes).
func (b *Batch) SetReseedRequestIn(peer string, flags byte) error {
	return b.setPeerRecord(reseedReqKey(peer), flags)
}

// ReseedRequest reads one peer's R flags (0 when none) as the batch sees it.
func (b *Batch) ReseedRequest(peer string) (byte, error) {
	return b.peerRecord(reseedReqKey(peer), "re-seed request of "+peer)
}

// Rejoin lists this node's rejoin phases (peer -> phase).
func (s *Store) Rejoin() (map[string]byte, error) { return peerRecords(s.db, prefixRejoin) }

// SetRejoinIn stores the rejoin phase with a peer in the batch (0 deletes).
func (b *Batch) SetRejoinIn(peer string, phase byte) error {
	return b.setPeerRecord(rejoinKey(peer), phase)
}

// RejoinPhase reads the rejoin phase with one peer (0 when none) as the
// batch sees it.
func (b *Batch) RejoinPhase(peer string) (byte, error) {
	return b.peerRecord(rejoinKey(peer), "rejoin phase of "+peer)
}

// setPeerRecord stores a one-byte peer record (0 deletes it).
func (b *Batch) setPeerRecord(k []byte, v byte) error {
	if v == 0 {
		return b.pb.Delete(k, nil)
	}
	return b.pb.Set(k, []byte{v}, nil)
}

// peerRecord reads a one-byte peer record (0 when none).
func (b *Batch) peerRecord(k []byte, what string) (byte, error) {
	v, closer, err := b.s.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	if len(v) != 1 {
		return 0, fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
	return v[0], nil
}

// LinkSettings reads every link's settings the log recorded (L records).
func (s *Store) LinkSettings() (map[string]entry.LinkSettings, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLink}, UpperBound: []byte{prefixLink + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := map[string]entry.LinkSettings{}
	for valid := it.First(); valid; valid = it.Next() {
		var ls entry.LinkSettings
		if err := json.Unmarshal(it.Value(), &ls); err != nil {
			return nil, fmt.Errorf("%w: link settings of %q: %v", ErrCorrupt, it.Key()[1:], err)
		}
		out[string(it.Key()[1:])] = ls
	}
	return out, it.Error()
}

// DeleteCursor forgets a peer's cursor in the batch (the peer was
// removed: the stream is no longer kept for it).
func (b *Batch) DeleteCursor(peer string) error { return b.pb.Delete(cursorKey(peer), nil) }

// SetLinkSettings records one link's settings in the batch.
func (b *Batch) SetLinkSettings(peer string, ls entry.LinkSettings) error {
	v, err := json.Marshal(ls)
	if err != nil {
		return err
	}
	return b.pb.Set(append([]byte{prefixLink}, peer...), v, nil)
}

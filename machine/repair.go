package machine

import (
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// Repairs (docs/ANTIENTROPY.md): versions a node pulled from a peer
// cluster whose tree lacked them, applied with their own stamps and
// origins, merged last-writer-wins (counters by the pointwise maximum of
// their components), outside stream accounting: no high-water mark moves,
// no outbound entry is written. Applying one twice changes nothing the
// second time. The command exists from format 5 on: a leader proposes one
// only once the log's Format says every node reads it (FormatRepair).
//
// The same command with no peer is the test-only divergence: a write or a
// delete that no peer hears of (node Testing.Diverge).

// FormatRepair is the format from which the log may carry repair commands.
const FormatRepair = 5

// FormatRepairJudged is the format from which a repair is applied as an
// inbound batch is judged (issue 45): what its versions discard is judged
// for the conflict log against the peer they came from, so the repairing
// cluster logs the conflicts the other logged; and a live version older
// than the tree's collection horizon, of a key the tree holds nothing of,
// is not taken (a possible resurrection: the tree may have deleted the
// key and collected the tombstone since the comparison judged it). Both
// change what the machine writes, so every node must read the format
// before the log moves to it.
const FormatRepairJudged = 7

// FormatRangePieces is format 7 too: from it a piece of a range delete that
// begins where a kept one of the same stamp does never shrinks the kept
// one (store.Batch.LegacyRangePieces).
const FormatRangePieces = FormatRepairJudged

// FormatOriginFilters is format 7 too: from it the log records each peer's
// own filter toward this cluster (LinkCmd.SetFromPeer), and snapshots'
// relays of a third cluster's writes are kept to that cluster's filter.
const FormatOriginFilters = FormatRepairJudged

// FormatKeptTombstones is format 7 too: from it a collect command keeps,
// per link, the tombstones of the ranges the link's filter held deletes
// back from (CollectCmd.Keep), and a link command may release them
// (LinkCmd.Release).
const FormatKeptTombstones = FormatRepairJudged

// FormatConflictClaims is the format from which a conflict record is
// retired only by its loser's own line (conflict.go follow): a node of an
// older build would retire it on any origin's claim, and the cluster's
// nodes would keep different logs.
const FormatConflictClaims = 8

// FormatRelaysAtApply is format 8 too: from it the state machine leaves out
// a snapshot's relay that the author's recorded filter keeps home, as the
// log says at the apply (inbound.go withheldRelay).
const FormatRelaysAtApply = FormatConflictClaims

// FormatDeletesOfNothing is the format from which a delete of a key that
// holds no value here writes nothing (decide.go DropAbsentDeletes): a node
// of an older build would write a tombstone and a stream entry for it, and
// the cluster's nodes would number their streams differently.
const FormatDeletesOfNothing = 9

// FormatBatchConditions is the format from which a batch may be conditional
// on the versions of keys it need not write (Condition.Keys: a RESP
// transaction's reads and WATCH): an older build does not decode the
// condition.
const FormatBatchConditions = 10

// FormatExpiry is the format from which a set's version may carry an
// expiry (entry.Entry.Expires): an older build refuses the entry's field,
// and the stored record's flag.
const FormatExpiry = 11

// FormatCounterFloors is the format from which a key's plain value and its
// counter read as one (entry.Resolve): a set or delete carries the counter
// totals it observed (entry.Entry.Floors), an increment adds to an integer
// value and clears an expired one (Clears), and counters can be deleted.
// An older build refuses the fields and the counter record's version 2.
const FormatCounterFloors = 12

// FormatStagedSnapshots is the format from which a snapshot's entries (a
// re-seed's, a backfill's) are staged until its trailer and applied with
// it, all in one batch (inbound.go reveal): every node of a cluster must
// show a snapshot's versions at the same index of the log.
const FormatStagedSnapshots = 13

// FormatKeptHome is format 13 too: from it the state machine records the
// ranges a peer's filter kept home from here (filtered markers) until a
// backfill carries them, and takes a rejoin's versions of the peer's own
// there that are older than the collection horizon (inbound.go).
const FormatKeptHome = FormatStagedSnapshots

// FormatConflictAliases is format 13 too: from it a conflict record named
// against a key's new version keeps its earlier IDs as aliases (every node
// of a cluster must hold the same records).
const FormatConflictAliases = FormatStagedSnapshots

// FormatLinkCompression is format 13 too: from it the log may set a link's
// compression (LinkCmd.SetCompression), which a node of an older build
// does not decode.
const FormatLinkCompression = FormatStagedSnapshots

// FormatOpenStreams is the format from which the log records a peer's
// open streams, as its heartbeats tell them (LinkCmd.SetOpen, issue 51):
// tombstone collection then waits for the least advanced of them, where
// before it took the peer's furthest stream.
const FormatOpenStreams = 14

// FormatParts is format 14 too: from it an inbound command may be a part
// of a batch (Inbound.Foreign: the runs other groups of this cluster
// apply), which a node of an older build does not decode (issue 51).
const FormatParts = FormatOpenStreams

// maxRepair bounds the versions of one repair command.
const maxRepair = 1 << 16

// RepairCmd applies versions pulled from Peer.
type RepairCmd struct {
	// Peer is the cluster the versions came from ("": a test's
	// divergence).
	Peer     string
	Versions []wire.TreeVersion
}

// RepairResult says what a repair command did.
type RepairResult struct {
	// Applied counts the versions that changed the tree; Stale those it
	// already held or held newer (a repair that raced replication).
	Applied, Stale int
	// Resurrections counts live versions not taken: older than the
	// tree's collection horizon, of keys it holds nothing of (from
	// FormatRepairJudged).
	Resurrections int
	// Conflicts counts the records the repair added to the conflict log,
	// Superseded those it removed (from FormatRepairJudged).
	Conflicts, Superseded int
}

func encodeRepair(enc *msgpack.Encoder, rc *RepairCmd) error {
	vs, err := msgpack.Marshal(rc.Versions)
	return errors.Join(err, enc.EncodeArrayLen(3), enc.EncodeUint(uint64(KindRepair)), enc.EncodeString(rc.Peer), enc.EncodeBytes(vs))
}

func decodeRepair(dec *msgpack.Decoder, c *Command) error {
	rc := &RepairCmd{}
	var err error
	if rc.Peer, err = dec.DecodeString(); err != nil {
		return err
	}
	if len(rc.Peer) > 63 {
		return fmt.Errorf("repair from %q", rc.Peer)
	}
	raw, err := wire.DecodeBytes(dec)
	if err != nil {
		return err
	}
	if err := msgpack.Unmarshal(raw, &rc.Versions); err != nil {
		return err
	}
	if len(rc.Versions) == 0 || len(rc.Versions) > maxRepair {
		return fmt.Errorf("repair of %d versions", len(rc.Versions))
	}
	for i := range rc.Versions {
		v := &rc.Versions[i]
		if err := v.Check(); err != nil {
			return fmt.Errorf("repair version %d: %v", i, err)
		}
		if !v.Whole {
			return fmt.Errorf("repair version %d has no value", i)
		}
		// One shape per version: what encodes the same decodes the same.
		if len(v.Value) == 0 {
			v.Value = nil
		}
		if len(v.Ctx) == 0 {
			v.Ctx = nil
		}
		if len(v.Totals) == 0 {
			v.Totals = nil
		}
	}
	c.Repair = rc
	return nil
}

// applyRepair merges the versions in the batch.
func (m *Machine) applyRepair(b *store.Batch, rc *RepairCmd) (*Result, error) {
	res := &Result{Repair: &RepairResult{}}
	var high hlc.Timestamp
	for i := range rc.Versions {
		if st := rc.Versions[i].EntryStamp(); high.Less(st.HLC) {
			high = st.HLC
		}
	}
	judged := rc.Peer != "" && m.format.Load() >= FormatRepairJudged
	var collected hlc.Timestamp
	if judged {
		var err error
		if collected, err = m.st.CollectedBelow(); err != nil {
			return nil, err
		}
		// Judged as an inbound batch from the peer is, in place of the
		// local judge ApplyCommand set; the record's time is the newest
		// stamp the repair carried (the command holds no clock reading,
		// and every node must write the same record).
		j := &conflictJudge{b: b, peer: rc.Peer, at: high, collected: collected, valueMax: ConflictValueMax, ownLine: m.format.Load() >= FormatConflictClaims,
			aliases: m.format.Load() >= FormatConflictAliases}
		b.Track(j.judge)
		defer func() { res.Repair.Conflicts, res.Repair.Superseded = j.logged, j.superseded }()
	}
	for i := range rc.Versions {
		v := &rc.Versions[i]
		st := v.EntryStamp()
		if judged && !v.Counter && !v.Tombstone && st.HLC.Less(collected) {
			_, _, held, err := b.Stored(v.Key)
			if err != nil {
				return nil, err
			}
			if !held {
				// It may be a delete this tree collected since the
				// comparison looked: not taken.
				res.Repair.Resurrections++
				continue
			}
		}
		changed := false
		if v.Counter {
			if len(v.Floors) > 0 {
				f := make(map[string]entry.PN, len(v.Floors))
				for _, comp := range v.Floors {
					f[comp.Cluster] = entry.PN{P: comp.P, N: comp.N}
				}
				var err error
				if changed, err = b.MergeFloors(v.Key, f, st); err != nil {
					return nil, err
				}
			}
			for _, comp := range v.Totals {
				out, err := b.MergeCounter(v.Key, comp.Cluster, entry.PN{P: comp.P, N: comp.N}, st)
				if err != nil {
					return nil, err
				}
				changed = changed || out == entry.Applied
			}
		} else {
			w := store.Write{Key: v.Key, Value: v.Value, Tombstone: v.Tombstone, Kind: entry.Kind(v.Kind), Stamp: st, Ctx: v.Context(), Expires: v.Expires}
			out, err := b.Merge(w)
			if err != nil {
				return nil, err
			}
			changed = out == entry.Applied
		}
		if changed {
			res.Repair.Applied++
		} else {
			res.Repair.Stale++
		}
	}
	res.High = high
	return res, nil
}

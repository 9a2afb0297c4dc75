package machine

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/wire"
)

// removalID is a node ID, or a node ID and an incarnation after a dot (an
// empty one for a node known before incarnations).
var removalID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}(\.([0-9a-f]{8})?)?$`)

// maxGroup bounds the proposals of one local command.
const maxGroup = 1 << 16

// Decode decodes a command. Everything is checked before anything is
// applied: unknown versions and kinds, wrong shapes, trailing bytes, and each
// write as the entry codec checks a WAL entry.
func Decode(b []byte) (Command, error) {
	var c Command
	if len(b) == 0 {
		return c, fmt.Errorf("%w: empty", ErrMalformed)
	}
	if b[0] != commandV1 && b[0] != commandV2 {
		return c, fmt.Errorf("%w: version %d (this build reads %d to %d)", ErrMalformed, b[0], commandV1, ReadsFormat)
	}
	rd := bytes.NewReader(b[1:])
	dec := msgpack.NewDecoder(rd)
	if b[0] == commandV2 {
		id, err := decodeID(dec)
		if err != nil {
			return Command{}, fmt.Errorf("%w: proposal id: %v", ErrMalformed, err)
		}
		c.ID = id
	}
	if err := decodeInto(dec, &c); err != nil {
		return Command{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if rd.Len() != 0 {
		return Command{}, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, rd.Len())
	}
	return c, nil
}

func decodeInto(dec *msgpack.Decoder, c *Command) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	k, err := dec.DecodeUint8()
	if err != nil {
		return fmt.Errorf("kind: %v", err)
	}
	kind := Kind(k)
	want := map[Kind]int{KindLocal: 2, KindCursor: 4, KindTruncate: 3, KindMint: 3, KindInbound: 11, KindRecord: 5,
		KindCollect: 4, KindDeadLetter: 5, KindRemoveNode: 2, KindFormat: 2, KindLink: 7, KindRepair: 3, KindPeer: 5, KindGroups: 2}[kind]
	if want == 0 {
		return fmt.Errorf("unknown kind %d", k)
	}
	if kind == KindInbound && n == 12 {
		want = 12 // a part of a batch (FormatParts)
	}
	if kind == KindRemoveNode && n == 3 {
		want = 3 // with its reason
	}
	if kind == KindLink && n == 8 {
		want = 8 // with the peer's onward ranges (format 7)
	}
	if kind == KindCollect && (n == 6 || n == 7) {
		want = n // with the conflict log's retention (format 4), and the ranges kept (format 7)
	}
	if n != want {
		return fmt.Errorf("%s: array of %d elements, want %d", kind, n, want)
	}
	switch kind {
	case KindLocal:
		m, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if m < 1 || m > maxGroup {
			return fmt.Errorf("local group of %d writes", m)
		}
		codec := wire.NewCodec()
		c.Local = make([]Proposal, 0, min(m, 256))
		for i := 0; i < m; i++ {
			p, err := decodeProposal(dec, codec)
			if err != nil {
				return fmt.Errorf("write %d: %v", i, err)
			}
			c.Local = append(c.Local, p)
		}
	case KindCursor:
		cc := &CursorCmd{}
		if cc.Peer, err = dec.DecodeString(); err != nil {
			return err
		}
		if cc.Peer == "" || len(cc.Peer) > 63 {
			return fmt.Errorf("cursor of peer %q", cc.Peer)
		}
		if err := decodeStream(dec, (*entry.StreamID)(&cc.At.Stream)); err != nil {
			return err
		}
		if cc.At.Index, err = dec.DecodeUint64(); err != nil {
			return err
		}
		c.Cursor = cc
	case KindTruncate:
		tc := &TruncateCmd{}
		if tc.First, err = dec.DecodeUint64(); err != nil {
			return err
		}
		if err := decodeStream(dec, &tc.Stream); err != nil {
			return err
		}
		c.Truncate = tc
	case KindMint:
		mc := &MintCmd{}
		if err := decodeStream(dec, &mc.Stream); err != nil {
			return err
		}
		if mc.Stream.IsZero() {
			return errors.New("mint of a zero stream")
		}
		if mc.Epoch, err = dec.DecodeUint32(); err != nil {
			return err
		}
		c.Mint = mc
	case KindInbound:
		return decodeInbound(dec, c, n)
	case KindRecord:
		rc := &RecordCmd{}
		if rc.Peer, err = dec.DecodeString(); err != nil {
			return err
		}
		if rc.Peer == "" || len(rc.Peer) > 63 {
			return fmt.Errorf("record of peer %q", rc.Peer)
		}
		for _, f := range []*byte{&rc.Record, &rc.Expect, &rc.Set} {
			if *f, err = dec.DecodeUint8(); err != nil {
				return err
			}
		}
		if rc.Record != RecordReseed && rc.Record != RecordRejoin {
			return fmt.Errorf("record %q", rc.Record)
		}
		c.Record = rc
	case KindCollect:
		cc := &CollectCmd{}
		hb, err := wire.DecodeBytes(dec)
		if err != nil {
			return err
		}
		if cc.Cutoff, err = hlc.Decode(hb); err != nil {
			return err
		}
		if cc.IdemBefore, err = dec.DecodeInt64(); err != nil {
			return err
		}
		m, err := dec.DecodeInt64()
		if err != nil {
			return err
		}
		if m < 1 || m > maxCollect {
			return fmt.Errorf("collect of at most %d", m)
		}
		cc.Max = int(m)
		if n >= 6 {
			hb, err := wire.DecodeBytes(dec)
			if err != nil {
				return err
			}
			if cc.ConflictsBefore, err = hlc.Decode(hb); err != nil {
				return err
			}
			if cc.ConflictsMaxBytes, err = dec.DecodeInt64(); err != nil {
				return err
			}
			if (n == 6 && !cc.hasConflicts()) || cc.ConflictsMaxBytes < 0 {
				return errors.New("collect with an empty conflict retention")
			}
		}
		if n == 7 {
			if cc.Keep, err = decodeKeep(dec); err != nil {
				return err
			}
		}
		c.Collect = cc
	case KindDeadLetter:
		dc := &DeadLetterCmd{}
		if dc.Origin, err = dec.DecodeString(); err != nil {
			return err
		}
		if dc.Origin == "" || len(dc.Origin) > 63 {
			return fmt.Errorf("dead letter of origin %q", dc.Origin)
		}
		if err := decodeStream(dec, &dc.Stream); err != nil {
			return err
		}
		if dc.Index, err = dec.DecodeUint64(); err != nil {
			return err
		}
		if dc.Action, err = dec.DecodeUint8(); err != nil {
			return err
		}
		if dc.Action != DeadReplay && dc.Action != DeadDiscard {
			return fmt.Errorf("dead-letter action %d", dc.Action)
		}
		c.DeadLetter = dc
	case KindRemoveNode:
		rc := &RemoveNodeCmd{}
		if rc.ID, err = dec.DecodeString(); err != nil {
			return err
		}
		if !removalID.MatchString(rc.ID) {
			return fmt.Errorf("removal of node %q", rc.ID)
		}
		if n == 3 {
			if rc.Why, err = dec.DecodeUint8(); err != nil {
				return err
			}
			// The reasons only this shape carries (an operator's removal is
			// the two-element shape): one encoding per command.
			if rc.Why < 2 || rc.Why > 3 {
				return fmt.Errorf("removal reason %d", rc.Why)
			}
		}
		c.RemoveNode = rc
	case KindFormat:
		v, err := dec.DecodeUint8()
		if err != nil {
			return err
		}
		if v < commandV2 || v > ReadsFormat {
			return fmt.Errorf("format %d (this build reads %d to %d)", v, commandV1, ReadsFormat)
		}
		c.Format = &FormatCmd{Version: v}
	case KindLink:
		return decodeLink(dec, c, n)
	case KindRepair:
		return decodeRepair(dec, c)
	case KindPeer:
		return decodePeer(dec, c)
	case KindGroups:
		b, err := wire.DecodeBytes(dec)
		if err != nil {
			return err
		}
		m, err := slot.Decode(b)
		if err != nil {
			return err
		}
		c.Groups = &GroupsCmd{Map: m}
	}
	return nil
}

func decodeInbound(dec *msgpack.Decoder, c *Command, fields int) error {
	in := &Inbound{}
	var err error
	if in.Sender, err = dec.DecodeString(); err != nil {
		return err
	}
	if in.Sender == "" || len(in.Sender) > 63 {
		return fmt.Errorf("inbound from %q", in.Sender)
	}
	raw, err := wire.DecodeBytes(dec)
	if err != nil {
		return err
	}
	if in.Batch, err = wire.DecodeBatch(raw); err != nil {
		return err
	}
	if in.Batch.Sender != in.Sender {
		return fmt.Errorf("a batch of %q from %q", in.Batch.Sender, in.Sender)
	}
	in.Raw = raw
	sets := [2]map[uint64]bool{}
	for s := range sets {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if n < 0 || n > len(in.Batch.Entries) {
			return fmt.Errorf("an index set of %d for %d entries", n, len(in.Batch.Entries))
		}
		if n > 0 {
			sets[s] = make(map[uint64]bool, n)
		}
		for j := 0; j < n; j++ {
			i, err := dec.DecodeUint64()
			if err != nil {
				return err
			}
			sets[s][i] = true
		}
	}
	in.Own, in.Unknown = sets[0], sets[1]
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 || n > len(in.Batch.Entries) {
		return fmt.Errorf("%d dead letters for %d entries", n, len(in.Batch.Entries))
	}
	if n > 0 {
		in.Dead = make(map[uint64]string, n)
	}
	for j := 0; j < n; j++ {
		i, err := dec.DecodeUint64()
		if err != nil {
			return err
		}
		if in.Dead[i], err = dec.DecodeString(); err != nil {
			return err
		}
	}
	if in.At, err = dec.DecodeInt64(); err != nil {
		return err
	}
	hb, err := wire.DecodeBytes(dec)
	if err != nil {
		return err
	}
	if in.HLC, err = hlc.Decode(hb); err != nil {
		return err
	}
	ms, err := dec.DecodeInt64()
	if err != nil {
		return err
	}
	if ms < 1 || ms > 1<<20 {
		return fmt.Errorf("max streams %d", ms)
	}
	in.MaxStreams = int(ms)
	if n, err = dec.DecodeArrayLen(); err != nil {
		return err
	}
	if n != len(in.Batch.Marks) {
		return fmt.Errorf("%d known flags for %d marks", n, len(in.Batch.Marks))
	}
	for j := 0; j < n; j++ {
		k, err := dec.DecodeBool()
		if err != nil {
			return err
		}
		in.KnownMarks = append(in.KnownMarks, k)
	}
	code, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if code == msgpcode.Nil {
		err = dec.DecodeNil()
	} else {
		var vm int64
		if vm, err = dec.DecodeInt64(); err == nil && (vm < 1 || vm > 64<<20) {
			err = fmt.Errorf("conflict value bound %d", vm)
		}
		in.ConflictValueMax = int(vm)
	}
	if err != nil {
		return fmt.Errorf("a field this version does not know: %v", err)
	}
	if fields == 12 {
		if in.Foreign, err = decodeForeign(dec, in.Batch); err != nil {
			return fmt.Errorf("foreign runs: %w", err)
		}
	}
	c.Inbound = in
	return nil
}

// decodeForeign reads a part's foreign runs: 1 or more, each From <= To,
// in order and disjoint, none holding an index of the batch's entries
// (a marker's run included).
func decodeForeign(dec *msgpack.Decoder, bt *wire.Batch) ([]wire.ForeignRun, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > wire.MaxBatchEntries {
		return nil, fmt.Errorf("%d runs", n)
	}
	out := make([]wire.ForeignRun, n)
	ents := bt.Entries
	for i := range out {
		if m, err := dec.DecodeArrayLen(); err != nil || m != 4 {
			return nil, fmt.Errorf("run %d: want an array of 4 (%v)", i, err)
		}
		r := &out[i]
		if r.From, err = dec.DecodeUint64(); err != nil {
			return nil, err
		}
		if r.To, err = dec.DecodeUint64(); err != nil {
			return nil, err
		}
		if r.Commit.Wall, err = dec.DecodeInt64(); err != nil {
			return nil, err
		}
		if r.Commit.Logical, err = dec.DecodeUint32(); err != nil {
			return nil, err
		}
		if r.From == 0 || r.To < r.From || (i > 0 && r.From <= out[i-1].To) {
			return nil, fmt.Errorf("run %d [%d, %d] out of order", i, r.From, r.To)
		}
		for len(ents) > 0 && ents[0].Last() < r.From {
			ents = ents[1:]
		}
		if len(ents) > 0 && ents[0].Index <= r.To {
			return nil, fmt.Errorf("run %d [%d, %d] holds entry %d", i, r.From, r.To, ents[0].Index)
		}
	}
	return out, nil
}

func decodeStream(dec *msgpack.Decoder, s *entry.StreamID) error {
	b, err := wire.DecodeBytes(dec)
	if err != nil {
		return err
	}
	if len(b) != len(s) {
		return fmt.Errorf("stream of %d bytes", len(b))
	}
	copy(s[:], b)
	return nil
}

func decodeProposal(dec *msgpack.Decoder, codec *wire.Codec) (Proposal, error) {
	var p Proposal
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return p, err
	}
	if n != 4 {
		return p, fmt.Errorf("array of %d elements, want 4", n)
	}
	raw, err := wire.DecodeBytes(dec)
	if err != nil {
		return p, err
	}
	if p.Entry, err = codec.DecodeEntry(raw, placeholder); err != nil {
		return p, err
	}
	if p.Entry.Index != 1 || p.Entry.Origin != placeholder.Origin || p.Entry.Stream != placeholder.Stream || p.Entry.Idem != nil || p.Entry.CtrComp != "" ||
		p.Entry.Oversize != 0 || p.Entry.StampOrigin != "" {
		return p, errors.New("entry with fields the machine assigns")
	}
	p.Entry.Index, p.Entry.Origin, p.Entry.Stream = 0, "", entry.StreamID{}
	if p.Entry.Op == entry.OpCounter {
		if *p.Entry.Ctr != (entry.PN{}) {
			return p, errors.New("increment with totals")
		}
		p.Entry.Ctr = nil
	}
	if n, err := decodeNilOrArray(dec); err != nil {
		return p, fmt.Errorf("condition: %v", err)
	} else if n >= 0 {
		if n != 2 && n != 3 {
			return p, fmt.Errorf("condition of %d elements", n)
		}
		p.Cond = &Condition{}
		if p.Cond.IfMatch, err = dec.DecodeString(); err != nil {
			return p, err
		}
		if p.Cond.IfNoneMatch, err = dec.DecodeBool(); err != nil {
			return p, err
		}
		if n == 3 {
			if p.Cond.Keys, err = decodeKeyVersions(dec); err != nil {
				return p, fmt.Errorf("condition: %v", err)
			}
			if p.Entry.Op != entry.OpMulti {
				return p, fmt.Errorf("a condition on keys' versions on %s", p.Entry.Op)
			}
		}
	}
	if p.Delta, err = dec.DecodeInt64(); err != nil {
		return p, fmt.Errorf("delta: %v", err)
	}
	if p.Delta != 0 && p.Entry.Op != entry.OpCounter {
		return p, fmt.Errorf("a delta on %s", p.Entry.Op)
	}
	if n, err := decodeNilOrArray(dec); err != nil {
		return p, fmt.Errorf("keyed: %v", err)
	} else if n >= 0 {
		if n != 5 {
			return p, fmt.Errorf("keyed of %d elements", n)
		}
		k := &Keyed{}
		if k.Key, err = dec.DecodeString(); err != nil {
			return p, err
		}
		if k.Key == "" || len(k.Key) > entry.MaxIdemKey+3 { // "op:" + an operation ID
			return p, fmt.Errorf("idempotency key of %d bytes", len(k.Key))
		}
		if k.Fingerprint, err = wire.DecodeBytes(dec); err != nil {
			return p, err
		}
		var a uint8
		if a, err = dec.DecodeUint8(); err != nil {
			return p, err
		}
		if k.Answer = AnswerKind(a); k.Answer == 0 || k.Answer >= answerKinds {
			return p, fmt.Errorf("answer kind %d", a)
		}
		if k.OpID, err = dec.DecodeString(); err != nil {
			return p, err
		}
		if k.Expires, err = dec.DecodeInt64(); err != nil {
			return p, err
		}
		p.Keyed = k
	}
	return p, nil
}

// decodeKeyVersions decodes a condition's keys and versions: a flat array
// of pairs, at least one.
func decodeKeyVersions(dec *msgpack.Decoder) ([]api.KeyVersion, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 2 || n%2 != 0 || n > 2*api.MaxConditionKeys {
		return nil, fmt.Errorf("keys array of %d elements", n)
	}
	kvs := make([]api.KeyVersion, n/2)
	for i := range kvs {
		if kvs[i].Key, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if kvs[i].Version, err = dec.DecodeString(); err != nil {
			return nil, err
		}
	}
	return kvs, nil
}

// decodeNilOrArray returns -1 for nil, else the array's length.
func decodeNilOrArray(dec *msgpack.Decoder) (int, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == 0xc0 { // msgpack nil
		return -1, dec.DecodeNil()
	}
	n, err := dec.DecodeArrayLen()
	if err == nil && n < 0 {
		err = errors.New("nil array")
	}
	return n, err
}

// decodeKeep reads a collect command's kept ranges: at least one link,
// each a valid peer with sorted, disjoint, non-empty ranges.
func decodeKeep(dec *msgpack.Decoder) ([]KeepRanges, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 1 || n > maxPeersKept {
		return nil, fmt.Errorf("collect keeping ranges of %d links", n)
	}
	out := make([]KeepRanges, 0, n)
	for i := 0; i < n; i++ {
		fields, err := dec.DecodeArrayLen()
		if err != nil || (fields != 2 && fields != 3) {
			return nil, fmt.Errorf("kept ranges %d: %v (%d elements)", i, err, fields)
		}
		var k KeepRanges
		if k.Peer, err = dec.DecodeString(); err != nil {
			return nil, err
		}
		if fields == 3 {
			if k.Origin, err = dec.DecodeString(); err != nil {
				return nil, err
			}
			if !entry.ValidClusterID(k.Origin) || k.Origin == k.Peer {
				return nil, fmt.Errorf("kept ranges of peer %q for origin %q", k.Peer, k.Origin)
			}
		}
		if !entry.ValidClusterID(k.Peer) || (i > 0 && !out[i-1].before(k)) {
			return nil, fmt.Errorf("kept ranges of peer %q origin %q (after %d links)", k.Peer, k.Origin, i)
		}
		if k.Spans, err = wire.DecodeSpanList(dec, maxKeepSpans); err != nil {
			return nil, fmt.Errorf("kept ranges of %s: %w", k.Peer, err)
		}
		out = append(out, k)
	}
	return out, nil
}

// maxPeersKept bounds the links a collect command keeps ranges for.
const maxPeersKept = 256

package machine

import (
	"bytes"
	"errors"
	"fmt"
	"sort"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/wire"
)

// A proposal's entry is encoded with the entry codec, so that it is checked
// as a WAL entry is; its identity is the machine's to assign, so it is
// encoded with placeholders the codec accepts (and leaves out).
var placeholder = wire.Defaults{Origin: "-", Stream: entry.StreamID{0: 1}}

// Encoder encodes commands, keeping its buffers between calls; not safe for
// concurrent use.
type Encoder struct {
	buf   bytes.Buffer
	enc   *msgpack.Encoder
	codec *wire.Codec
	ent   []byte
}

// NewEncoder returns an encoder.
func NewEncoder() *Encoder {
	e := &Encoder{codec: wire.NewCodec()}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// Encode returns c's bytes (a new slice) in encoding 1, or 2 when c has
// an ID.
func (e *Encoder) Encode(c *Command) ([]byte, error) {
	e.buf.Reset()
	enc := e.enc
	var err error
	if c.ID.IsZero() {
		e.buf.WriteByte(commandV1)
	} else {
		e.buf.WriteByte(commandV2)
		err = errors.Join(enc.EncodeArrayLen(3), enc.EncodeString(c.ID.Node), enc.EncodeUint(c.ID.Process), enc.EncodeUint(c.ID.Seq))
	}
	kind := c.Kind()
	switch kind {
	case KindLocal:
		err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeUint(uint64(kind)), enc.EncodeArrayLen(len(c.Local)))
		for i := range c.Local {
			err = errors.Join(err, e.encodeProposal(&c.Local[i]))
		}
	case KindCursor:
		cc := c.Cursor
		err = errors.Join(err, enc.EncodeArrayLen(4), enc.EncodeUint(uint64(kind)), enc.EncodeString(cc.Peer),
			enc.EncodeBytes(cc.At.Stream[:]), enc.EncodeUint(cc.At.Index))
	case KindTruncate:
		tc := c.Truncate
		err = errors.Join(err, enc.EncodeArrayLen(3), enc.EncodeUint(uint64(kind)), enc.EncodeUint(tc.First), enc.EncodeBytes(tc.Stream[:]))
	case KindMint:
		mc := c.Mint
		err = errors.Join(err, enc.EncodeArrayLen(3), enc.EncodeUint(uint64(kind)), enc.EncodeBytes(mc.Stream[:]),
			enc.EncodeUint(uint64(mc.Epoch)))
	case KindInbound:
		err = errors.Join(err, e.encodeInbound(c.Inbound))
	case KindRecord:
		rc := c.Record
		err = errors.Join(err, enc.EncodeArrayLen(5), enc.EncodeUint(uint64(kind)), enc.EncodeString(rc.Peer),
			enc.EncodeUint(uint64(rc.Record)), enc.EncodeUint(uint64(rc.Expect)), enc.EncodeUint(uint64(rc.Set)))
	case KindCollect:
		cc := c.Collect
		cut := cc.Cutoff.Encode()
		fields := 4
		if cc.hasConflicts() {
			fields = 6 // from format 4
		}
		if len(cc.Keep) > 0 {
			fields = 7 // from format 7
		}
		err = errors.Join(err, enc.EncodeArrayLen(fields), enc.EncodeUint(uint64(kind)), enc.EncodeBytes(cut[:]),
			enc.EncodeInt(cc.IdemBefore), enc.EncodeInt(int64(cc.Max)))
		if cc.hasConflicts() {
			before := cc.ConflictsBefore.Encode()
			err = errors.Join(err, enc.EncodeBytes(before[:]), enc.EncodeInt(cc.ConflictsMaxBytes))
		}
		if len(cc.Keep) > 0 {
			err = errors.Join(err, enc.EncodeArrayLen(len(cc.Keep)))
			for _, k := range cc.Keep {
				if k.Origin == "" {
					err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeString(k.Peer))
				} else {
					err = errors.Join(err, enc.EncodeArrayLen(3), enc.EncodeString(k.Peer), enc.EncodeString(k.Origin))
				}
				err = errors.Join(err, enc.EncodeArrayLen(2*len(k.Spans)))
				for _, sp := range k.Spans {
					err = errors.Join(err, enc.EncodeString(sp.Start), enc.EncodeString(sp.End))
				}
			}
		}
	case KindDeadLetter:
		dc := c.DeadLetter
		err = errors.Join(err, enc.EncodeArrayLen(5), enc.EncodeUint(uint64(kind)), enc.EncodeString(dc.Origin),
			enc.EncodeBytes(dc.Stream[:]), enc.EncodeUint(dc.Index), enc.EncodeUint(uint64(dc.Action)))
	case KindRemoveNode:
		rc := c.RemoveNode
		if rc.Why <= 1 {
			// The shape every build reads (an operator's removal).
			err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeUint(uint64(kind)), enc.EncodeString(rc.ID))
		} else {
			err = errors.Join(err, enc.EncodeArrayLen(3), enc.EncodeUint(uint64(kind)), enc.EncodeString(rc.ID), enc.EncodeUint(uint64(rc.Why)))
		}
	case KindFormat:
		err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeUint(uint64(kind)), enc.EncodeUint(uint64(c.Format.Version)))
	case KindLink:
		err = errors.Join(err, encodeLink(enc, c.Link))
	case KindRepair:
		err = errors.Join(err, encodeRepair(enc, c.Repair))
	case KindPeer:
		err = errors.Join(err, encodePeer(enc, c.Peer))
	case KindGroups:
		err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeUint(uint64(kind)), enc.EncodeBytes(c.Groups.Map.AppendTo(nil)))
	default:
		return nil, fmt.Errorf("machine: encode: a command of no one kind")
	}
	if err != nil {
		return nil, fmt.Errorf("machine: encode %s: %w", kind, err)
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

func (e *Encoder) encodeProposal(p *Proposal) error {
	ent := p.Entry
	ent.Index, ent.Origin, ent.Stream, ent.Idem, ent.CtrComp = 1, placeholder.Origin, placeholder.Stream, nil, ""
	if ent.Op == entry.OpCounter {
		ent.Ctr = &entry.PN{}
	}
	e.ent = e.codec.AppendEntry(e.ent[:0], &ent, placeholder)
	enc := e.enc
	err := errors.Join(enc.EncodeArrayLen(4), enc.EncodeBytes(e.ent))
	switch c := p.Cond; {
	case c == nil:
		err = errors.Join(err, enc.EncodeNil())
	case len(c.Keys) == 0:
		// The shape every build reads.
		err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeString(c.IfMatch), enc.EncodeBool(c.IfNoneMatch))
	default:
		// From format 10 (FormatBatchConditions).
		err = errors.Join(err, enc.EncodeArrayLen(3), enc.EncodeString(c.IfMatch), enc.EncodeBool(c.IfNoneMatch),
			enc.EncodeArrayLen(2*len(c.Keys)))
		for _, k := range c.Keys {
			err = errors.Join(err, enc.EncodeString(k.Key), enc.EncodeString(k.Version))
		}
	}
	err = errors.Join(err, enc.EncodeInt(p.Delta))
	if k := p.Keyed; k == nil {
		err = errors.Join(err, enc.EncodeNil())
	} else {
		err = errors.Join(err, enc.EncodeArrayLen(5), enc.EncodeString(k.Key), enc.EncodeBytes(k.Fingerprint),
			enc.EncodeUint(uint64(k.Answer)), enc.EncodeString(k.OpID), enc.EncodeInt(k.Expires))
	}
	return err
}

func (e *Encoder) encodeInbound(in *Inbound) error {
	if in.Batch == nil {
		return errors.New("no batch")
	}
	raw := in.Raw
	if raw == nil {
		raw = wire.EncodeBatch(in.Batch)
	}
	enc := e.enc
	fields := 11
	if len(in.Foreign) > 0 {
		fields = 12 // a part of a batch: its foreign runs, last
	}
	err := errors.Join(enc.EncodeArrayLen(fields), enc.EncodeUint(uint64(KindInbound)), enc.EncodeString(in.Sender), enc.EncodeBytes(raw))
	for _, set := range []map[uint64]bool{in.Own, in.Unknown} {
		idx := sortedIndexes(set)
		err = errors.Join(err, enc.EncodeArrayLen(len(idx)))
		for _, i := range idx {
			err = errors.Join(err, enc.EncodeUint(i))
		}
	}
	dead := make([]uint64, 0, len(in.Dead))
	for i := range in.Dead {
		dead = append(dead, i)
	}
	sort.Slice(dead, func(a, b int) bool { return dead[a] < dead[b] })
	err = errors.Join(err, enc.EncodeArrayLen(len(dead)))
	for _, i := range dead {
		err = errors.Join(err, enc.EncodeUint(i), enc.EncodeString(in.Dead[i]))
	}
	hlcb := in.HLC.Encode()
	err = errors.Join(err, enc.EncodeInt(in.At), enc.EncodeBytes(hlcb[:]), enc.EncodeInt(int64(in.MaxStreams)),
		enc.EncodeArrayLen(len(in.KnownMarks)))
	for _, k := range in.KnownMarks {
		err = errors.Join(err, enc.EncodeBool(k))
	}
	// Reserved for what a later version adds, so that an older one
	// refuses it instead of skipping it: nil, or from format 4 the
	// conflict log's value bound.
	if in.ConflictValueMax > 0 {
		err = errors.Join(err, enc.EncodeInt(int64(in.ConflictValueMax)))
	} else {
		err = errors.Join(err, enc.EncodeNil())
	}
	if len(in.Foreign) > 0 {
		err = errors.Join(err, enc.EncodeArrayLen(len(in.Foreign)))
		for _, r := range in.Foreign {
			err = errors.Join(err, enc.EncodeArrayLen(4), enc.EncodeUint(r.From), enc.EncodeUint(r.To),
				enc.EncodeInt(r.Commit.Wall), enc.EncodeUint(uint64(r.Commit.Logical)))
		}
	}
	return err
}

package machine

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"sort"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// Commands are what the cluster's log carries: every mutation of a
// cluster's state is one, applied by every node in log order. A command is
// a version byte and a msgpack array whose first element is its kind;
// version 2 puts the proposal's ID between the two (proposal.go).

// ErrMalformed is the class of errors for command bytes that do not decode:
// the log is checksummed, so on a node these are corruption or a command of
// a newer version, and applying past it is never safe.
var ErrMalformed = errors.New("machine: malformed command")

// Command encodings. Version 1 is what every build reads; version 2 adds the
// proposal's ID. A leader writes version 2 only once the log says every
// node reads it (a Format command, proposal.go).
const (
	commandV1 = 1
	commandV2 = 2
	// ReadsFormat is the newest encoding this build reads.
	ReadsFormat = commandV2
)

// Kind names a command.
type Kind uint8

const (
	// KindLocal is a group of local writes, stamped by the leader.
	KindLocal Kind = iota + 1
	// KindCursor records that a peer acknowledged the stream through an
	// index.
	KindCursor
	// KindTruncate drops the outbound entries before an index (every peer
	// acknowledged them).
	KindTruncate
	// KindMint starts the cluster's stream (and seals the one before it):
	// at bootstrap, and after a lost majority.
	KindMint
	// KindInbound is a peer's batch the acceptor admitted.
	KindInbound
	// KindRecord changes a peer's re-seed request flags (R) or this
	// node's rejoin phase with it (J), if it still holds what the proposer
	// read (compare and set).
	KindRecord
	// KindCollect drops tombstones stamped below a cutoff and idempotency
	// records expired before a time (the leader decides both from what
	// every peer holds; every node drops the same).
	KindCollect
	// KindDeadLetter replays or discards a dead letter (an operator's
	// decision).
	KindDeadLetter
	// KindRemoveNode records that a node was removed from the cluster (a
	// node ID: every incarnation of it) or that one incarnation of a node
	// is out for good (replaced by a newer one, or lost in a recovery): it
	// is never added back.
	KindRemoveNode
	// KindFormat records the command encoding every node reads from now on.
	KindFormat
	kinds
)

func (k Kind) String() string {
	switch k {
	case KindLocal:
		return "local"
	case KindCursor:
		return "cursor"
	case KindTruncate:
		return "truncate"
	case KindMint:
		return "mint"
	case KindInbound:
		return "inbound"
	case KindRecord:
		return "record"
	case KindCollect:
		return "collect"
	case KindDeadLetter:
		return "dead_letter"
	case KindRemoveNode:
		return "remove_node"
	case KindFormat:
		return "format"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Command is one entry of the cluster's log. Exactly one of its fields
// besides ID is set, and names its kind (etcd's InternalRaftRequest).
type Command struct {
	// ID names the proposal (encoding 2): the node that proposed it finds
	// the command it built by it when raft hands the entry back. Zero in a
	// command of encoding 1.
	ID ProposalID

	// Local is a group of local writes in the order the leader stamped
	// them.
	Local []Proposal
	// Cursor records that a peer acknowledged the stream through an index.
	Cursor *CursorCmd
	// Truncate drops outbound entries every peer acknowledged.
	Truncate *TruncateCmd
	// Mint starts the cluster's stream (and seals the one before it).
	Mint *MintCmd
	// Inbound is a peer's batch the acceptor admitted.
	Inbound *Inbound
	// Record changes a peer record if it holds what the proposer read.
	Record *RecordCmd
	// Collect drops tombstones and expired idempotency records.
	Collect *CollectCmd
	// DeadLetter replays or discards a dead letter.
	DeadLetter *DeadLetterCmd
	// RemoveNode records a node (or one incarnation) out for good.
	RemoveNode *RemoveNodeCmd
	// Format records the command encoding every node reads from now on.
	Format *FormatCmd
}

// Kind is the kind the set field names (0 when none or several are set).
func (c *Command) Kind() Kind {
	k, n := Kind(0), 0
	for _, f := range []struct {
		set  bool
		kind Kind
	}{
		{len(c.Local) > 0, KindLocal}, {c.Cursor != nil, KindCursor}, {c.Truncate != nil, KindTruncate},
		{c.Mint != nil, KindMint}, {c.Inbound != nil, KindInbound}, {c.Record != nil, KindRecord},
		{c.Collect != nil, KindCollect}, {c.DeadLetter != nil, KindDeadLetter}, {c.RemoveNode != nil, KindRemoveNode},
		{c.Format != nil, KindFormat},
	} {
		if f.set {
			k, n = f.kind, n+1
		}
	}
	if n != 1 {
		return 0
	}
	return k
}

// CursorCmd: Peer acknowledged the stream At.Stream through At.Index.
type CursorCmd struct {
	Peer string
	At   entry.Cursor
}

// TruncateCmd: the outbound entries of Stream before First go (nothing,
// when Stream is no longer the current stream).
type TruncateCmd struct {
	Stream entry.StreamID
	First  uint64
}

// MintCmd: the new stream, and the counter epoch it counts under.
type MintCmd struct {
	Stream entry.StreamID
	Epoch  uint32
}

// RecordCmd: Peer's record Record (RecordReseed or RecordRejoin) is set to
// Set if it holds Expect (0: no record).
type RecordCmd struct {
	Peer                string
	Record, Expect, Set byte
}

// CollectCmd: tombstones stamped below Cutoff (zero: none) and idempotency
// records expired before IdemBefore (0: none) go, at most Max of each.
type CollectCmd struct {
	Cutoff     hlc.Timestamp
	IdemBefore int64
	Max        int
}

// DeadLetterCmd: the dead letter of Origin's Stream at Index is replayed
// (Action DeadReplay) or discarded (DeadDiscard).
type DeadLetterCmd struct {
	Origin string
	Stream entry.StreamID
	Index  uint64
	Action byte
}

// RemoveNodeCmd: ID is a node ID (every incarnation of it), or a raft server
// ID ("node.inc"; "node." for a node known before incarnations) for one
// incarnation; Why is a cluster.Removal (0 or 1: an operator's removal).
type RemoveNodeCmd struct {
	ID  string
	Why byte
}

// FormatCmd: every command from the next on may be of encoding Version.
type FormatCmd struct {
	Version uint8
}

// Dead-letter actions (DeadLetterCmd.Action).
const (
	DeadReplay  byte = 1
	DeadDiscard byte = 2
)

// maxCollect bounds what one collect command drops of each kind.
const maxCollect = 1 << 20

// The peer records a KindRecord command changes.
const (
	RecordReseed byte = 'R'
	RecordRejoin byte = 'J'
)

// Proposal is one local write of a group.
type Proposal struct {
	// Entry is the write: op, key, value, end, ops, and its stamps (Commit,
	// and Stamp when the caller pinned one). Origin, stream, index, a
	// counter's totals and the idempotency record are the machine's to
	// fill.
	Entry entry.Entry
	// Cond is a precondition (nil: none).
	Cond *Condition
	// Delta is an increment (op counter).
	Delta int64
	// Keyed is the request's idempotency key (nil: none).
	Keyed *Keyed
}

// Keyed is a request that carries an idempotency key.
type Keyed struct {
	Key         string
	Fingerprint []byte
	Answer      AnswerKind
	OpID        string // a batch's operation ID, for its answer
	// Expires is when the record may be collected (wall ns): the leader's
	// commit stamp plus the window, fixed in the command so every node
	// records the same.
	Expires int64
}

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
		err = errors.Join(err, enc.EncodeArrayLen(4), enc.EncodeUint(uint64(kind)), enc.EncodeBytes(cut[:]),
			enc.EncodeInt(cc.IdemBefore), enc.EncodeInt(int64(cc.Max)))
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
	if p.Cond == nil {
		err = errors.Join(err, enc.EncodeNil())
	} else {
		err = errors.Join(err, enc.EncodeArrayLen(2), enc.EncodeString(p.Cond.IfMatch), enc.EncodeBool(p.Cond.IfNoneMatch))
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
	err := errors.Join(enc.EncodeArrayLen(11), enc.EncodeUint(uint64(KindInbound)), enc.EncodeString(in.Sender), enc.EncodeBytes(raw))
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
	// Reserved for what a later version adds, so that this one refuses it
	// instead of skipping it: always nil now.
	return errors.Join(err, enc.EncodeNil())
}

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
		KindCollect: 4, KindDeadLetter: 5, KindRemoveNode: 2, KindFormat: 2}[kind]
	if want == 0 {
		return fmt.Errorf("unknown kind %d", k)
	}
	if kind == KindRemoveNode && n == 3 {
		want = 3 // with its reason
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
		return decodeInbound(dec, c)
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
	}
	return nil
}

func decodeInbound(dec *msgpack.Decoder, c *Command) error {
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
	if err := dec.DecodeNil(); err != nil {
		return fmt.Errorf("a field this version does not know: %v", err)
	}
	c.Inbound = in
	return nil
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
		if n != 2 {
			return p, fmt.Errorf("condition of %d elements", n)
		}
		p.Cond = &Condition{}
		if p.Cond.IfMatch, err = dec.DecodeString(); err != nil {
			return p, err
		}
		if p.Cond.IfNoneMatch, err = dec.DecodeBool(); err != nil {
			return p, err
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

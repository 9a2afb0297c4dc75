package machine

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/vmihailenco/msgpack/v5"
)

// Proposal IDs. Raft hands a leader's state machine back the bytes it was
// given, and the leader applies the command it built instead of decoding
// those bytes again (a peer's batch was decoded once already, to admit it).
// The command is found by the ID it carries, unique across leaders and
// restarts: the proposing node, a random value of its process, and a
// counter. (Before IDs, the lookup was by the address of raft's byte slice,
// which holds only while raft hands back the very same slice.)
//
// The ID rides in encoding 2, which a build before it cannot read: a leader
// writes it only after a Format command said every node reads it, and it
// proposes that command only once every member of the configuration says
// it reads encoding 2 (node's term). Until then commands are of encoding 1
// and every node, the leader too, decodes them.

// ProposalID names one proposal.
type ProposalID struct {
	Node    string // the proposing node's ID
	Process uint64 // random, drawn once per process
	Seq     uint64 // the process's count of proposals, from 1
}

// IsZero reports an absent ID (a command of encoding 1).
func (p ProposalID) IsZero() bool { return p.Seq == 0 }

func (p ProposalID) String() string { return fmt.Sprintf("%s/%016x/%d", p.Node, p.Process, p.Seq) }

// Proposer hands out the IDs of one process's proposals. Safe for
// concurrent use.
type Proposer struct {
	node    string
	process uint64
	seq     atomic.Uint64
}

// NewProposer returns the proposer of node, with a random process value.
func NewProposer(node string) *Proposer {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("machine: no randomness for a proposer: " + err.Error())
	}
	return &Proposer{node: node, process: binary.LittleEndian.Uint64(b[:]) | 1}
}

// Next returns a new ID.
func (p *Proposer) Next() ProposalID {
	return ProposalID{Node: p.node, Process: p.process, Seq: p.seq.Add(1)}
}

func decodeID(dec *msgpack.Decoder) (ProposalID, error) {
	var id ProposalID
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return id, err
	}
	if n != 3 {
		return id, fmt.Errorf("array of %d elements, want 3", n)
	}
	if id.Node, err = dec.DecodeString(); err != nil {
		return id, err
	}
	if len(id.Node) > 63 {
		return id, fmt.Errorf("node of %d bytes", len(id.Node))
	}
	if id.Process, err = dec.DecodeUint64(); err != nil {
		return id, err
	}
	if id.Seq, err = dec.DecodeUint64(); err != nil {
		return id, err
	}
	if id.Seq == 0 {
		return id, fmt.Errorf("sequence 0")
	}
	return id, nil
}

// PeekID reads the proposal ID of an encoded command without decoding the
// rest; ok is false for a command of encoding 1 (or bytes that are not a
// command, which Decode then refuses).
func PeekID(b []byte) (id ProposalID, ok bool) {
	if len(b) < 2 || b[0] != commandV2 {
		return id, false
	}
	id, err := decodeID(msgpack.NewDecoder(bytes.NewReader(b[1:])))
	return id, err == nil
}

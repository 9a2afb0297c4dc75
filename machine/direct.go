package machine

import (
	"errors"
	"sync"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/store"
)

// Direct applies commands to a machine in order without a log, each at the
// next index: for tests and tools that drive the machine alone (a node
// commits through its group). Commands are encoded and decoded as the log
// would carry them. Safe for concurrent use.
type Direct struct {
	mu  sync.Mutex
	m   *Machine
	enc *Encoder
}

// NewDirect drives m.
func NewDirect(m *Machine) *Direct { return &Direct{m: m, enc: NewEncoder()} }

// OpenDirect opens the machine of st and drives it.
func OpenDirect(st *store.Store, opts Options) (*Direct, error) {
	m, err := Open(st, opts)
	if err != nil {
		return nil, err
	}
	return NewDirect(m), nil
}

// Apply applies c at the next index.
func (d *Direct) Apply(c *Command) (*Result, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	data, err := d.enc.Encode(c)
	if err != nil {
		return nil, err
	}
	return d.m.Apply(d.m.Applied()+1, data)
}

// UpdateRecord changes a peer record (acceptor.Log).
func (d *Direct) UpdateRecord(peer string, record byte, f func(byte) byte) (byte, error) {
	return UpdateRecord(d.m.st, d.Apply, peer, record, f)
}

// UpdateReseed changes a peer's re-seed record (acceptor.Log).
func (d *Direct) UpdateReseed(peer string, f func(byte) byte) (byte, error) {
	return d.UpdateRecord(peer, RecordReseed, f)
}

// SetFromPeer records the peer's own filter toward this cluster
// (acceptor.Log).
func (d *Direct) SetFromPeer(peer string, f entry.Filter, onward []entry.TargetSpans) error {
	_, err := d.Apply(&Command{Link: &LinkCmd{Peer: peer, SetFromPeer: true, Filter: f, Onward: onward}})
	return err
}

// SetOpenStreams records the peer's open streams (acceptor.Log).
func (d *Direct) SetOpenStreams(peer string, open []entry.StreamID) error {
	_, err := d.Apply(&Command{Link: &LinkCmd{Peer: peer, SetOpen: true, Open: open}})
	return err
}

// ApplyInbound applies an admitted batch (acceptor.Log).
func (d *Direct) ApplyInbound(in *Inbound, raw []byte) (*InboundResult, error) {
	in.Raw = raw
	res, err := d.Apply(&Command{Inbound: in})
	if err != nil {
		return nil, err
	}
	if res.Inbound == nil {
		return nil, errors.New("machine: an inbound batch was skipped")
	}
	return res.Inbound, nil
}

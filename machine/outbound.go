package machine

import (
	"errors"
	"fmt"
	"sync"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/byteindex"
	"github.com/replicator/replicator/store"
)

// Outbound is the cluster's stream as the machine wrote it into the tree,
// read by shippers (it is what transport.Log asks for). Its bounds change
// only when a batch that moves them has committed, so a reader never sees
// an index whose entry is not readable yet.
type Outbound struct {
	st    *store.Store
	bytes byteindex.Index
	mu    struct {
		sync.Mutex
		stream      entry.StreamID
		first, last uint64
		notify      chan struct{}
		// tail holds the encodings of entries tailFirst.. (the stream's
		// newest, at most tailMax bytes) as the machine appended them, so
		// that a shipper keeping up reads them from memory instead of the
		// tree (issue 50: a read of the tree per entry shipped). The
		// slices are never written again; ReadRaw's callers only read.
		tail      [][]byte
		tailFirst uint64
		tailBytes int
	}
}

// tailMax bounds the bytes of the stream's newest entries kept in memory.
const tailMax = 4 << 20

// openOutbound loads the bounds and sizes of stream's entries; last is the
// stream's last index as the machine recorded it.
func openOutbound(st *store.Store, stream entry.StreamID, last uint64) (*Outbound, error) {
	o := &Outbound{st: st}
	o.mu.notify = make(chan struct{})
	return o, o.load(stream, last)
}

// load reads the bounds and sizes of stream's entries from the tree.
func (o *Outbound) load(stream entry.StreamID, last uint64) error {
	o.reset(stream, last)
	if stream.IsZero() {
		return nil
	}
	first, prev := uint64(0), uint64(0)
	err := o.st.EachOutbound(stream, func(i uint64, size int) error {
		if first == 0 {
			first = i
			o.bytes.Reset(i - 1)
		}
		prev = i
		o.bytes.Add(size)
		return nil
	})
	if err != nil {
		return fmt.Errorf("machine: open outbound: %w", err)
	}
	switch {
	case first == 0:
		// every entry truncated: the next one is last+1
	case prev != last:
		return fmt.Errorf("machine: open outbound: %w: entries %d-%d, the stream's last is %d",
			store.ErrCorrupt, first, prev, last)
	default:
		o.mu.Lock()
		o.mu.first = first
		o.mu.Unlock()
	}
	return nil
}

// reset starts the view at stream, empty after last.
func (o *Outbound) reset(stream entry.StreamID, last uint64) {
	o.mu.Lock()
	o.mu.stream, o.mu.first, o.mu.last = stream, last+1, last
	o.mu.tail, o.mu.tailFirst, o.mu.tailBytes = nil, last+1, 0
	o.mu.Unlock()
	o.bytes.Reset(last)
	o.wake()
}

// appended publishes entries last+1.. of the given encoded sizes, raw
// their encodings one after another (kept: the caller must not reuse it).
func (o *Outbound) appended(sizes []int, raw []byte) {
	for _, s := range sizes {
		o.bytes.Add(s)
	}
	o.mu.Lock()
	if o.mu.tailFirst+uint64(len(o.mu.tail)) != o.mu.last+1 {
		o.mu.tail, o.mu.tailFirst, o.mu.tailBytes = nil, o.mu.last+1, 0
	}
	for _, s := range sizes {
		o.mu.tail = append(o.mu.tail, raw[:s:s])
		o.mu.tailBytes += s
		raw = raw[s:]
	}
	o.mu.last += uint64(len(sizes))
	o.dropTailLocked(o.mu.first)
	o.mu.Unlock()
	o.wake()
}

// dropTailLocked keeps in the tail only entries from first on, within
// tailMax bytes.
func (o *Outbound) dropTailLocked(first uint64) {
	n := 0
	for n < len(o.mu.tail) && (o.mu.tailFirst+uint64(n) < first || o.mu.tailBytes > tailMax) {
		o.mu.tailBytes -= len(o.mu.tail[n])
		o.mu.tail[n] = nil
		n++
	}
	o.mu.tail = o.mu.tail[n:]
	o.mu.tailFirst += uint64(n)
}

// cut forgets the entries before first.
func (o *Outbound) cut(first uint64) {
	o.mu.Lock()
	o.mu.first = max(o.mu.first, first)
	o.dropTailLocked(o.mu.first)
	o.mu.Unlock()
	o.bytes.CutBefore(first)
}

func (o *Outbound) wake() {
	o.mu.Lock()
	close(o.mu.notify)
	o.mu.notify = make(chan struct{})
	o.mu.Unlock()
}

// Stream is the cluster's current stream.
func (o *Outbound) Stream() entry.StreamID {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.stream
}

// First is the first index kept (Last()+1 when none is).
func (o *Outbound) First() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.first
}

// Last is the stream's last index, 0 before its first write.
func (o *Outbound) Last() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.last
}

// Notify returns a channel closed at the next append (or a new stream).
func (o *Outbound) Notify() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.notify
}

// BytesAfter is the encoded size of the entries after index i.
func (o *Outbound) BytesAfter(i uint64) int64 { return o.bytes.After(i) }

// ReadRaw returns entry index as the entry codec encodes it, origin and
// stream left out; entry.ErrNotKept when it is not kept. The caller must
// not modify what it returns.
func (o *Outbound) ReadRaw(index uint64) ([]byte, error) {
	o.mu.Lock()
	stream, first, last := o.mu.stream, o.mu.first, o.mu.last
	var raw []byte
	if index >= first && index >= o.mu.tailFirst && index-o.mu.tailFirst < uint64(len(o.mu.tail)) {
		raw = o.mu.tail[index-o.mu.tailFirst]
	}
	o.mu.Unlock()
	if index < first || index > last {
		return nil, fmt.Errorf("%w: %d (first %d, last %d)", entry.ErrNotKept, index, first, last)
	}
	if raw != nil {
		return raw, nil
	}
	raw, err := o.st.Outbound(stream, index)
	if errors.Is(err, store.ErrNotFound) {
		// truncated between the bounds check and the read
		return nil, fmt.Errorf("%w: %d: %w", entry.ErrNotKept, index, err)
	}
	return raw, err
}

// applyTruncate drops the stream's outbound entries before first.
func (m *Machine) applyTruncate(b *store.Batch, stream entry.StreamID, first uint64) (*Result, func(), error) {
	if m.stream.IsZero() || stream != m.stream || first <= m.out.First() {
		return &Result{}, nil, nil
	}
	first = min(first, m.last+1)
	if err := b.CutOutbound(m.stream, first); err != nil {
		return nil, nil, err
	}
	return &Result{}, func() { m.out.cut(first) }, nil
}

// applyMint starts a new stream. The entries of the one before are dropped:
// a stream is replaced when its indexes cannot be trusted (a peer proved them
// used, or the tree lost some), and what its writes did reaches the peers by
// re-seeds, from the tree. A mint of the current stream with another epoch only changes the epoch: its
// increments count under fresh totals from then on.
func (m *Machine) applyMint(b *store.Batch, stream entry.StreamID, epoch uint32) (*Result, func(), error) {
	if stream == m.stream {
		if epoch == m.epoch.Load() {
			return &Result{}, nil, nil
		}
		if err := b.SetCounterEpoch(stream, epoch); err != nil {
			return nil, nil, err
		}
		return &Result{}, func() { m.epoch.Store(epoch) }, nil
	}
	err := errors.Join(
		b.SetLocalApplied(store.AppliedIndex{Stream: stream}),
		b.SetCounterEpoch(stream, epoch),
	)
	if !m.stream.IsZero() {
		err = errors.Join(err, b.DropOutbound(m.stream))
	}
	if err != nil {
		return nil, nil, err
	}
	return &Result{}, func() {
		m.stream, m.last, m.lastCommit = stream, 0, hlc.Timestamp{}
		m.epoch.Store(epoch)
		m.out.reset(stream, 0)
	}, nil
}

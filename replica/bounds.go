package replica

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// bounds are what a write may be: a key and a value within this node's
// limits and within what every peer said it accepts (a write a peer would
// refuse could never replicate there), a batch that fits a replication
// batch, a range that is neither empty nor everything, a pinned stamp
// within the pin window.
type Bounds struct {
	// MaxKeyBytes and MaxValueBytes are this node's limits;
	// MaxReplicateBytes its replication batch's; PinWindow how far below
	// the commit clock a pinned stamp may be.
	MaxKeyBytes, MaxValueBytes int
	MaxReplicateBytes          int64
	PinWindow                  time.Duration
	Clock                      *hlc.Clock
	// Peers are what each linked peer said it accepts (nil: not said).
	Peers func() []PeerLimits
}

// PeerLimits are what a peer said it accepts.
type PeerLimits struct {
	Peer   string
	Limits *api.PeerLimits
}

func (b *Bounds) CheckKey(key string) error { return api.CheckKey(key, b.MaxKeyBytes) }

// CheckValue bounds a write's key and value by this node's limits and by
// what every peer said it accepts: a write a peer would refuse could never
// replicate, so it is refused here, naming the peer.
func (b *Bounds) CheckValue(key string, size int) error { return b.checkValue(key, size, b.Peers()) }

// checkValue is CheckValue against peers' limits as read once (a batch
// reads them once for all its ops).
func (b *Bounds) checkValue(key string, size int, peers []PeerLimits) error {
	if size > b.MaxValueBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", api.ErrValueTooLarge, size, b.MaxValueBytes)
	}
	for _, p := range peers {
		lim, peer := p.Limits, p.Peer
		if lim == nil {
			continue
		}
		if lim.MaxKey > 0 && len(key) > lim.MaxKey {
			return fmt.Errorf("%w: %d bytes; peer %s accepts keys of at most %d", api.ErrKeyTooLarge, len(key), peer, lim.MaxKey)
		}
		max := int64(lim.MaxValue)
		if body := lim.MaxBody - peerEntryOverhead - int64(len(key)); lim.MaxBody > 0 && (max <= 0 || body < max) {
			max = body
		}
		if max > 0 && int64(size) > max {
			return fmt.Errorf("%w: %d bytes; peer %s accepts at most %d (it could never replicate there)", api.ErrValueTooLarge, size, peer, max)
		}
	}
	return nil
}

// peerEntryOverhead is room for a batch header and an entry's fields within
// a peer's body limit.
const peerEntryOverhead = 1024

// CheckPin refuses a pinned stamp older than the pin window of the commit
// clock (it could resurrect a collected tombstone) or further ahead of the
// physical clock than the max offset.
func (b *Bounds) CheckPin(pin, commit hlc.Timestamp) error {
	if pin.Wall < commit.Wall-int64(b.PinWindow) {
		return fmt.Errorf("%w: %s is %s older than the commit clock %s (pin window %s)", api.ErrPinOutOfWindow,
			pin, time.Duration(commit.Wall-pin.Wall).Round(time.Millisecond), commit, b.PinWindow)
	}
	if err := b.Clock.CheckOffset(pin); err != nil {
		return fmt.Errorf("%w: %w", api.ErrPinOutOfWindow, err)
	}
	return nil
}

// CheckRange refuses a range delete of no key or of every key.
func (b *Bounds) CheckRange(start, end string) error {
	if end == "" && strings.Trim(start, "\x00") == "" {
		// [NUL..., end of the key space) holds every key there is.
		return fmt.Errorf("%w: the range [%q, end) holds every key; deleting everything is not an API call", api.ErrBadRequest, start)
	}
	if err := errors.Join(b.CheckKey(start), b.CheckValue(start, 0)); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if end != "" {
		if err := errors.Join(b.CheckKey(end), b.CheckValue(end, 0)); err != nil {
			return fmt.Errorf("end: %w", err)
		}
		if end <= start {
			return fmt.Errorf("%w: the range [%q, %q) is empty", api.ErrInvalidKey, start, end)
		}
	}
	return nil
}

func (b *Bounds) BatchEntry(ops []api.BatchOp) (entry.Entry, error) {
	if len(ops) == 0 {
		return entry.Entry{}, fmt.Errorf("%w: a batch needs at least one op", api.ErrBadRequest)
	}
	if len(ops) > wire.MaxBatchOps {
		return entry.Entry{}, fmt.Errorf("%w: %d ops, limit %d", api.ErrBadRequest, len(ops), wire.MaxBatchOps)
	}
	peers := b.Peers()
	// One stamp for every op: a key twice would tie with itself, and the
	// first would win; keep the last, as a caller reading the list expects.
	last := make(map[string]int, len(ops))
	for i, op := range ops {
		last[op.Key] = i
	}
	e := entry.Entry{Op: entry.OpMulti, Ops: make([]entry.BatchOp, 0, len(last))}
	size := 0
	for i, op := range ops {
		if err := b.CheckKey(op.Key); err != nil {
			return e, fmt.Errorf("op %d: %w", i, err)
		}
		if err := b.checkValue(op.Key, len(op.Value), peers); err != nil {
			return e, fmt.Errorf("op %d: %w", i, err)
		}
		if op.Delete && len(op.Value) > 0 {
			return e, fmt.Errorf("%w: op %d deletes %q with a value", api.ErrBadRequest, i, op.Key)
		}
		size += len(op.Key) + len(op.Value)
		if last[op.Key] != i {
			continue
		}
		w := entry.BatchOp{Op: entry.OpSet, Key: op.Key, Value: op.Value, Expires: op.Expires}
		if op.Delete {
			if op.Expires != 0 {
				return e, fmt.Errorf("%w: op %d deletes %q with an expiry", api.ErrBadRequest, i, op.Key)
			}
			w.Op = entry.OpDelete
		}
		e.Ops = append(e.Ops, w)
	}
	if int64(size) > b.MaxReplicateBytes/2 {
		return e, fmt.Errorf("%w: a batch of %d bytes would not fit a replication batch", api.ErrValueTooLarge, size)
	}
	if err := b.checkValue("", size, peers); err != nil {
		return e, fmt.Errorf("the batch as a whole: %w", err)
	}
	return e, nil
}

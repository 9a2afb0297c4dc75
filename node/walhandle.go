package node

import (
	"sync/atomic"

	"github.com/replicator/replicator/wal"
)

// walHandle is the node's outbound WAL behind one pointer, so that a stream
// can be replaced while the node runs (a restored or copied data directory
// is noticed by a peer at runtime): the committer swaps it between groups,
// and shippers, truncation and the admin surface always reach the current
// log. A reader that raced the swap gets wal.ErrClosed from the old log and
// retries, as after any failed read.
type walHandle struct{ p atomic.Pointer[wal.Log] }

func (h *walHandle) cur() *wal.Log                                  { return h.p.Load() }
func (h *walHandle) Stream() wal.StreamID                           { return h.cur().Stream() }
func (h *walHandle) First() uint64                                  { return h.cur().First() }
func (h *walHandle) Last() uint64                                   { return h.cur().Last() }
func (h *walHandle) ReadRaw(i uint64) ([]byte, error)               { return h.cur().ReadRaw(i) }
func (h *walHandle) Read(c *wal.Codec, i uint64) (wal.Entry, error) { return h.cur().Read(c, i) }
func (h *walHandle) Notify() <-chan struct{}                        { return h.cur().Notify() }
func (h *walHandle) BytesAfter(i uint64) int64                      { return h.cur().BytesAfter(i) }
func (h *walHandle) Defaults() wal.Defaults                         { return h.cur().Defaults() }
func (h *walHandle) Stats() wal.Stats                               { return h.cur().Stats() }
func (h *walHandle) Append(es []*wal.Entry) error                   { return h.cur().Append(es) }
func (h *walHandle) TruncateFront(i uint64) error                   { return h.cur().TruncateFront(i) }
func (h *walHandle) Close() error                                   { return h.cur().Close() }

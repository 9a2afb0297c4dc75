package replica

import (
	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/machine"
	"github.com/replicator/replicator/store"
)

// Cursors keep the shippers' positions through the log (transport's
// cursor store), so that every node of the cluster knows how far each peer
// has the stream: read from the tree, set by a command of the log.
type Cursors struct {
	Store *store.Store
	// Apply puts a command through the cluster's log.
	Apply func(*machine.Command) error
}

func (c Cursors) Cursor(peer string) (entry.Cursor, bool, error) { return c.Store.Cursor(peer) }

func (c Cursors) SetCursor(peer string, cur entry.Cursor) error {
	return c.Apply(&machine.Command{Cursor: &machine.CursorCmd{Peer: peer, At: cur}})
}

func (c Cursors) InitCursor(peer string, cur entry.Cursor) error { return c.SetCursor(peer, cur) }

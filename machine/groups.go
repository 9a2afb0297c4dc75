package machine

import (
	"fmt"

	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/store"
)

// FormatGroups is format 14 too: from it group 0's log may record the
// cluster's raft groups and slot map (GroupsCmd, issue 51), which a node of
// an older build does not decode.
const FormatGroups = FormatOpenStreams

// GroupsCmd records the cluster's raft groups and its slot map, in group
// 0's log (docs/CLUSTER.md "Keys, slots and the slot map"): at the
// bootstrap of a cluster of several groups (`serve --groups G`). A cluster
// of one group records none. Until slot moves are built, the map once
// recorded stays: a command with another map (another G) is not taken
// (Result.Swapped false), and the node refuses to start with another G.
type GroupsCmd struct {
	Map *slot.Map
}

// Slots is the cluster's slot map as the log recorded it (nil: one group).
func (m *Machine) Slots() *slot.Map { return m.slots.Load() }

func (m *Machine) applyGroups(b *store.Batch, gc *GroupsCmd) (*Result, func(), error) {
	if err := gc.Map.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if cur := m.slots.Load(); cur != nil {
		// The same map again (a bootstrap's command proposed twice) is
		// taken, as a no-op; another waits for moves.
		return &Result{Swapped: cur.Gen == gc.Map.Gen && cur.Groups == gc.Map.Groups && cur.Owner == gc.Map.Owner}, nil, nil
	}
	if err := b.SetSlotMap(gc.Map.AppendTo(nil)); err != nil {
		return nil, nil, err
	}
	mp := gc.Map
	return &Result{Swapped: true}, func() { m.slots.Store(mp) }, nil
}

func (m *Machine) loadSlots() error {
	b, err := m.st.SlotMap()
	if err != nil || b == nil {
		m.slots.Store(nil) // a tree put back from before the map
		return err
	}
	mp, err := slot.Decode(b)
	if err != nil {
		return fmt.Errorf("machine: open: %w: the slot map: %w", store.ErrCorrupt, err)
	}
	m.slots.Store(mp)
	return nil
}

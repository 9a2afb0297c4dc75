// Package slot maps keys to the cluster's slots and slots to raft groups
// (issue 51, docs/CLUSTER.md "Several raft groups per cluster"). A key's
// slot is a constant of the product: it never depends on a cluster's number
// of groups, so a slot is what a move seals and what a map assigns.
package slot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Count is the number of slots; Bits its base-2 logarithm.
const (
	Bits  = 12
	Count = 1 << Bits
)

// MaxGroups bounds a cluster's raft groups: hashicorp/raft has no multi-raft
// of its own, so each group is a whole raft instance with its log.
const MaxGroups = 64

// Sentinel errors.
var (
	// ErrBadMap is a slot map that cannot be a cluster's: no groups, too
	// many, a slot owned by a group beyond them, a group with no slot.
	ErrBadMap = errors.New("slot: bad map")
	// ErrCorrupt is a map's encoding that does not decode.
	ErrCorrupt = errors.New("slot: corrupt map")
)

// Of returns key's slot: the top Bits of xxhash64 of its hash tag.
func Of(key string) int {
	return int(xxhash.Sum64String(Tag(key)) >> (64 - Bits))
}

// Tag is the part of key its slot is computed from, by Redis Cluster's
// rule: the characters between the first '{' and the first '}' after it,
// when there is at least one; else the whole key. Keys that share a tag
// share a slot, hence a group: an atomic batch across groups is refused,
// and a tag is how an application keeps a batch's keys together.
func Tag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 { // none, or "{}": the whole key
		return key
	}
	return key[open+1 : open+1+end]
}

// Map assigns every slot to a group, at a generation: every change of an
// owner raises Gen, and a proposal routed with an older generation is
// answered with the current map.
type Map struct {
	Gen    uint64
	Groups int
	// Owner is the group of each slot.
	Owner [Count]uint8
}

// Initial is a new cluster's map of groups groups: contiguous ranges of
// slots, slot s in group s*groups/Count, at generation 1.
func Initial(groups int) (*Map, error) {
	if groups < 1 || groups > MaxGroups {
		return nil, fmt.Errorf("%w: %d groups (want 1 to %d)", ErrBadMap, groups, MaxGroups)
	}
	m := &Map{Gen: 1, Groups: groups}
	for s := range m.Owner {
		m.Owner[s] = uint8(s * groups / Count)
	}
	return m, nil
}

// Group returns the group that owns key's slot.
func (m *Map) Group(key string) int { return int(m.Owner[Of(key)]) }

// SlotsOf returns how many slots group g owns.
func (m *Map) SlotsOf(g int) int {
	n := 0
	for _, o := range m.Owner {
		if int(o) == g {
			n++
		}
	}
	return n
}

// Validate reports every way m cannot be a cluster's map.
func (m *Map) Validate() error {
	var errs []error
	if m.Groups < 1 || m.Groups > MaxGroups {
		errs = append(errs, fmt.Errorf("%w: %d groups (want 1 to %d)", ErrBadMap, m.Groups, MaxGroups))
	}
	if m.Gen == 0 {
		errs = append(errs, fmt.Errorf("%w: generation 0", ErrBadMap))
	}
	var owns [256]int
	for s, o := range m.Owner {
		if int(o) >= m.Groups {
			errs = append(errs, fmt.Errorf("%w: slot %d owned by group %d of %d", ErrBadMap, s, o, m.Groups))
			break
		}
		owns[o]++
	}
	for g := 0; g < m.Groups && g < MaxGroups; g++ {
		if owns[g] == 0 {
			errs = append(errs, fmt.Errorf("%w: group %d owns no slot", ErrBadMap, g))
		}
	}
	return errors.Join(errs...)
}

// encodingV1 is the first byte of a map's encoding.
const encodingV1 = 1

// encodedLen is the length of an encoded map: version, generation, groups,
// then one byte per slot.
const encodedLen = 1 + 8 + 1 + Count

// AppendTo appends m's encoding to b.
func (m *Map) AppendTo(b []byte) []byte {
	b = append(b, encodingV1)
	b = binary.BigEndian.AppendUint64(b, m.Gen)
	b = append(b, byte(m.Groups))
	return append(b, m.Owner[:]...)
}

// Decode decodes a map AppendTo encoded and validates it.
func Decode(b []byte) (*Map, error) {
	if len(b) != encodedLen {
		return nil, fmt.Errorf("%w: %d bytes (want %d)", ErrCorrupt, len(b), encodedLen)
	}
	if b[0] != encodingV1 {
		return nil, fmt.Errorf("%w: encoding %d", ErrCorrupt, b[0])
	}
	m := &Map{Gen: binary.BigEndian.Uint64(b[1:9]), Groups: int(b[9])}
	copy(m.Owner[:], b[10:])
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return m, nil
}

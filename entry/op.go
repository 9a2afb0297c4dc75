package entry

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/replicator/replicator/hlc"
)

// Op is what a mutation does. Values travel on the wire and sit in the WAL:
// the list is append-only, never renumber.
type Op uint8

const (
	OpSet         Op = 1
	OpDelete      Op = 2
	OpDeleteRange Op = 3
	OpCounter     Op = 4
	OpMulti       Op = 5
)

func (o Op) String() string {
	switch o {
	case OpSet:
		return "set"
	case OpDelete:
		return "delete"
	case OpDeleteRange:
		return "delete_range"
	case OpCounter:
		return "counter"
	case OpMulti:
		return "multi"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Stamp is the total order last-writer-wins resolves by: the HLC, then the
// origin cluster as the tie-break. Equal stamps mean the same write.
type Stamp struct {
	HLC    hlc.Timestamp
	Origin string
}

// Compare returns -1, 0, +1 as s sorts before, equal to or after t.
func (s Stamp) Compare(t Stamp) int {
	if c := s.HLC.Compare(t.HLC); c != 0 {
		return c
	}
	return strings.Compare(s.Origin, t.Origin)
}

// String is a write's version: "<wall>.<logical>@<origin>". The same write
// shows the same version on every cluster.
func (s Stamp) String() string { return s.HLC.String() + "@" + s.Origin }

// ParseStamp reads the output of Stamp.String.
func ParseStamp(v string) (Stamp, error) {
	h, o, ok := strings.Cut(v, "@")
	if !ok || o == "" {
		return Stamp{}, fmt.Errorf("entry: version %q: want <wall>.<logical>@<origin>", v)
	}
	ts, err := hlc.Parse(h)
	if err != nil {
		return Stamp{}, fmt.Errorf("entry: version %q: %w", v, err)
	}
	return Stamp{HLC: ts, Origin: o}, nil
}

// Outcome is what a merge did.
type Outcome uint8

const (
	// Applied: the write's stamp was higher than the stored one (or nothing
	// was stored); it is now the key's state.
	Applied Outcome = iota + 1
	// Duplicate: the stored stamp equals the write's; it was already applied.
	Duplicate
	// Stale: the stored stamp is higher; the write lost and changed nothing.
	Stale
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	}
	return "unknown"
}

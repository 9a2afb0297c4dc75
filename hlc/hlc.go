// Package hlc is a hybrid logical clock: timestamps that follow physical time
// closely, never go backwards, and order causally related events across
// clusters.
//
// A Timestamp is (wall nanoseconds, logical counter). Wall carries the physical
// clock when it moves forward; logical breaks ties and absorbs a physical clock
// that stalls or jumps back. The physical clock is an interface so that tests
// drive time by hand and nothing here reads the wall clock on its own.
package hlc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EncodedLen is the length of Timestamp.Encode's output.
const EncodedLen = 12

// DefaultMaxOffset is how far ahead of the local physical clock a remote
// timestamp may be before Update refuses it.
const DefaultMaxOffset = 500 * time.Millisecond

// Timestamp is one hybrid logical clock reading. The zero value is the
// smallest timestamp; it means "no timestamp".
type Timestamp struct {
	Wall    int64  // nanoseconds since the Unix epoch
	Logical uint32 // ticks within one wall value
}

// Compare returns -1, 0 or +1 as t sorts before, equal to or after u.
func (t Timestamp) Compare(u Timestamp) int {
	switch {
	case t.Wall < u.Wall:
		return -1
	case t.Wall > u.Wall:
		return 1
	case t.Logical < u.Logical:
		return -1
	case t.Logical > u.Logical:
		return 1
	}
	return 0
}

// Less reports whether t sorts strictly before u.
func (t Timestamp) Less(u Timestamp) bool { return t.Compare(u) < 0 }

// IsZero reports whether t is the zero timestamp.
func (t Timestamp) IsZero() bool { return t.Wall == 0 && t.Logical == 0 }

// Next returns the smallest timestamp strictly greater than t.
func (t Timestamp) Next() Timestamp {
	if t.Logical == math.MaxUint32 {
		return Timestamp{Wall: t.Wall + 1}
	}
	return Timestamp{Wall: t.Wall, Logical: t.Logical + 1}
}

// Add returns t moved by d on the wall axis, logical reset to zero when d is
// non-zero. It is used for windows (retention, pin window), not for ticking.
func (t Timestamp) Add(d time.Duration) Timestamp {
	if d == 0 {
		return t
	}
	return Timestamp{Wall: t.Wall + int64(d)}
}

// Encode returns the fixed-width big-endian encoding of t. Encodings of
// non-negative timestamps sort bytewise exactly like Compare.
func (t Timestamp) Encode() [EncodedLen]byte {
	var b [EncodedLen]byte
	t.AppendTo(b[:0])
	return b
}

// AppendTo appends the fixed-width encoding of t to dst.
func (t Timestamp) AppendTo(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(t.Wall))
	return binary.BigEndian.AppendUint32(dst, t.Logical)
}

// Decode parses the output of Encode.
func Decode(b []byte) (Timestamp, error) {
	if len(b) != EncodedLen {
		return Timestamp{}, fmt.Errorf("hlc: decode: %d bytes, want %d", len(b), EncodedLen)
	}
	w := binary.BigEndian.Uint64(b[:8])
	if w > math.MaxInt64 {
		return Timestamp{}, fmt.Errorf("hlc: decode: wall %d out of range", w)
	}
	return Timestamp{Wall: int64(w), Logical: binary.BigEndian.Uint32(b[8:])}, nil
}

// String renders t as "<wall>.<logical>", e.g. "1764493436123456789.3".
func (t Timestamp) String() string {
	return strconv.FormatInt(t.Wall, 10) + "." + strconv.FormatUint(uint64(t.Logical), 10)
}

// Parse reads the output of String.
func Parse(s string) (Timestamp, error) {
	w, l, ok := strings.Cut(s, ".")
	if !ok {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: want <wall>.<logical>", s)
	}
	wall, err := strconv.ParseInt(w, 10, 64)
	if err != nil || wall < 0 {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: bad wall", s)
	}
	logical, err := strconv.ParseUint(l, 10, 32)
	if err != nil {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: bad logical", s)
	}
	return Timestamp{Wall: wall, Logical: uint32(logical)}, nil
}

// Time returns the wall part as a time.Time, for display only.
func (t Timestamp) Time() time.Time { return time.Unix(0, t.Wall).UTC() }

// PhysicalClock reads physical time in nanoseconds since the Unix epoch.
type PhysicalClock interface {
	Now() int64
}

// SystemClock is the machine's wall clock. It is the only place in the
// project's logic that reads it.
type SystemClock struct{}

// Now implements PhysicalClock.
func (SystemClock) Now() int64 { return time.Now().UnixNano() }

// OffsetClock shifts another physical clock by a fixed amount. Robustness
// tests use it to run a node ahead of or behind its peers.
type OffsetClock struct {
	Base   PhysicalClock
	Offset time.Duration
}

// Now implements PhysicalClock.
func (c OffsetClock) Now() int64 { return c.Base.Now() + int64(c.Offset) }

// ManualClock is a PhysicalClock that only moves when told to. Safe for
// concurrent use.
type ManualClock struct {
	mu  sync.Mutex
	now int64
}

// NewManualClock returns a clock reading now.
func NewManualClock(now int64) *ManualClock { return &ManualClock{now: now} }

// Now implements PhysicalClock.
func (c *ManualClock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to now, backwards if asked.
func (c *ManualClock) Set(now int64) {
	c.mu.Lock()
	c.now = now
	c.mu.Unlock()
}

// Advance moves the clock by d (negative moves it back).
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now += int64(d)
	c.mu.Unlock()
}

// ErrClockOffset is the class of errors returned when a remote timestamp lies
// too far ahead of the local physical clock. Test with errors.Is; the concrete
// *OffsetError carries the figures.
var ErrClockOffset = errors.New("hlc: remote timestamp beyond max clock offset")

// OffsetError reports a remote timestamp refused by Update or CheckOffset.
type OffsetError struct {
	Remote    Timestamp
	Physical  int64
	MaxOffset time.Duration
}

func (e *OffsetError) Error() string {
	return fmt.Sprintf("hlc: remote timestamp %s is %s ahead of the local clock (max offset %s)",
		e.Remote, time.Duration(e.Remote.Wall-e.Physical), e.MaxOffset)
}

// Is makes errors.Is(err, ErrClockOffset) true.
func (e *OffsetError) Is(target error) bool { return target == ErrClockOffset }

// Clock is a hybrid logical clock. Safe for concurrent use.
type Clock struct {
	phys      PhysicalClock
	maxOffset time.Duration

	mu struct {
		sync.Mutex
		last Timestamp
	}
}

// NewClock returns a clock over phys (SystemClock when nil). A maxOffset of
// zero means DefaultMaxOffset.
func NewClock(phys PhysicalClock, maxOffset time.Duration) *Clock {
	if phys == nil {
		phys = SystemClock{}
	}
	if maxOffset <= 0 {
		maxOffset = DefaultMaxOffset
	}
	return &Clock{phys: phys, maxOffset: maxOffset}
}

// MaxOffset returns the clock's configured maximum offset.
func (c *Clock) MaxOffset() time.Duration { return c.maxOffset }

// Physical returns the physical clock's reading.
func (c *Clock) Physical() int64 { return c.phys.Now() }

// Now returns a timestamp strictly greater than every timestamp this clock
// returned or observed before.
func (c *Clock) Now() Timestamp {
	pt := c.phys.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tickLocked(pt)
}

// REQUIRES: c.mu held.
func (c *Clock) tickLocked(pt int64) Timestamp {
	if pt > c.mu.last.Wall {
		c.mu.last = Timestamp{Wall: pt}
	} else {
		c.mu.last = c.mu.last.Next()
	}
	return c.mu.last
}

// CheckOffset returns an *OffsetError when remote lies further ahead of the
// physical clock than the max offset. It does not change the clock.
func (c *Clock) CheckOffset(remote Timestamp) error {
	pt := c.phys.Now()
	if remote.Wall > pt+int64(c.maxOffset) {
		return &OffsetError{Remote: remote, Physical: pt, MaxOffset: c.maxOffset}
	}
	return nil
}

// Update merges a remote timestamp into the clock, so that every later Now is
// above it. A remote timestamp further ahead of the physical clock than the
// max offset is refused with an *OffsetError and the clock is left unchanged:
// one peer with a runaway clock must not drag every cluster into the future.
func (c *Clock) Update(remote Timestamp) error {
	if err := c.CheckOffset(remote); err != nil {
		return err
	}
	c.Observe(remote)
	return nil
}

// Observe raises the clock to at least ts without any offset check. The node
// uses it at start to restore the persisted high-water mark: a node restarted
// with its system clock set back still stamps above everything it stamped.
func (c *Clock) Observe(ts Timestamp) {
	c.mu.Lock()
	if c.mu.last.Less(ts) {
		c.mu.last = ts
	}
	c.mu.Unlock()
}

// Last returns the highest timestamp issued or observed (the high-water mark).
func (c *Clock) Last() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.last
}

package hlc

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

func TestCompareAndEncodingOrder(t *testing.T) {
	ts := []Timestamp{
		{0, 0}, {0, 1}, {1, 0}, {1, math.MaxUint32}, {2, 0},
		{math.MaxInt64 - 1, 7}, {math.MaxInt64, 0}, {1764493436123456789, 3},
	}
	for _, a := range ts {
		for _, b := range ts {
			ea, eb := a.Encode(), b.Encode()
			if got, want := bytes.Compare(ea[:], eb[:]), a.Compare(b); got != want {
				t.Fatalf("%s vs %s: encoding compares %d, Compare says %d", a, b, got, want)
			}
			if a.Less(b) != (a.Compare(b) < 0) {
				t.Fatalf("Less disagrees with Compare for %s, %s", a, b)
			}
		}
		ea := a.Encode()
		d, err := Decode(ea[:])
		if err != nil || d != a {
			t.Fatalf("Decode(Encode(%s)) = %s, %v", a, d, err)
		}
		p, err := Parse(a.String())
		if err != nil || p != a {
			t.Fatalf("Parse(%q) = %s, %v", a.String(), p, err)
		}
	}
}

func TestParseAndDecodeRejectBadInput(t *testing.T) {
	for _, s := range []string{"", "1", "a.1", "1.b", "-5.0", "1.99999999999", "1.2.3"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
	if _, err := Decode(make([]byte, 11)); err == nil {
		t.Error("Decode of 11 bytes accepted")
	}
	bad := bytes.Repeat([]byte{0xff}, EncodedLen)
	if _, err := Decode(bad); err == nil {
		t.Error("Decode of a wall above MaxInt64 accepted")
	}
}

func TestNextIsStrictSuccessor(t *testing.T) {
	for _, ts := range []Timestamp{{5, 0}, {5, 9}, {5, math.MaxUint32}} {
		n := ts.Next()
		if !ts.Less(n) {
			t.Fatalf("%s.Next() = %s, not greater", ts, n)
		}
	}
	if got := (Timestamp{5, math.MaxUint32}).Next(); got != (Timestamp{6, 0}) {
		t.Fatalf("logical overflow: got %s", got)
	}
}

// TestNowMonotonic drives the physical clock through jumps forward, stalls and
// jumps back; every reading must be strictly above the one before.
func TestNowMonotonic(t *testing.T) {
	steps := []struct {
		name string
		move time.Duration
		n    int
		want Timestamp // the first reading after the move, when non-zero
	}{
		{"start", 0, 1, Timestamp{1_000_000, 0}},
		{"stalled clock ticks logical", 0, 3, Timestamp{1_000_000, 1}},
		{"forward resets logical", time.Millisecond, 1, Timestamp{2_000_000, 0}},
		{"back an hour keeps ticking logical", -time.Hour, 2, Timestamp{2_000_000, 1}},
		{"still behind", time.Minute, 1, Timestamp{2_000_000, 3}},
	}
	pc := NewManualClock(1_000_000)
	c := NewClock(pc, 0)
	var prev Timestamp
	for _, s := range steps {
		pc.Advance(s.move)
		for i := 0; i < s.n; i++ {
			got := c.Now()
			if i == 0 && !s.want.IsZero() && got != s.want {
				t.Fatalf("%s: first reading %s, want %s", s.name, got, s.want)
			}
			if !prev.Less(got) {
				t.Fatalf("%s: %s not above previous %s", s.name, got, prev)
			}
			prev = got
		}
	}
}

func TestUpdateMergesAndRefusesFarFuture(t *testing.T) {
	pc := NewManualClock(10 * int64(time.Second))
	c := NewClock(pc, 500*time.Millisecond)
	base := c.Now()

	within := Timestamp{Wall: base.Wall + int64(400*time.Millisecond), Logical: 7}
	if err := c.Update(within); err != nil {
		t.Fatalf("update within max offset: %v", err)
	}
	if n := c.Now(); !within.Less(n) {
		t.Fatalf("Now %s not above merged remote %s", n, within)
	}

	far := Timestamp{Wall: pc.Now() + int64(501*time.Millisecond)}
	before := c.Last()
	err := c.Update(far)
	var oe *OffsetError
	if !errors.Is(err, ErrClockOffset) || !errors.As(err, &oe) {
		t.Fatalf("far-future update: got %v, want *OffsetError", err)
	}
	if oe.Remote != far || oe.MaxOffset != 500*time.Millisecond {
		t.Fatalf("OffsetError fields: %+v", oe)
	}
	if c.Last() != before {
		t.Fatalf("refused update moved the clock: %s -> %s", before, c.Last())
	}
	if c.CheckOffset(Timestamp{Wall: pc.Now() + int64(500*time.Millisecond)}) != nil {
		t.Fatal("exactly max offset ahead must be accepted")
	}
}

// TestRestoreHighWaterAfterClockSetBack is the restart case: a new Clock on a
// physical clock set back an hour, restored from the persisted high-water
// mark, stamps above everything the old one stamped.
func TestRestoreHighWaterAfterClockSetBack(t *testing.T) {
	pc := NewManualClock(int64(100 * time.Hour))
	c := NewClock(pc, 0)
	var hw Timestamp
	for i := 0; i < 100; i++ {
		hw = c.Now()
	}
	pc.Advance(-time.Hour)
	restarted := NewClock(pc, 0)
	restarted.Observe(hw)
	for i := 0; i < 100; i++ {
		if got := restarted.Now(); !hw.Less(got) {
			t.Fatalf("restarted clock stamped %s, not above persisted %s", got, hw)
		}
	}
}

func TestConcurrentNowUnique(t *testing.T) {
	c := NewClock(NewManualClock(1), 0)
	const workers, per = 8, 2000
	out := make(chan Timestamp, workers*per)
	done := make(chan struct{})
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < per; i++ {
				out <- c.Now()
			}
			done <- struct{}{}
		}()
	}
	for w := 0; w < workers; w++ {
		<-done
	}
	close(out)
	var all []Timestamp
	for ts := range out {
		all = append(all, ts)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Less(all[j]) })
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			t.Fatalf("duplicate timestamp %s", all[i])
		}
	}
}

func TestRandomOrderMatchesEncoding(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for i := 0; i < 10000; i++ {
		a := Timestamp{Wall: r.Int64N(1 << 40), Logical: r.Uint32N(4)}
		b := Timestamp{Wall: a.Wall + r.Int64N(3) - 1, Logical: r.Uint32N(4)}
		if b.Wall < 0 {
			b.Wall = 0
		}
		ea, eb := a.Encode(), b.Encode()
		if bytes.Compare(ea[:], eb[:]) != a.Compare(b) {
			t.Fatalf("seed %d: order mismatch %s %s", seed, a, b)
		}
	}
}

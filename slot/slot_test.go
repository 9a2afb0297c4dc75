package slot

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

func TestTagFollowsRedisCluster(t *testing.T) {
	// The examples of Redis Cluster's specification, "Hash tags".
	for key, want := range map[string]string{
		"{user1000}.following": "user1000",
		"{user1000}.followers": "user1000",
		"foo{}{bar}":           "foo{}{bar}", // empty first tag: the whole key
		"foo{{bar}}zap":        "{bar",
		"foo{bar}{zap}":        "bar",
		"plain":                "plain",
		"open{only":            "open{only",
		"}{x}":                 "x",
		"":                     "",
	} {
		if got := Tag(key); got != want {
			t.Errorf("Tag(%q) = %q, want %q", key, got, want)
		}
	}
	if Of("user:{42}:cart") != Of("user:{42}:orders") || Of("user:{42}:cart") != Of("42") {
		t.Fatal("keys of one tag in different slots")
	}
}

// TestOfIsPinned: a key's slot is part of every cluster's log once it has
// groups (a move seals slots): the function must never change.
func TestOfIsPinned(t *testing.T) {
	got := fmt.Sprint(Of(""), Of("a"), Of("key:000000000001"), Of("user:{42}:cart"), Of("\xff\x00"))
	const want = "3828 3364 3867 1758 562"
	if got != want {
		t.Fatalf("slots %s, want %s: the slot function changed", got, want)
	}
}

func TestOfSpreadsKeys(t *testing.T) {
	const n = 409_600 // 100 a slot
	var counts [Count]int
	for i := range n {
		counts[Of(fmt.Sprintf("key:%012d", i))]++
	}
	lo, hi := n, 0
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
	}
	// Poisson(100): 4,096 slots stay well within 50..160.
	if lo < 50 || hi > 160 {
		t.Fatalf("slot counts from %d to %d for 100 expected", lo, hi)
	}
}

func TestInitialSplitsContiguously(t *testing.T) {
	for _, g := range []int{1, 2, 3, 5, 7, 64} {
		m, err := Initial(g)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("%d groups: %v", g, err)
		}
		for s := 1; s < Count; s++ {
			if m.Owner[s] < m.Owner[s-1] {
				t.Fatalf("%d groups: slot %d owned by %d after %d", g, s, m.Owner[s], m.Owner[s-1])
			}
		}
		for grp := range g {
			if n := m.SlotsOf(grp); n < Count/g || n > Count/g+1 {
				t.Fatalf("%d groups: group %d owns %d slots", g, grp, n)
			}
		}
		if m.Group("anything") != int(m.Owner[Of("anything")]) {
			t.Fatal("Group disagrees with Owner")
		}
	}
	for _, g := range []int{0, -1, MaxGroups + 1} {
		if _, err := Initial(g); !errors.Is(err, ErrBadMap) {
			t.Fatalf("Initial(%d): %v", g, err)
		}
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	m, _ := Initial(4)
	m.Gen = 0
	m.Owner[7] = 9
	err := m.Validate()
	if !errors.Is(err, ErrBadMap) {
		t.Fatal(err)
	}
	for _, want := range []string{"generation 0", "slot 7 owned by group 9"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Fatalf("%v: does not say %q", err, want)
		}
	}
	m, _ = Initial(4)
	for s := range m.Owner {
		if m.Owner[s] == 2 {
			m.Owner[s] = 1
		}
	}
	if err := m.Validate(); err == nil || !bytes.Contains([]byte(err.Error()), []byte("group 2 owns no slot")) {
		t.Fatalf("a group without slots: %v", err)
	}
}

func TestMapRoundTrip(t *testing.T) {
	m, _ := Initial(5)
	m.Gen = 77
	m.Owner[0], m.Owner[Count-1] = 4, 0
	got, err := Decode(m.AppendTo(nil))
	if err != nil {
		t.Fatal(err)
	}
	if *got != *m {
		t.Fatal("decoded map differs")
	}
	for name, b := range map[string][]byte{
		"short":        m.AppendTo(nil)[:100],
		"long":         append(m.AppendTo(nil), 0),
		"encoding":     append([]byte{2}, m.AppendTo(nil)[1:]...),
		"a bad owner":  func() []byte { b := m.AppendTo(nil); b[10] = 5; return b }(),
		"no groups":    func() []byte { b := m.AppendTo(nil); b[9] = 0; return b }(),
		"generation 0": func() []byte { b := m.AppendTo(nil); copy(b[1:9], make([]byte, 8)); return b }(),
		"empty":        nil,
	} {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, g := range []int{1, 3, 64} {
		m, _ := Initial(g)
		f.Add(m.AppendTo(nil))
	}
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		if !bytes.Equal(m.AppendTo(nil), b) {
			t.Fatal("a decoded map encodes differently")
		}
		if m.Validate() != nil {
			t.Fatal("a decoded map does not validate")
		}
	})
}

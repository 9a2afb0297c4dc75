package entry

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestFilterMatchAndSpans(t *testing.T) {
	f := Filter{Include: []string{"shared/", "tenant1/"}, Exclude: []string{"shared/tmp/"}}
	for key, want := range map[string]bool{
		"shared/a": true, "shared/tmp/x": false, "shared/tmp": true, "tenant1/x": true, "tenant2/x": false,
		"shared": false, "": false, "sharee": false,
	} {
		if got := f.Match(key); got != want {
			t.Errorf("Match(%q) = %v, want %v", key, got, want)
		}
	}
	want := []Span{{"shared/", "shared/tmp/"}, {"shared/tmp0", "shared0"}, {"tenant1/", "tenant10"}}
	if got := f.Spans(); !slices.Equal(got, want) {
		t.Fatalf("Spans = %q, want %q", got, want)
	}
	if got := (Filter{}).Spans(); !slices.Equal(got, []Span{{}}) {
		t.Fatalf("the empty filter's spans: %q", got)
	}
	if got := (Filter{Exclude: []string{"b"}}).Spans(); !slices.Equal(got, []Span{{"", "b"}, {"c", ""}}) {
		t.Fatalf("an exclude alone: %q", got)
	}
	// A range delete across the boundary is cut to the parts that cross.
	if got := f.Clip("a", "z"); !slices.Equal(got, want) {
		t.Fatalf("Clip(a, z) = %q", got)
	}
	if got := f.Clip("shared/m", ""); !slices.Equal(got, []Span{{"shared/m", "shared/tmp/"}, {"shared/tmp0", "shared0"}, {"tenant1/", "tenant10"}}) {
		t.Fatalf("Clip(shared/m, end) = %q", got)
	}
	if got := f.Clip("u", "v"); len(got) != 0 {
		t.Fatalf("Clip outside = %q", got)
	}
}

// TestFilterSpansAgreeWithMatch: a key lies in one of the filter's spans
// exactly when the filter lets it cross, for random filters and keys.
func TestFilterSpansAgreeWithMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "/", "é", "\U0010FFFF", "z"}
	word := func(max int) string {
		s := ""
		for range rng.IntN(max) + 1 {
			s += alphabet[rng.IntN(len(alphabet))]
		}
		return s
	}
	for range 2000 {
		var f Filter
		for range rng.IntN(3) {
			f.Include = append(f.Include, word(3))
		}
		for range rng.IntN(3) {
			f.Exclude = append(f.Exclude, word(4))
		}
		spans := f.Spans()
		for range 50 {
			k := word(6)
			in := false
			for _, sp := range spans {
				if k >= sp.Start && (sp.End == "" || k < sp.End) {
					in = true
				}
			}
			if in != f.Match(k) {
				t.Fatalf("filter %+v, key %q: in spans %v, Match %v (spans %q)", f, k, in, f.Match(k), spans)
			}
			old := Filter{Include: []string{word(2)}}
			wide := f.Widened(old)
			inWide := false
			for _, sp := range wide {
				if k >= sp.Start && (sp.End == "" || k < sp.End) {
					inWide = true
				}
			}
			if inWide != (f.Match(k) && !old.Match(k)) {
				t.Fatalf("Widened(%+v -> %+v) on %q: %v", old, f, k, inWide)
			}
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	for p, want := range map[string]string{"shared/": "shared0", "a": "b", "é": "ê", "a\U0010FFFF": "b", "\U0010FFFF": "", "\uD7FF": "\uE000"} {
		if got := PrefixEnd(p); got != want {
			t.Errorf("PrefixEnd(%q) = %q, want %q", p, got, want)
		}
	}
}

func TestFilterValidateAndNormal(t *testing.T) {
	bad := Filter{Include: []string{"", "\xff"}}
	if err := bad.Validate(); err == nil {
		t.Fatal("an empty and a non-UTF-8 prefix passed")
	}
	f := Filter{Include: []string{"b/", "a/", "a/x/", "b/"}}
	if n := f.Normal(); !slices.Equal(n.Include, []string{"a/", "b/"}) {
		t.Fatalf("Normal = %q", n.Include)
	}
	if !f.Equal(Filter{Include: []string{"a/", "b/"}}) {
		t.Fatal("two writings of one filter differ")
	}
}

func TestLinkSettingsFilterAt(t *testing.T) {
	s1, s2 := StreamID{1}, StreamID{2}
	ls := LinkSettings{Filters: []FilterEpoch{
		{Stream: s1, From: 5, Filter: Filter{Include: []string{"a"}}},
		{Stream: s2, From: 10, Filter: Filter{Include: []string{"b"}}},
		{Stream: s2, From: 20, Filter: Filter{}},
	}}
	for _, c := range []struct {
		stream StreamID
		index  uint64
		want   string
		until  uint64
	}{
		{s2, 1, "+a", 9}, {s2, 9, "+a", 9}, {s2, 10, "+b", 19}, {s2, 25, "every key", ^uint64(0)},
	} {
		f, until := ls.FilterAt(c.stream, c.index)
		if f.String() != c.want || until != c.until {
			t.Errorf("FilterAt(%d) = %s until %d, want %s until %d", c.index, f, until, c.want, c.until)
		}
	}
	if !ls.Filtering(s2, 0) || ls.Filtering(s2, 19) {
		t.Fatal("Filtering disagrees with the epochs")
	}
}

// TestExcludedAndKeepSpans: what a filter keeps home is the complement of
// what it lets cross; a link keeps tombstones there, less what was
// released, plus what is still to backfill.
func TestExcludedAndKeepSpans(t *testing.T) {
	f := Filter{Include: []string{"a/", "c/"}, Exclude: []string{"a/tmp/"}}
	got := fmt.Sprint(f.Excluded())
	want := fmt.Sprint([]Span{{End: "a/"}, {Start: "a/tmp/", End: "a/tmp0"}, {Start: "a0", End: "c/"}, {Start: "c0"}})
	if got != want {
		t.Fatalf("excluded %s, want %s", got, want)
	}
	if ex := (Filter{}).Excluded(); len(ex) != 0 {
		t.Fatalf("every key crosses, yet %v is excluded", ex)
	}
	for _, k := range []string{"", "0", "a/tmp/x", "b", "z"} {
		if !SpanHolds(f.Excluded(), k) || f.Match(k) {
			t.Fatalf("%q: excluded %v, matches %v", k, SpanHolds(f.Excluded(), k), f.Match(k))
		}
	}
	ls := LinkSettings{Filters: []FilterEpoch{{Filter: f}}, Released: []Span{{Start: "a0", End: "c/"}}, Backfill: []Span{{Start: "c/", End: "c0"}}}
	got = fmt.Sprint(ls.KeepSpans())
	want = fmt.Sprint([]Span{{End: "a/"}, {Start: "a/tmp/", End: "a/tmp0"}, {Start: "c/"}})
	if got != want {
		t.Fatalf("keep %s, want %s", got, want)
	}
	if !SpansMeet([]Span{{Start: "b", End: "c"}}, "a", "bb") || SpansMeet([]Span{{Start: "b", End: "c"}}, "c", "d") {
		t.Fatal("SpansMeet")
	}
}

// TestKeepsHome: what a filter keeps home of an entry, the one rule the
// acceptor's screen and the state machine judge relays by.
func TestKeepsHome(t *testing.T) {
	f := Filter{Exclude: []string{"home/"}}
	for _, c := range []struct {
		e    Entry
		want bool
	}{
		{Entry{Op: OpSet, Key: "home/k"}, true},
		{Entry{Op: OpDelete, Key: "home/k"}, true},
		{Entry{Op: OpCounter, Key: "home/c"}, true},
		{Entry{Op: OpSet, Key: "out/k"}, false},
		{Entry{Op: OpDeleteRange, Key: "home/a", End: "home/z"}, true},
		{Entry{Op: OpDeleteRange, Key: "a", End: "z"}, false}, // a part crosses
	} {
		if got := f.KeepsHome(&c.e); got != c.want {
			t.Errorf("%+v: KeepsHome %v, want %v", c.e, got, c.want)
		}
	}
	if (Filter{}).KeepsHome(&Entry{Op: OpSet, Key: "home/k"}) {
		t.Error("the filter of every key kept something home")
	}
}

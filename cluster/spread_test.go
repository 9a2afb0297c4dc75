package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestSpreadMove: a transfer goes from the node leading the most groups to
// the one leading the fewest, the highest-numbered group first; none when
// no two nodes differ by more than one; applied again and again from any
// start, the moves end with every node leading G/N groups or one more, in
// at most G moves, and group 0 moves only when it must.
func TestSpreadMove(t *testing.T) {
	for _, c := range []struct {
		leaders, nodes []string
		group          int
		to             string
		ok             bool
	}{
		{[]string{"a", "a", "a"}, []string{"a", "b", "c"}, 2, "b", true},
		{[]string{"a", "b", "a"}, []string{"a", "b", "c"}, 2, "c", true},
		{[]string{"a", "b", "c"}, []string{"a", "b", "c"}, 0, "", false},
		{[]string{"a", "a", "b", "b", "c"}, []string{"a", "b", "c"}, 0, "", false},
		{[]string{"a", "", "a"}, []string{"a", "b"}, 2, "b", true},
		{[]string{"a", "a"}, []string{"a"}, 0, "", false},
		{[]string{"x", "x", "x"}, []string{"a", "b"}, 0, "", false}, // not a voter: left alone
	} {
		g, to, ok := SpreadMove(c.leaders, c.nodes)
		if g != c.group || to != c.to || ok != c.ok {
			t.Errorf("SpreadMove(%v, %v) = %d, %q, %v; want %d, %q, %v", c.leaders, c.nodes, g, to, ok, c.group, c.to, c.ok)
		}
	}
	rng := rand.New(rand.NewPCG(51, 3))
	for range 500 {
		n, groups := 1+rng.IntN(5), 1+rng.IntN(16)
		nodes := make([]string, n)
		for i := range nodes {
			nodes[i] = fmt.Sprint("n", i)
		}
		leaders := make([]string, groups)
		for g := range leaders {
			leaders[g] = nodes[rng.IntN(n)]
		}
		start := fmt.Sprint(leaders)
		zero := leaders[0]
		moves := 0
		for {
			g, to, ok := SpreadMove(leaders, nodes)
			if !ok {
				break
			}
			leaders[g] = to
			if moves++; moves > groups {
				t.Fatalf("from %s: more than %d moves", start, groups)
			}
		}
		count := map[string]int{}
		for _, l := range leaders {
			count[l]++
		}
		for _, nd := range nodes {
			if c := count[nd]; c < groups/n || c > (groups+n-1)/n {
				t.Fatalf("from %s to %v: %s leads %d of %d groups over %d nodes", start, leaders, nd, c, groups, n)
			}
		}
		if leaders[0] != zero && count[zero] > groups/n {
			t.Fatalf("from %s to %v: group 0 moved though its leader could have kept it", start, leaders)
		}
	}
}

package machine

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/replicator/replicator/entry"
)

// TestOutboundTailReadsWhatTheTreeHolds: the stream's newest entries are
// read from memory (Outbound's tail), the rest from the tree, and both
// answer the same bytes for every index through groups of writes, cuts,
// more than the tail's bound, and a new stream; an index cut or not yet
// written is not kept, from either.
func TestOutboundTailReadsWhatTheTreeHolds(t *testing.T) {
	m, st := openMachine(t, t.TempDir())
	defer st.Close()
	idx := uint64(0)
	apply := func(c *Command) {
		t.Helper()
		idx++
		if _, err := m.ApplyCommand(idx, c); err != nil {
			t.Fatal(err)
		}
	}
	apply(&Command{Mint: &MintCmd{Stream: testStream}})
	ts := &stamper{wall: 1e15}
	value := bytes.Repeat([]byte("v"), 4000)
	check := func(stage string) {
		t.Helper()
		ob := m.Outbound()
		first, last := ob.First(), ob.Last()
		for i := max(first, 2) - 1; i <= last+1; i++ {
			got, err := ob.ReadRaw(i)
			want, werr := st.Outbound(ob.Stream(), i)
			if i < first || i > last {
				if !errors.Is(err, entry.ErrNotKept) {
					t.Fatalf("%s: entry %d outside %d-%d: %v", stage, i, first, last, err)
				}
				continue
			}
			if err != nil || werr != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s: entry %d: %v %v: the tail's copy differs from the tree's", stage, i, err, werr)
			}
		}
	}
	for g := 0; g < 1500; g++ {
		var props []Proposal
		for i := range 1 + g%7 {
			props = append(props, ts.put(fmt.Sprintf("k%d", (g*7+i)%500), string(value[:100+g%3000])))
		}
		apply(&Command{Local: props})
		switch {
		case g%97 == 0:
			check(fmt.Sprintf("group %d", g))
		case g%211 == 0 && g < 600:
			apply(&Command{Truncate: &TruncateCmd{Stream: testStream, First: m.Outbound().Last() - 20}})
			check(fmt.Sprintf("cut after group %d", g))
		}
	}
	m.Outbound().mu.Lock()
	tailBytes, tailFirst := m.Outbound().mu.tailBytes, m.Outbound().mu.tailFirst
	m.Outbound().mu.Unlock()
	if tailBytes > tailMax || tailFirst <= m.Outbound().First() {
		t.Fatalf("tail of %d bytes from %d (stream from %d): the bound is %d and the test must outgrow it",
			tailBytes, tailFirst, m.Outbound().First(), tailMax)
	}
	check("past the bound")
	apply(&Command{Mint: &MintCmd{Stream: entry.StreamID{9}}})
	apply(&Command{Local: []Proposal{ts.put("k", "new stream")}})
	check("new stream")
	if m.Outbound().Last() != 1 {
		t.Fatalf("new stream ends at %d", m.Outbound().Last())
	}
}

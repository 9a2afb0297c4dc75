package machine

import (
	"fmt"
	"testing"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
	"github.com/replicator/replicator/wire"
)

// BenchmarkBidirectional is the bench's bidirectional scenario at one
// cluster's machine: groups of 100 local writes, and batches of 100 of the
// peer's writes of the same keys (every key written on both sides, half
// won by each), at format 3 (no contexts) and 4 (contexts and the log).
func BenchmarkBidirectional(b *testing.B) {
	for _, format := range []uint8{FormatLinks, FormatConflicts} {
		b.Run(fmt.Sprintf("format%d", format), func(b *testing.B) {
			apply := benchMachine(b, format)
			wall := int64(1e15)
			peerIdx := uint64(0)
			val := make([]byte, 100)
			b.ResetTimer()
			for n := 0; n < b.N; n += 200 {
				props := make([]Proposal, 100)
				ents := make([]entry.Entry, 100)
				for i := range props {
					key := fmt.Sprintf("key-%012d", n+i)
					wall += 10
					props[i] = Proposal{Entry: entry.Entry{Op: entry.OpSet, Key: key, Value: val, Commit: hlc.Timestamp{Wall: wall}}}
					peerIdx++
					ts := hlc.Timestamp{Wall: wall + int64(i%2*10) - 5}
					ents[i] = entry.Entry{Index: peerIdx, Origin: "b", Stream: entry.StreamID{0xb}, Commit: ts, Stamp: ts, Op: entry.OpSet, Key: key, Value: val}
					if format >= FormatConflicts {
						ents[i].Ctx = entry.Context{{Origin: "b", HLC: ts}}
					}
				}
				apply(&Command{Local: props})
				bt := &wire.Batch{Header: wire.Header{Sender: "b", Stream: entry.StreamID{0xb}}, Entries: ents}
				apply(&Command{Inbound: &Inbound{Sender: "b", Batch: bt, At: 1, HLC: hlc.Timestamp{Wall: wall + 100}, MaxStreams: 16}})
			}
		})
	}
}

var benchStoreOpts *store.Options // the node's defaults

// BenchmarkOneway is one cluster's local writes of fresh keys, in groups of
// 100, at format 3 and 4 (the writer's side of bench's oneway).
func BenchmarkOneway(b *testing.B) {
	for _, format := range []uint8{FormatLinks, FormatConflicts} {
		b.Run(fmt.Sprintf("format%d", format), func(b *testing.B) {
			apply := benchMachine(b, format)
			wall := int64(1e15)
			val := make([]byte, 100)
			b.ResetTimer()
			for n := 0; n < b.N; n += 100 {
				props := make([]Proposal, 100)
				for i := range props {
					wall += 10
					props[i] = Proposal{Entry: entry.Entry{Op: entry.OpSet, Key: fmt.Sprintf("key-%012d", n+i), Value: val, Commit: hlc.Timestamp{Wall: wall}}}
				}
				apply(&Command{Local: props})
			}
		})
	}
}

// benchMachine opens a machine of cluster a on a fresh store at the given
// format, and returns how to apply a command to it.
func benchMachine(b *testing.B, format uint8) func(*Command) *Result {
	apply, _ := benchMachineStore(b, format)
	return apply
}

// benchMachineStore is benchMachine that also returns the store.
func benchMachineStore(b *testing.B, format uint8) (func(*Command) *Result, *store.Store) {
	st, err := store.Open(b.TempDir(), benchStoreOpts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	m, err := Open(st, Options{Cluster: "a"})
	if err != nil {
		b.Fatal(err)
	}
	idx := uint64(0)
	apply := func(c *Command) *Result {
		idx++
		r, err := m.ApplyCommand(idx, c)
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	apply(&Command{Mint: &MintCmd{Stream: entry.StreamID{0xa}}})
	apply(&Command{Format: &FormatCmd{Version: format}})
	return apply, st
}

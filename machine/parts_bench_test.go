package machine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/slot"
	"github.com/replicator/replicator/wire"
)

// BenchmarkInboundParts is what splitting a peer's batches into the parts
// of G groups costs a receiver whose node holds every group (the first
// build's placement: every voter applies every group's commands): batches
// of 64 SETs of 100-byte values at keys drawn from 100,000, split by the
// slot map and each part applied in its group's state machine over its
// own store, against the whole batch in one (G=1). It reports the
// process's CPU per entry (cpu-us/entry, Pebble's flushes and compactions
// included) and the bytes the parts' commands add to the groups' logs
// (log-bytes/entry): every part carries the batch's header, and the
// others' runs as foreign runs.
func BenchmarkInboundParts(b *testing.B) {
	for _, groups := range []int{1, 3, 8} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) { benchInboundParts(b, groups) })
	}
}

func benchInboundParts(b *testing.B, groups int) {
	slots, err := slot.Initial(groups)
	if err != nil {
		b.Fatal(err)
	}
	applies := make([]func(*Command) *Result, groups)
	for g := range applies {
		applies[g], _ = benchMachineStore(b, ReadsFormat)
	}
	rng := rand.New(rand.NewPCG(51, 51))
	stream := entry.StreamID{0xb}
	val := make([]byte, 100)
	index, wall := uint64(0), int64(1e15)
	enc := NewEncoder()
	var logBytes int64
	send := func() {
		bt := &wire.Batch{Header: wire.Header{Sender: "b", Stream: stream}, Entries: make([]entry.Entry, 64)}
		for i := range bt.Entries {
			index++
			wall += 10
			bt.Entries[i] = entry.Entry{Index: index, Origin: "b", Stream: stream, Commit: hlc.Timestamp{Wall: wall}, Op: entry.OpSet,
				Key: fmt.Sprintf("key:%012d", rng.IntN(100_000)), Value: val}
		}
		in := &Inbound{Sender: "b", Batch: bt, At: 1, MaxStreams: 16, HLC: hlc.Timestamp{Wall: wall}}
		parts := []*Inbound{in}
		if groups > 1 {
			if parts, err = wire.SplitInbound(in, groups, slots.Group); err != nil {
				b.Fatal(err)
			}
		}
		for g, p := range parts {
			c := &Command{Inbound: p}
			data, err := enc.Encode(c)
			if err != nil {
				b.Fatal(err)
			}
			logBytes += int64(len(data))
			if res := applies[g](c).Inbound; res.Err != nil {
				b.Fatal(res.Err)
			}
		}
	}
	for range 500 { // warm the trees
		send()
	}
	c0, l0 := cpuTime(), logBytes
	b.ResetTimer()
	for n := 0; n < b.N; n += 64 {
		send()
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-c0)/float64(time.Microsecond)/float64(b.N), "cpu-us/entry")
	b.ReportMetric(float64(logBytes-l0)/float64(b.N), "log-bytes/entry")
}

package machine

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
)

// BenchmarkWritePath is the state machine's share of a local write as the
// RESP door's -P 16 benchmark drives it (issue 50): groups of 64 SETs of
// 100-byte values at keys drawn from a million, the stream cut every 16
// groups as acknowledgments would. It reports the process's CPU per write
// (cpu-us/write: Pebble's flushes and compactions included), the figure the
// issue's goals are stated in.
func BenchmarkWritePath(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		for _, vc := range []int{-1, 1 << 16, 0} {
			b.Run(fmt.Sprintf("keys=%d/versioncache=%d", keys, vc), func(b *testing.B) { benchWritePath(b, keys, vc) })
		}
	}
}

func benchWritePath(b *testing.B, keys, vc int) {
	{
		{
			benchStoreOpts = &store.Options{VersionCacheKeys: vc}
			defer func() { benchStoreOpts = nil }()
			apply, st := benchMachineStore(b, ReadsFormat)
			rng := rand.New(rand.NewPCG(7, 7))
			wall := int64(1e15)
			val := make([]byte, 100)
			var groups, last uint64
			// Warm the tree: every key written once, as a long run leaves it.
			write := func(n int) {
				props := make([]Proposal, n)
				for i := range props {
					wall += 10
					props[i] = Proposal{Entry: entry.Entry{Op: entry.OpSet, Key: fmt.Sprintf("key:%012d", rng.IntN(keys)), Value: val, Commit: hlc.Timestamp{Wall: wall}}}
				}
				apply(&Command{Local: props})
				last += uint64(n)
				if groups++; groups%16 == 0 {
					apply(&Command{Truncate: &TruncateCmd{Stream: entry.StreamID{0xa}, First: last + 1}})
				}
			}
			for n := 0; n < 250_000; n += 64 {
				write(64)
			}
			s0 := st.VersionCacheStats()
			c0, f0 := cpuTime(), faults()
			b.ResetTimer()
			for n := 0; n < b.N; n += 64 {
				write(64)
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-c0)/float64(time.Microsecond)/float64(b.N), "cpu-us/write")
			b.ReportMetric(float64(faults()-f0)/float64(b.N), "faults/write")
			if s1 := st.VersionCacheStats(); s1.Hits+s1.Misses > s0.Hits+s0.Misses {
				b.ReportMetric(float64(s1.Hits-s0.Hits)/float64(s1.Hits+s1.Misses-s0.Hits-s0.Misses), "cache-hits/read")
				b.ReportMetric(float64(s1.Misses-s0.Misses)/float64(b.N), "tree-reads/write")
			}
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func faults() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}

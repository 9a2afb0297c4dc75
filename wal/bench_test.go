package wal

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkStoreLogs is the raft log's append as a group commit makes it:
// one command of 64 writes of 200 bytes per append, without fsync (the CPU
// of the append, not the disk's). It reports the process's CPU per write.
//
//	go test ./wal -run '^$' -bench StoreLogs
func BenchmarkStoreLogs(b *testing.B) {
	s, err := Open(b.TempDir(), &Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := make([]byte, 64*200)
	c0 := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.StoreLogs([]*raft.Log{{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: data}}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N)/64, "cpu-ns/write")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGroupLogs weighs issue 51's choice of log engine for a cluster of
// G raft groups (docs/CLUSTER.md "One store and one log per group"): G logs,
// each appending and fsyncing its own round concurrently (one tidwall/wal per
// group), against one shared log taking every group's round in one append and
// one fsync (dragonboat's design). A round is 64 writes of 200 bytes per
// group; each op of the benchmark is one round of every group. Reported: the
// process's CPU per write and writes per second of wall time.
func BenchmarkGroupLogs(b *testing.B) {
	data := make([]byte, 64*200)
	for _, g := range []int{1, 3, 8} {
		b.Run(fmt.Sprintf("groups=%d/logs=%d", g, g), func(b *testing.B) {
			logs := make([]*Store, g)
			for i := range logs {
				s, err := Open(b.TempDir(), nil)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				logs[i] = s
			}
			c0, t0 := cpuTime(), time.Now()
			b.ResetTimer()
			var wg sync.WaitGroup
			for _, s := range logs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < b.N; i++ {
						if err := s.StoreLogs([]*raft.Log{{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: data}}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			writes := float64(b.N) * float64(g) * 64
			b.ReportMetric(float64(cpuTime()-c0)/writes/1e3, "cpu-us/write")
			b.ReportMetric(writes/time.Since(t0).Seconds(), "writes/s")
		})
		b.Run(fmt.Sprintf("groups=%d/logs=1", g), func(b *testing.B) {
			s, err := Open(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			c0, t0 := cpuTime(), time.Now()
			b.ResetTimer()
			idx := uint64(0)
			for i := 0; i < b.N; i++ {
				round := make([]*raft.Log, g)
				for j := range round {
					idx++
					round[j] = &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: data}
				}
				if err := s.StoreLogs(round); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			writes := float64(b.N) * float64(g) * 64
			b.ReportMetric(float64(cpuTime()-c0)/writes/1e3, "cpu-us/write")
			b.ReportMetric(writes/time.Since(t0).Seconds(), "writes/s")
		})
	}
}

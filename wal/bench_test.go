package wal

import (
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

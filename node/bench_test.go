package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	twal "github.com/tidwall/wal"
)

// BenchmarkDurableWrites measures fsynced, applied writes per second through
// the node's Go API with 1, 16 and 64 concurrent writers of 100-byte values.
//
//	go test ./node -run '^$' -bench 'DurableWrites|RawWAL' -benchtime 200000x -count 5
func BenchmarkDurableWrites(b *testing.B) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			n := openNode(b, testOptions(b.TempDir()))
			defer n.Close()
			value := make([]byte, 100)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.SetBytes(100)
			b.ResetTimer()
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if _, err := n.Put(context.Background(), fmt.Sprintf("key-%012d", i), value); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

// BenchmarkRawWALBatch is the ceiling the write path is compared with: bare
// tidwall/wal appends of 100-byte entries, one fsync per batch, no framing,
// no stamping, no Pebble.
func BenchmarkRawWALBatch(b *testing.B) {
	for _, batch := range []int{64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			l, err := twal.Open(b.TempDir(), &twal.Options{SegmentSize: 8 << 20, NoCopy: true})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			value := make([]byte, 100)
			var wb twal.Batch
			b.SetBytes(100)
			b.ResetTimer()
			idx := uint64(1)
			for done := 0; done < b.N; {
				wb.Clear()
				for j := 0; j < batch && done < b.N; j++ {
					wb.Write(idx, value)
					idx++
					done++
				}
				if err := l.WriteBatch(&wb); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

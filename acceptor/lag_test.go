package acceptor

import (
	"testing"
	"time"
)

// TestLagRingReport: the percentiles are exact over the samples applied
// since the given time, the stages only over the staged ones, and a ring
// that wrapped keeps the newest samples.
func TestLagRingReport(t *testing.T) {
	var r LagRing
	base := time.Unix(1000, 0)
	if rep := r.Report(base); rep.Samples != 0 || rep.Stages != nil {
		t.Fatalf("empty ring: %+v", rep)
	}
	// 100 samples of 1..100 ms before base (ignored), then 100 of 101..200
	// ms at base, every other one staged.
	var old, fresh []Lag
	for i := 1; i <= 100; i++ {
		old = append(old, Lag{Total: time.Duration(i) * time.Millisecond})
		fresh = append(fresh, Lag{Total: time.Duration(100+i) * time.Millisecond, Staged: i%2 == 0,
			Ship: time.Millisecond, Wire: 2 * time.Millisecond, Apply: 3 * time.Millisecond})
	}
	r.Add(base.Add(-time.Second).UnixNano(), old)
	r.Add(base.UnixNano(), fresh)
	rep := r.Report(base)
	if rep.Samples != 100 || rep.P50MS != 150 || rep.P90MS != 190 || rep.P99MS != 199 || rep.MaxMS != 200 {
		t.Fatalf("report: %+v", rep)
	}
	if st := rep.Stages["wire"]; st.Samples != 50 || st.MaxMS != 2 || rep.Stages["apply"].P50MS != 3 {
		t.Fatalf("stages: %+v", rep.Stages)
	}
	// Wrapped: the ring holds the newest lagRingSize samples only.
	many := make([]Lag, lagRingSize)
	for i := range many {
		many[i] = Lag{Total: 7 * time.Millisecond}
	}
	r.Add(base.Add(time.Second).UnixNano(), many)
	if rep := r.Report(base); rep.Samples != lagRingSize || rep.MaxMS != 7 {
		t.Fatalf("after wrapping: %d samples, max %v ms", rep.Samples, rep.MaxMS)
	}
}

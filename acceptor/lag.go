package acceptor

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/replicator/replicator/api"
)

// LagRing keeps the most recent replication lag samples (apply time minus
// the entry's commit HLC), for exact percentiles over a recent window.
type LagRing struct {
	mu struct {
		sync.Mutex
		at  []int64 // local ns when applied
		lag []time.Duration
		// stages: ship, wire, apply in microseconds (-1<<31: unknown),
		// int32 to keep the ring at 7 MiB rather than 10
		stages [3][]int32
		next   int
		full   bool
	}
}

const lagRingSize = 1 << 18

const stageUnknown = math.MinInt32

// Add records the lags of a batch applied at now (ns).
func (r *LagRing) Add(now int64, lags []Lag) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.at == nil {
		r.mu.at = make([]int64, lagRingSize)
		r.mu.lag = make([]time.Duration, lagRingSize)
		for i := range r.mu.stages {
			r.mu.stages[i] = make([]int32, lagRingSize)
		}
	}
	for _, l := range lags {
		r.mu.at[r.mu.next], r.mu.lag[r.mu.next] = now, l.Total
		for i, d := range [3]time.Duration{l.Ship, l.Wire, l.Apply} {
			us := int32(stageUnknown)
			if l.Staged {
				us = int32(max(min(d.Microseconds(), math.MaxInt32), math.MinInt32+1))
			}
			r.mu.stages[i][r.mu.next] = us
		}
		r.mu.next++
		if r.mu.next == lagRingSize {
			r.mu.next, r.mu.full = 0, true
		}
	}
}

var stageNames = [3]string{"ship", "wire", "apply"}

// Report is the replication lag of entries applied since since.
func (r *LagRing) Report(since time.Time) api.LagReport {
	r.mu.Lock()
	count := r.mu.next
	if r.mu.full {
		count = lagRingSize
	}
	var lags []time.Duration
	var stages [3][]time.Duration
	for i := 0; i < count; i++ {
		if r.mu.at[i] >= since.UnixNano() {
			lags = append(lags, r.mu.lag[i])
			for j := range stages {
				if us := r.mu.stages[j][i]; us != stageUnknown {
					stages[j] = append(stages[j], time.Duration(us)*time.Microsecond)
				}
			}
		}
	}
	r.mu.Unlock()
	rep := api.LagReport{Since: since, Samples: len(lags)}
	if len(lags) == 0 {
		return rep
	}
	rep.P50MS, rep.P90MS, rep.P99MS, rep.MaxMS = percentiles(lags)
	for j, d := range stages {
		if len(d) > 0 {
			if rep.Stages == nil {
				rep.Stages = map[string]api.StageReport{}
			}
			st := api.StageReport{Samples: len(d)}
			st.P50MS, st.P90MS, st.P99MS, st.MaxMS = percentiles(d)
			rep.Stages[stageNames[j]] = st
		}
	}
	return rep
}

// percentiles sorts d and returns its p50, p90, p99 and max in milliseconds.
func percentiles(d []time.Duration) (p50, p90, p99, mx float64) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	ms := func(p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000
	}
	return ms(0.5), ms(0.9), ms(0.99), ms(1)
}

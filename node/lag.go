package node

import (
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"
)

// lagRing keeps the most recent replication lag samples (apply time minus
// the entry's commit HLC), for exact percentiles over a recent window.
type lagRing struct {
	mu struct {
		sync.Mutex
		at   []int64 // local ns when applied
		lag  []time.Duration
		next int
		full bool
	}
}

const lagRingSize = 1 << 18

func (r *lagRing) add(now int64, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.at == nil {
		r.mu.at = make([]int64, lagRingSize)
		r.mu.lag = make([]time.Duration, lagRingSize)
	}
	r.mu.at[r.mu.next], r.mu.lag[r.mu.next] = now, d
	r.mu.next++
	if r.mu.next == lagRingSize {
		r.mu.next, r.mu.full = 0, true
	}
}

// LagReport is GET /admin/lag: replication lag percentiles of the entries
// applied here since a time (at most the last 262,144 entries).
type LagReport struct {
	Since   time.Time `json:"since"`
	Samples int       `json:"samples"`
	P50MS   float64   `json:"p50_ms"`
	P90MS   float64   `json:"p90_ms"`
	P99MS   float64   `json:"p99_ms"`
	MaxMS   float64   `json:"max_ms"`
}

// Lag reports the replication lag of entries applied since since.
func (n *Node) Lag(since time.Time) LagReport {
	r := &n.lagRing
	r.mu.Lock()
	count := r.mu.next
	if r.mu.full {
		count = lagRingSize
	}
	var lags []time.Duration
	for i := 0; i < count; i++ {
		if r.mu.at[i] >= since.UnixNano() {
			lags = append(lags, r.mu.lag[i])
		}
	}
	r.mu.Unlock()
	rep := LagReport{Since: since, Samples: len(lags)}
	if len(lags) == 0 {
		return rep
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	ms := func(p float64) float64 {
		return float64(lags[int(p*float64(len(lags)-1))].Microseconds()) / 1000
	}
	rep.P50MS, rep.P90MS, rep.P99MS, rep.MaxMS = ms(0.5), ms(0.9), ms(0.99), ms(1)
	return rep
}

func (n *Node) handleLag(w http.ResponseWriter, r *http.Request) {
	since := time.Now().Add(-time.Minute)
	if s := r.URL.Query().Get("since"); s != "" {
		ns, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiError{Code: "bad_request", Message: "since: unix nanoseconds"})
			return
		}
		since = time.Unix(0, ns)
	}
	writeJSON(w, http.StatusOK, n.Lag(since))
}

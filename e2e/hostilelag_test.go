package e2e

import (
	"flag"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/node"
)

var (
	lagRounds   = flag.Int("lag-rounds", 1, "TestLagUnderHostileGossip: rounds of each arm (a measurement: 5 or more)")
	lagDuration = flag.Duration("lag-duration", 5*time.Second, "TestLagUnderHostileGossip: load per arm")
)

// TestLagUnderHostileGossip: two clusters of three take a steady load
// (100 writes/s per cluster, spread over their nodes) for a while, with and
// without the hostile gossip member of the robustness run in both clusters'
// gossip (issue 25: it impersonates each leader, makes up members and
// floods). It checks that the hostile member gets no request and that the
// peers' writes arrive, and logs the replication lag each arm saw at each
// leader (p50, p99 of /admin/lag); with -lag-rounds 5 it is the measurement
// of the honest members' lag under the hostile member (docs/SECURITY.md).
func TestLagUnderHostileGossip(t *testing.T) {
	p50s := map[bool][]float64{}
	p99s := map[bool][]float64{}
	for round := 0; round < *lagRounds; round++ {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("round%d/hostile=%v", round, on), func(t *testing.T) {
				m := newRaftMesh(t, []string{"a", "b"}, 3)
				m.start()
				var h *hostile
				if on {
					h = startHostile(t, m)
				}
				start := time.Now()
				var wg sync.WaitGroup
				for _, c := range m.clusters {
					wg.Add(1)
					go func() {
						defer wg.Done()
						members := m.members(c)
						tick := time.NewTicker(10 * time.Millisecond)
						defer tick.Stop()
						for i := 0; time.Since(start) < *lagDuration; i++ {
							<-tick.C
							n := members[i%len(members)]
							n.client().Put(bg(), fmt.Sprintf("%s/%d", c, i), []byte("v"))
						}
					}()
				}
				wg.Wait()
				if h != nil {
					if bad := h.end(); len(bad) > 0 {
						t.Fatal(bad)
					}
				}
				for _, c := range m.clusters {
					l := m.waitLeader(c, 10*time.Second)
					var lr node.LagReport
					eventually(t, 10*time.Second, func() (bool, string) {
						if _, err := l.client().Do(bg(), http.MethodGet, fmt.Sprintf("/admin/lag?since=%d", start.UnixNano()), nil, nil, &lr); err != nil {
							return false, err.Error()
						}
						return lr.Samples > int(lagDuration.Seconds())*50, fmt.Sprintf("%d of the peer's writes applied at %s", lr.Samples, l.id)
					})
					t.Logf("hostile=%v cluster %s: %d entries, lag p50 %.1f ms, p99 %.1f ms", on, c, lr.Samples, lr.P50MS, lr.P99MS)
					p50s[on] = append(p50s[on], lr.P50MS)
					p99s[on] = append(p99s[on], lr.P99MS)
				}
			})
		}
	}
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2]
	}
	spread := func(v []float64) string {
		if len(v) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f-%.1f", slices.Min(v), slices.Max(v))
	}
	for _, on := range []bool{false, true} {
		t.Logf("hostile=%v: %d samples, median p50 %.1f ms (range %s), median p99 %.1f ms (range %s)",
			on, len(p50s[on]), med(p50s[on]), spread(p50s[on]), med(p99s[on]), spread(p99s[on]))
	}
}

package e2e

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
)

var (
	lagRounds   = flag.Int("lag-rounds", 1, "TestLagUnderHostileGossip: rounds of each arm (a measurement: 5 or more)")
	lagDuration = flag.Duration("lag-duration", 5*time.Second, "TestLagUnderHostileGossip: load per arm")
)

// TestLagUnderHostileGossip: two clusters of three take a steady load
// (50 writes/s per cluster, spread over their nodes) for a while, with and
// without the hostile gossip member of the robustness run in both clusters'
// gossip (issue 25: it impersonates each leader, makes up members and
// floods). It checks that the hostile member gets no request and that the
// peers' writes arrive, and logs the replication lag each arm saw at each
// leader (p50, p99 of /admin/lag); with -lag-rounds 5 it is the measurement
// of the honest members' lag under the hostile member (docs/SECURITY.md).
func TestLagUnderHostileGossip(t *testing.T) {
	p50s, cpus := map[bool][]float64{}, map[bool][]float64{}
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
				cpu0 := nodesCPU(m)
				start := time.Now()
				var wg sync.WaitGroup
				var sent atomic.Int64
				for _, c := range m.clusters {
					wg.Add(1)
					go func() {
						defer wg.Done()
						members := m.members(c)
						tick := time.NewTicker(20 * time.Millisecond)
						defer tick.Stop()
						for i := 0; time.Since(start) < *lagDuration; i++ {
							<-tick.C
							n := members[i%len(members)]
							if _, err := n.client().Put(bg(), fmt.Sprintf("%s/%d", c, i), []byte("v")); err == nil {
								sent.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				cpu := nodesCPU(m) - cpu0
				if h != nil {
					if bad := h.end(); len(bad) > 0 {
						t.Fatal(bad)
					}
				}
				t.Logf("hostile=%v: %d writes acknowledged in %s; the six nodes used %.0f ms of CPU (%.2f ms a write)",
					on, sent.Load(), *lagDuration, cpu.Seconds()*1000, cpu.Seconds()*1000/float64(max(1, sent.Load())))
				cpus[on] = append(cpus[on], cpu.Seconds()*1000/float64(max(1, sent.Load())))
				for _, c := range m.clusters {
					l := m.waitLeader(c, 10*time.Second)
					var lr api.LagReport
					eventually(t, 10*time.Second, func() (bool, string) {
						if _, err := l.client().Do(bg(), http.MethodGet, fmt.Sprintf("/admin/lag?since=%d", start.UnixNano()), nil, nil, &lr); err != nil {
							return false, err.Error()
						}
						return int64(lr.Samples) >= sent.Load()/2*9/10, fmt.Sprintf("%d of the peer's %d writes applied at %s", lr.Samples, sent.Load()/2, l.id)
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
		t.Logf("hostile=%v: %d samples, median p50 %.1f ms (range %s), median p99 %.1f ms (range %s); node CPU a write: median %.2f ms (range %s)",
			on, len(p50s[on]), med(p50s[on]), spread(p50s[on]), med(p99s[on]), spread(p99s[on]), med(cpus[on]), spread(cpus[on]))
	}
}

// nodesCPU is the CPU time the mesh's running node processes used so far
// (user and system, from /proc).
func nodesCPU(m *rmesh) time.Duration {
	var total time.Duration
	for _, id := range m.order {
		n := m.nodes[id]
		n.mu.Lock()
		cmd := n.cmd
		n.mu.Unlock()
		if cmd == nil || cmd.Process == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th (clock ticks, 100 a second here).
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			total += time.Duration(u+s) * 10 * time.Millisecond
		}
	}
	return total
}

package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/internal/nodetest"
)

// TestLagStagesReported: entries replicated over real HTTP have their lag
// split into ship, wire and apply in /admin/lag and in the stage histogram,
// one observation per entry, and the stages fit inside the total.
func TestLagStagesReported(t *testing.T) {
	m := nodetest.NewMesh(t, nil, nil, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	since := time.Now()
	for i := 0; i < 50; i++ {
		if _, err := a.Put(context.Background(), fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	m.Settle()
	rep := b.Lag(since)
	if rep.Samples != 50 {
		t.Fatalf("%d lag samples, want 50", rep.Samples)
	}
	for _, stage := range []string{"ship", "wire", "apply"} {
		st, ok := rep.Stages[stage]
		if !ok || st.Samples != 50 {
			t.Fatalf("stage %s: %+v (report %+v)", stage, st, rep)
		}
		if st.P50MS < 0 || st.MaxMS > rep.MaxMS+1 {
			t.Errorf("stage %s: p50 %.3f ms, max %.3f ms against a total max of %.3f ms", stage, st.P50MS, st.MaxMS, rep.MaxMS)
		}
	}
	resp, err := http.Get(b.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, stage := range []string{"ship", "wire", "apply"} {
		want := fmt.Sprintf(`replicator_replication_stage_seconds_count{cluster="b",peer="a",stage="%s"} 50`, stage)
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

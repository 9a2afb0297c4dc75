package node_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// TestPermitRefusalsRetried: with one replay permit and a queue of one,
// three senders' batches are refused with the retryable source; the
// shippers retry, and every entry is applied exactly once.
func TestPermitRefusalsRetried(t *testing.T) {
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		o.Permits, o.PermitQueue, o.PermitWait = 1, 1, time.Millisecond
		o.MaxBatchEntries = 16
	}, "a", "b", "c", "d")
	var wg sync.WaitGroup
	for _, name := range []string{"a", "c", "d"} {
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 300; i++ {
					if _, err := m.Nodes[name].Put(context.Background(), fmt.Sprintf("%s/%d/%d", name, w, i), []byte("v")); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	m.Settle()
	b := m.Nodes["b"]
	if p := b.WALReport().Permits; p.Refused == 0 {
		t.Fatalf("no batch was refused for want of a permit: %+v", p)
	}
	for _, h := range b.PeersReport().Streams {
		if h.Merged != h.HWM || h.HWM != 1200 {
			t.Fatalf("stream of %s: hwm %d, merged %d; want 1200 each", h.Origin, h.HWM, h.Merged)
		}
	}
	da, _ := m.Nodes["a"].Digest()
	db, _ := b.Digest()
	if da.Hash != db.Hash || db.Keys != 3600 {
		t.Fatalf("digests: a %+v b %+v", da, db)
	}
	refusals := 0
	for _, n := range []string{"a", "c", "d"} {
		for _, l := range m.Nodes[n].PeerStatus() {
			if l.Peer == "b" {
				refusals += int(l.PermitRefusals)
			}
		}
	}
	if refusals == 0 {
		t.Fatal("no shipper saw a permit refusal")
	}
}

// TestSaturationRefusesAndRecovers: a link past its high-water mark refuses
// local writes with the source and peer, nothing is written, readyz fails;
// once the peer drains below the low-water mark writes are taken again.
func TestSaturationRefusesAndRecovers(t *testing.T) {
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		o.WaterMarks = api.WaterMarks{HighEntries: 50, LowEntries: 20}
		o.AdmissionWait = -1
	}, "a", "b")
	a := m.Nodes["a"]
	m.Cut("a", "b", true)
	ctx := context.Background()
	var refused *api.SaturatedError
	for i := 0; i < 200 && refused == nil; i++ {
		_, err := a.Put(ctx, fmt.Sprint("k", i), []byte("v"))
		if err != nil && !errors.As(err, &refused) {
			t.Fatal(err)
		}
	}
	if refused == nil || refused.Peer != "b" || refused.Source != "outbound_backlog" {
		t.Fatalf("no refusal naming the source and peer: %+v", refused)
	}
	last := a.WALReport().Last
	if _, err := a.Put(ctx, "more", []byte("v")); !errors.Is(err, api.ErrSaturated) || a.WALReport().Last != last {
		t.Fatalf("refused write reached the WAL: %v (%d -> %d)", err, last, a.WALReport().Last)
	}
	if a.Ready() == nil {
		t.Fatal("ready while saturated")
	}
	rec := httpDo(t, "PUT", a.URL()+"/v1/kv/http", "v")
	if rec.status != 503 || rec.header.Get("Retry-After") == "" ||
		!strings.Contains(rec.body, `"source":"outbound_backlog"`) || !strings.Contains(rec.body, `"peer":"b"`) || !strings.Contains(rec.body, `"retryable":false`) {
		t.Fatalf("HTTP refusal: %d %v %s", rec.status, rec.header, rec.body)
	}
	metrics := httpDo(t, "GET", a.URL()+"/metrics", "")
	if !strings.Contains(metrics.body, `replicator_saturation_state{cluster="a"} 2`) || !strings.Contains(metrics.body, `replicator_refusals_total{cluster="a",source="outbound_backlog"}`) {
		t.Fatal("metrics do not show the saturation")
	}
	m.Cut("a", "b", false)
	deadline := time.Now().Add(20 * time.Second)
	for a.Saturation().State == api.StateSaturated && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := a.Put(ctx, "after", []byte("v")); err != nil {
		t.Fatalf("write after the backlog drained: %v", err)
	}
	m.Settle()
	da, _ := a.Digest()
	db, _ := m.Nodes["b"].Digest()
	if da.Hash != db.Hash {
		t.Fatal("digests differ after recovery")
	}
}

// TestAdmissionWaitsForDrain: a write that arrives while saturated waits
// for the state to clear within its admission budget, and then succeeds.
func TestAdmissionWaitsForDrain(t *testing.T) {
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		o.WaterMarks = api.WaterMarks{HighEntries: 30, LowEntries: 10}
		o.AdmissionWait = 10 * time.Second
	}, "a", "b")
	a := m.Nodes["a"]
	m.Cut("a", "b", true)
	for i := 0; i < 31; i++ {
		if _, err := a.Put(context.Background(), fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if a.Saturation().State != api.StateSaturated {
		t.Fatalf("state %s", a.Saturation().State)
	}
	done := make(chan error, 1)
	go func() { _, err := a.Put(context.Background(), "waits", []byte("v")); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("write returned while saturated: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	m.Cut("a", "b", false)
	if err := <-done; err != nil {
		t.Fatalf("admitted write: %v", err)
	}
}

type httpResult struct {
	status int
	header http.Header
	body   string
}

func httpDo(t *testing.T, method, url, body string) httpResult {
	t.Helper()
	resp, b := nodetest.Do(t, method, url, strings.NewReader(body))
	return httpResult{resp.StatusCode, resp.Header, string(b)}
}

package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// TestConflictLogAcrossClusters: two clusters write while their links are
// cut (keys on both sides, one written three times on one side, keys on one
// side only), then the links heal: both clusters' logs hold exactly the keys
// written on both sides, under the same IDs, each naming the loser's value
// and the winner; a sequential overwrite across the clusters logs nothing.
func TestConflictLogAcrossClusters(t *testing.T) {
	pc := hlc.NewManualClock(int64(1000 * time.Hour))
	m := nodetest.NewMesh(t, pc, nil, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	ctx := context.Background()
	put := func(n *node.Node, k, v string) {
		t.Helper()
		pc.Advance(time.Millisecond)
		if _, err := n.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	m.Cut("a", "b", true)
	m.Cut("b", "a", true)
	put(a, "both1", "a1")
	put(b, "both1", "b1") // wins
	put(b, "both2", "b1")
	put(a, "both2", "a1")
	put(a, "both2", "a2")
	put(a, "both2", "a3") // wins
	put(a, "only-a", "a")
	put(b, "only-b", "b")
	m.Cut("a", "b", false)
	m.Cut("b", "a", false)
	m.Settle()

	logs := map[string]map[string]client.Conflict{}
	for name, n := range map[string]*node.Node{"a": a, "b": b} {
		p, err := client.New(n.URL(), nil).Conflicts(ctx, client.ConflictQuery{})
		if err != nil {
			t.Fatal(err)
		}
		logs[name] = map[string]client.Conflict{}
		var keys []string
		for _, c := range p.Items {
			logs[name][c.ID] = c
			keys = append(keys, c.Key)
		}
		sort.Strings(keys)
		if len(keys) != 2 || keys[0] != "both1" || keys[1] != "both2" {
			t.Fatalf("%s logged %v, want both1 and both2 once each", name, keys)
		}
		for _, c := range p.Items {
			want := map[string][2]string{"both1": {"a1", "b"}, "both2": {"b1", "a"}}[c.Key]
			if string(c.Loser.Value) != want[0] || c.Winner.Origin != want[1] || c.Possible {
				t.Fatalf("%s: %+v, want %q lost to %s", name, c, want[0], want[1])
			}
		}
	}
	for id := range logs["a"] {
		if _, ok := logs["b"][id]; !ok {
			t.Fatalf("conflict %s logged at a, not at b", id)
		}
	}
	if c := a.PeersReport().Incoming["b"].Conflicts + b.PeersReport().Incoming["a"].Conflicts; c < 2 {
		t.Fatalf("conflicts counted: %d", c)
	}

	// Restore both1's loser at a: it comes back on both clusters, and both
	// logs say so; a second restore is refused.
	var id1, id2 string
	for id, c := range logs["a"] {
		switch c.Key {
		case "both1":
			id1 = id
		case "both2":
			id2 = id
		}
	}
	pc.Advance(time.Millisecond)
	res, err := client.New(a.URL(), nil).RestoreConflict(ctx, id1)
	if err != nil {
		t.Fatal(err)
	}
	m.Settle()
	for name, n := range map[string]*node.Node{"a": a, "b": b} {
		r, err := n.Get("both1")
		if err != nil || string(r.Value) != "a1" || r.Stamp.String() != res.Version {
			t.Fatalf("%s after the restore: %q %s %v", name, r.Value, r.Stamp, err)
		}
		p, err := client.New(n.URL(), nil).Conflicts(ctx, client.ConflictQuery{Key: "both1"})
		if err != nil || len(p.Items) != 1 || p.Items[0].Restored != res.Version {
			t.Fatalf("%s's log after the restore: %+v %v", name, p.Items, err)
		}
	}
	var ce *client.Error
	if _, err := client.New(b.URL(), nil).RestoreConflict(ctx, id1); !errors.As(err, &ce) || ce.Status != http.StatusConflict || ce.Code != "restored" {
		t.Fatalf("a second restore: %v", err)
	}
	// both2's winner was overwritten since: the restore says what is there.
	put(b, "both2", "newer")
	m.Settle()
	cur, err := a.Get("both2")
	if err != nil {
		t.Fatal(err)
	}
	resp, body := nodetest.Do(t, http.MethodPost, a.URL()+"/admin/conflicts/"+id2+"/restore", nil)
	var answer struct {
		Error struct {
			Code    string `json:"code"`
			Version string `json:"version"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || resp.StatusCode != http.StatusPreconditionFailed ||
		answer.Error.Code != "precondition_failed" || answer.Error.Version != cur.Stamp.String() {
		t.Fatalf("restore over a newer version (%s): %d %s", cur.Stamp, resp.StatusCode, body)
	}

	put(a, "seq", "a")
	m.Settle()
	put(b, "seq", "b")
	m.Settle()
	for name, n := range map[string]*node.Node{"a": a, "b": b} {
		if p, err := client.New(n.URL(), nil).Conflicts(ctx, client.ConflictQuery{Key: "seq"}); err != nil || len(p.Items) != 0 {
			t.Fatalf("%s logged a sequential overwrite: %+v %v", name, p.Items, err)
		}
	}
}

package e2e

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/client"
)

// TestConflictLog: two clusters write while the links between them are
// down (keys written on both sides, keys written three times on one side
// and once on the other, keys on one side only), then the links come back
// duplicating batches and losing acks: both clusters' conflict logs hold
// exactly the keys written on both sides, once each, under the same IDs,
// each naming the other side's last value as the loser and the key's final
// version as the winner. A restart of a receiver changes nothing; a
// sequential overwrite across the clusters logs nothing; a restore brings
// a loser back on both clusters and both logs say so.
func TestConflictLog(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, true, "a", "b")
	m.start()
	a, b := m.nodes["a"], m.nodes["b"]
	for _, px := range m.proxies {
		px.setDown(true)
	}
	put := func(p *proc, k, v string) {
		t.Helper()
		if _, err := p.client().Put(bg(), k, []byte(v)); err != nil {
			t.Fatalf("%s put %s: %v", p.name, k, err)
		}
	}
	want := map[string]bool{} // keys written on both sides
	for i := 0; i < 10; i++ {
		k := fmt.Sprintf("both/%02d", i)
		want[k] = true
		if i%2 == 0 {
			put(a, k, "a-"+k)
			put(b, k, "b-"+k)
		} else {
			put(b, k, "b-"+k)
			put(a, k, "a-"+k)
		}
	}
	for i := 0; i < 5; i++ {
		k := fmt.Sprintf("thrice/%02d", i)
		want[k] = true
		put(b, k, "b-"+k)
		for j := 0; j < 3; j++ {
			put(a, k, fmt.Sprintf("a%d-%s", j, k))
		}
		put(a, fmt.Sprintf("only-a/%02d", i), "a")
		put(b, fmt.Sprintf("only-b/%02d", i), "b")
	}
	for _, px := range m.proxies {
		px.setDup(0.5)
		px.loseNextAcks(3)
		px.setDown(false)
	}
	m.converge(60 * time.Second)

	logs := map[string]map[string]client.Conflict{}
	check := func() {
		t.Helper()
		for _, p := range []*proc{a, b} {
			all, err := p.client().ConflictsAll(bg(), client.ConflictQuery{})
			if err != nil {
				t.Fatalf("%s conflicts: %v", p.name, err)
			}
			byKey := map[string]client.Conflict{}
			ids := map[string]client.Conflict{}
			for _, c := range all {
				if _, dup := byKey[c.Key]; dup {
					t.Fatalf("%s logged %s twice: %+v", p.name, c.Key, all)
				}
				byKey[c.Key], ids[c.ID] = c, c
			}
			var missing, extra []string
			for k := range want {
				if _, ok := byKey[k]; !ok {
					missing = append(missing, k)
				}
			}
			for k := range byKey {
				if !want[k] {
					extra = append(extra, k)
				}
			}
			if len(missing)+len(extra) > 0 {
				t.Fatalf("%s: conflicts missing for %v, logged for keys not written on both sides: %v", p.name, missing, extra)
			}
			for k, c := range byKey {
				v, err := p.client().Get(bg(), k)
				if err != nil {
					t.Fatal(err)
				}
				if c.Winner.Version != v.Version || c.Possible {
					t.Fatalf("%s: %s's record names winner %s (possible %v), the key holds %s", p.name, k, c.Winner.Version, c.Possible, v.Version)
				}
				// The loser is the other side's last write of the key.
				aLast := "a-" + k
				if strings.HasPrefix(k, "thrice/") {
					aLast = "a2-" + k
				}
				lost := aLast
				if string(v.Value) == aLast {
					lost = "b-" + k
				}
				if string(c.Loser.Value) != lost {
					t.Fatalf("%s: %s lost %q, want %q (the key holds %q)", p.name, k, c.Loser.Value, lost, v.Value)
				}
			}
			logs[p.name] = ids
		}
		for id := range logs["a"] {
			if _, ok := logs["b"][id]; !ok {
				t.Fatalf("conflict %s (%s) logged at a, not at b", id, logs["a"][id].Key)
			}
		}
	}
	check()

	// A receiver killed and restarted, and replication run again from
	// its marks, logs nothing twice.
	b.kill()
	put(a, "after-restart", "x")
	b.startReady()
	m.converge(60 * time.Second)
	check()

	// Sequential: written at a, seen at b, overwritten at b, seen at a.
	put(a, "seq", "a")
	m.converge(30 * time.Second)
	put(b, "seq", "b")
	m.converge(30 * time.Second)
	for _, p := range []*proc{a, b} {
		p2, err := p.client().Conflicts(bg(), client.ConflictQuery{Key: "seq"})
		if err != nil || len(p2.Items) != 0 {
			t.Fatalf("%s logged a sequential overwrite: %+v %v", p.name, p2.Items, err)
		}
	}

	// Restore both/00's loser at b; both clusters hold it, both logs say
	// restored, and a second restore is refused.
	rec := logs["b"]
	var id string
	for i, c := range rec {
		if c.Key == "both/00" {
			id = i
		}
	}
	res, err := b.client().RestoreConflict(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	m.converge(30 * time.Second)
	for _, p := range []*proc{a, b} {
		v, err := p.client().Get(bg(), "both/00")
		if err != nil || string(v.Value) != string(rec[id].Loser.Value) || v.Version != res.Version {
			t.Fatalf("%s after the restore: %q %s %v", p.name, v.Value, v.Version, err)
		}
		pg, err := p.client().Conflicts(bg(), client.ConflictQuery{Key: "both/00"})
		if err != nil || len(pg.Items) != 1 || pg.Items[0].Restored != res.Version {
			t.Fatalf("%s's log after the restore: %+v %v", p.name, pg.Items, err)
		}
	}
	var ce *client.Error
	if _, err := a.client().RestoreConflict(bg(), id); !errors.As(err, &ce) || ce.Status != 409 || ce.Code != "restored" {
		t.Fatalf("a second restore: %v", err)
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("%d conflicts logged at both clusters under the same IDs (%s ... %s)", len(keys), keys[0], keys[len(keys)-1])
}

package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
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

// TestConflictLogThroughFailover: two clusters of three nodes write the
// same keys at once, and cluster a's leader is killed in the middle: every
// node of both clusters ends with the same conflict log (the same IDs, each
// key once), since the records are decided in the clusters' logs and a
// batch applied before the failover is a duplicate after it.
func TestConflictLogThroughFailover(t *testing.T) {
	// held: each leader's link holds its writes, so nearly every key is
	// written on both sides before either sees the other's; live: the
	// links flow, and only the writes that cross in flight meet.
	// The two run side by side (each waits on elections and links far
	// more than it computes): 47 s of CI's e2e package run one after the
	// other.
	t.Run("held", func(t *testing.T) { t.Parallel(); conflictsThroughFailover(t, true) })
	t.Run("live", func(t *testing.T) { t.Parallel(); conflictsThroughFailover(t, false) })
}

func conflictsThroughFailover(t *testing.T, held bool) {
	m := newRaftMesh(t, []string{"a", "b"}, 3)
	m.start()
	// Both clusters' logs keep contexts (format 4, which a new cluster of
	// several reaches once its leader has heard from every member): before
	// that, versions carry none and what they discard is not judged.
	eventually(t, 30*time.Second, func() (bool, string) {
		for c, peer := range map[string]string{"a": "b", "b": "a"} {
			l := m.leader(c)
			if l == nil {
				return false, "no leader in " + c
			}
			for _, st := range peersReport(t, l.proc).Links {
				if st.Peer == peer && (st.Limits == nil || !st.Limits.Contexts) {
					return false, fmt.Sprintf("%s's link to %s: the peer does not keep contexts yet", l.id, peer)
				}
			}
		}
		return true, ""
	})
	// Each leader's link holds what it has (a's new leader's does not:
	// a pause belongs to a link, not to the log), so most writes meet.
	for c, peer := range map[string]string{"a": "b", "b": "a"} {
		if !held {
			break
		}
		if _, err := m.waitLeader(c, 30*time.Second).client().Do(bg(), http.MethodPost, "/admin/peers/"+peer+"/pause", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	const keys = 400
	var wg sync.WaitGroup
	killed := make(chan struct{})
	for _, c := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			members := m.members(c)
			at := 0
			for i := 0; i < keys; i++ {
				if c == "a" && i == keys/3 {
					l := m.waitLeader("a", 30*time.Second)
					l.kill()
					m.setDown(l.id, true)
					close(killed)
				}
				k := fmt.Sprintf("k%03d", i)
				for try := 0; try < 20; try++ {
					n := members[at%len(members)]
					cl := client.New(n.url, &client.Options{HTTPClient: &http.Client{Timeout: 3 * time.Second}})
					if _, err := cl.Put(bg(), k, []byte(c+"-"+k)); err == nil {
						break
					}
					at++ // a node down or out of the cluster: the next
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	<-killed
	if _, err := m.waitLeader("b", 30*time.Second).client().Do(bg(), http.MethodPost, "/admin/peers/a/resume", nil, nil, nil); err != nil && held {
		t.Fatal(err)
	}
	for _, n := range m.members("a") {
		if m.down[n.id] {
			n.startReady()
			m.setDown(n.id, false)
		}
	}
	eventually(t, 120*time.Second, m.converged)
	var first string
	var firstLog map[string]string
	for _, n := range m.running() {
		all, err := n.client().ConflictsAll(bg(), client.ConflictQuery{})
		if err != nil {
			t.Fatalf("%s: %v", n.id, err)
		}
		lg := map[string]string{}
		perKey := map[string]int{}
		for _, c := range all {
			lg[c.ID] = c.Key
			perKey[c.Key]++
			if perKey[c.Key] > 1 {
				t.Fatalf("%s logged %s twice: %+v", n.id, c.Key, all)
			}
		}
		if first == "" {
			first, firstLog = n.id, lg
			if len(lg) < keys/10 && held {
				t.Fatalf("%s logged %d conflicts of %d keys written at once on both sides", n.id, len(lg), keys)
			}
			continue
		}
		if len(lg) != len(firstLog) {
			for _, c := range all {
				if _, ok := firstLog[c.ID]; !ok {
					t.Logf("only at %s: %+v", n.id, c)
				}
			}
			other, _ := m.nodes[first].client().ConflictsAll(bg(), client.ConflictQuery{})
			for _, c := range other {
				if _, ok := lg[c.ID]; !ok {
					t.Logf("only at %s: %+v", first, c)
					for _, x := range []*rnode{n, m.nodes[first]} {
						v, err := x.client().Get(bg(), c.Key)
						t.Logf("  %s holds %s: %s %v", x.id, c.Key, v.Version, err)
					}
				}
			}
			t.Fatalf("%s logged %d conflicts, %s %d", n.id, len(lg), first, len(firstLog))
		}
		for id := range firstLog {
			if _, ok := lg[id]; !ok {
				t.Fatalf("conflict %s (%s) at %s, not at %s", id, firstLog[id], first, n.id)
			}
		}
	}
	t.Logf("%d conflicts of %d keys, the same on all six nodes through a leader kill", len(firstLog), keys)
}

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestReseedBesideLiveWrites: a peer that fell behind the WAL is re-seeded
// over a link limited to 1 MiB/s, and live writes keep replicating while
// the snapshot goes (they arrive while the re-seed still runs). The sender
// is killed in the middle of it and restarted: the peer's heartbeat answer
// says a re-seed began and never ended, the sender sends it again, and
// the clusters converge with every index accounted for. The limit holds
// over every 5-second window throughout, as measured at the receiver.
func TestReseedBesideLiveWrites(t *testing.T) {
	s := seed(t)
	m := newMesh(t, s, true, "a", "b")
	a, b := m.nodes["a"], m.nodes["b"]
	a.args = append(a.args, "--peer-bandwidth", "b=1MiB",
		"--wal-high-water-entries", "200", "--wal-low-water-entries", "50", "--peer-overflow", "b=detach")
	a.startReady()
	rng := newRand(s)
	value := make([]byte, 4096)
	const keys = 1500 // about 6 MiB: a re-seed of 12 seconds or more at half of 1 MiB/s
	for i := 0; i < keys; i++ {
		for j := range value {
			value[j] = byte('a' + rng.IntN(26))
		}
		if _, err := a.client().Put(bg(), fmt.Sprintf("k%05d", i), value); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < keys; i += 10 {
		if _, err := a.client().Delete(bg(), fmt.Sprintf("k%05d", i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, func() (bool, string) {
		w := walLast(t, a)
		st, detached := linkState(t, a, "b")
		return st == "needs_reseed" && detached && w.First > w.Last,
			fmt.Sprintf("link %s detached=%v, WAL [%d, %d]", st, detached, w.First, w.Last)
	})

	b.startReady()
	eventually(t, 30*time.Second, func() (bool, string) {
		r := linkOf(t, a, "b").Reseed
		return r.Running && r.Live && r.Sent > 0, fmt.Sprintf("re-seed %+v", r)
	})
	// Live writes while the snapshot goes: each one reaches b while the
	// re-seed is still running.
	for i := 0; i < 20; i++ {
		if _, err := a.client().Put(bg(), fmt.Sprintf("live/%02d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		for i := 0; i < 20; i++ {
			if _, err := b.client().Get(bg(), fmt.Sprintf("live/%02d", i)); err != nil {
				return false, fmt.Sprintf("live/%02d not at b yet: %v", i, err)
			}
		}
		return true, ""
	})
	if r := linkOf(t, a, "b").Reseed; !r.Running || r.Sent >= r.Total {
		t.Fatalf("the live writes arrived only once the re-seed was over: %+v", r)
	}

	// The sender dies in the middle of the re-seed; restarted, it learns
	// from b that the re-seed never ended and sends it again.
	a.kill()
	a.startReady()
	eventually(t, 30*time.Second, func() (bool, string) {
		r := linkOf(t, a, "b").Reseed
		return r.Runs > 0 && strings.Contains(r.LastReason, "never ended"), fmt.Sprintf("re-seed after the restart: %+v", r)
	})
	if _, err := a.client().Put(bg(), "after-restart", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m.converge(120 * time.Second)
	idle(t, 60*time.Second, a, b)
	accountsFor(t, b, a)
	for _, k := range []string{"live/19", "after-restart", fmt.Sprintf("k%05d", keys-1)} {
		if _, err := b.client().Get(bg(), k); err != nil {
			t.Fatalf("b lacks %s: %v", k, err)
		}
	}
	if _, err := b.client().Get(bg(), "k00010"); err == nil {
		t.Fatal("b holds k00010, which a deleted")
	}
	const limit = 1 << 20
	most, total := m.proxies["a->b"].maxWindow(5 * time.Second)
	t.Logf("1 MiB/s with a re-seed: %d bytes arrived, at most %d in a 5 s window (%.3f of the limit)", total, most, float64(most)/(5*limit))
	if float64(most) > 1.1*5*limit {
		t.Fatalf("%d bytes in one 5 s window: over 1.1 x 5 MiB", most)
	}
}

package e2e

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/store"
)

var repairKeys = flag.Int("repair-keys", 80000, "TestRepairOfALargeDivergence: keys b holds that a never got (issue 49: 200000)")

// TestRepairOfALargeDivergence (issue 49, 6): b holds -repair-keys writes
// of its own that a never got (written into b's tree while b was down, so
// b's stream never carried them): more differing leaves than one pass
// compares. One `replicator repair` at a pulls every one of them, pass
// after pass, printing its progress; then a and b hold the same, and a
// diff says so.
func TestRepairOfALargeDivergence(t *testing.T) {
	n := *repairKeys
	a := newProc(t, "a", "a", "--antientropy-interval", "-1s")
	b := newProc(t, "b", "b", "--antientropy-interval", "-1s", "--peer", "a="+a.url, "--peer-secret", "a=secret-ab")
	a.args = append(a.args, "--peer", "b="+b.url, "--peer-secret", "b=secret-ab")
	a.startReady()
	b.startReady()
	if _, err := a.client().Put(bg(), "shared", []byte("v")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		_, err := b.client().Get(bg(), "shared")
		return err == nil, fmt.Sprint(err)
	})
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(b.dataDir(), "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	for first := 0; first < n; first += 10000 {
		batch := st.NewBatch()
		for i := first; i < min(first+10000, n); i++ {
			w := store.Write{Key: fmt.Sprintf("lost/%07d", i), Value: []byte("b's"), Stamp: entry.Stamp{HLC: hlc.Timestamp{Wall: now + int64(i)}, Origin: "b"}}
			if _, err := batch.Merge(w); err != nil {
				t.Fatal(err)
			}
		}
		if err := batch.Commit(true); err != nil {
			t.Fatal(err)
		}
		batch.Close()
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	b.startReady()

	start := time.Now()
	stdout, stderr, code := cli(t, nil, "repair", "--peer", "b", "--addr", a.url)
	t.Logf("repair of %d keys in %s\n%s%s", n, time.Since(start).Round(time.Millisecond), stderr, stdout)
	if code != 0 {
		t.Fatalf("repair exited %d", code)
	}
	if want := fmt.Sprintf("repaired: %d versions pulled from b", n); !strings.Contains(stdout, want) {
		t.Fatalf("repair says %q, want %q", stdout, want)
	}
	if n > 65536 && !strings.Contains(stderr, "pass 2:") {
		t.Fatalf("a divergence of %d keys repaired in one pass: the test proved nothing\n%s", n, stderr)
	}
	stdout, _, code = cli(t, nil, "diff", "--peer", "b", "--addr", a.url)
	if code != 0 || !strings.HasPrefix(stdout, "equal:") {
		t.Fatalf("after the repair: %d %s", code, stdout)
	}
	// A diff over a lagging link: a's link to b paused 12 s with writes
	// behind it, so the comparison waits for the link before it compares.
	// With --timeout 2m it completes (it died at 10 s whatever the flag
	// said: issue 49).
	if _, _, code := cli(t, nil, "admin", "pause", "b", "--addr", a.url); code != 0 {
		t.Fatal("pause")
	}
	for i := range 20 {
		if _, err := a.client().Put(bg(), fmt.Sprintf("late/%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		time.Sleep(12 * time.Second)
		cli(t, nil, "admin", "resume", "b", "--addr", a.url)
	}()
	start = time.Now()
	stdout, stderr, code = cli(t, nil, "diff", "--peer", "b", "--timeout", "2m", "--addr", a.url)
	took := time.Since(start)
	if code != 0 || !(strings.HasPrefix(stdout, "equal:") || strings.HasPrefix(stdout, "no divergent key")) || took < 10*time.Second {
		t.Fatalf("a diff over a link lagging 12 s: exit %d in %s\n%s%s", code, took.Round(time.Millisecond), stdout, stderr)
	}
	t.Logf("a diff over a link lagging 12 s completed in %s: %s", took.Round(time.Millisecond), strings.TrimSpace(stdout))
}

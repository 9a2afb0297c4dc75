package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSecretRotationUnderLoad (issue 49): a link's secret rotated while both
// clusters write, in the documented order (docs/OPERATIONS.md "Rotating a
// link's secret"): each step is a new secret file and a SIGHUP, at a, then
// at b, then the next step: (1) the new secret added second (taken, not
// yet sent), (2) first (sent, the old one still taken), (3) alone. No
// request is refused on either side at any step, and every acknowledged
// write reaches the other cluster; after step 3, the old secret is
// refused.
func TestSecretRotationUnderLoad(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"a": filepath.Join(dir, "a.secret"), "b": filepath.Join(dir, "b.secret")}
	const old, neu = "old-secret-0123456789abcdef", "new-secret-fedcba9876543210"
	write := func(name string, secrets ...string) {
		body := ""
		for _, s := range secrets {
			body += s + "\n"
		}
		if err := os.WriteFile(files[name], []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a", old)
	write("b", old)
	m := &mesh{t: t, nodes: map[string]*proc{}, names: []string{"a", "b"}}
	for _, n := range m.names {
		m.nodes[n] = newProc(t, n, n)
	}
	m.nodes["a"].args = append(m.nodes["a"].args, "--peer", "b="+m.nodes["b"].url, "--peer-secret-file", "b="+files["a"])
	m.nodes["b"].args = append(m.nodes["b"].args, "--peer", "a="+m.nodes["a"].url, "--peer-secret-file", "a="+files["b"])
	m.start()

	var mu sync.Mutex
	acked := map[string]map[string]string{"a": {}, "b": {}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range m.names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := m.nodes[name].client()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("%s/%05d", name, i), fmt.Sprint(i)
				if _, err := cl.Put(bg(), k, []byte(v)); err == nil {
					mu.Lock()
					acked[name][k] = v
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	hup := func(name string) {
		m.nodes[name].signal(syscall.SIGHUP)
		time.Sleep(700 * time.Millisecond) // writes flow between each change
	}
	time.Sleep(500 * time.Millisecond)
	for _, step := range [][]string{{old, neu}, {neu, old}, {neu}} {
		for _, name := range m.names {
			write(name, step...)
			hup(name)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	m.converge(60 * time.Second)
	for _, name := range m.names {
		r := peersReport(t, m.nodes[name])
		if n := r.Refusals["unauthenticated"]; n != 0 {
			t.Fatalf("%s refused %d requests as unauthenticated during the rotation", name, n)
		}
	}
	mu.Lock()
	for from, ws := range acked {
		to := map[string]string{"a": "b", "b": "a"}[from]
		for k, v := range ws {
			got, err := m.nodes[to].client().Get(bg(), k)
			if err != nil || string(got.Value) != v {
				t.Fatalf("%s's %s at %s: %q %v, acknowledged %q", from, k, to, got.Value, err, v)
			}
		}
	}
	n := len(acked["a"]) + len(acked["b"])
	mu.Unlock()
	// The old secret is no longer taken: a sender still holding it is
	// refused.
	write("a", old)
	hup("a")
	eventually(t, 20*time.Second, func() (bool, string) {
		r := peersReport(t, m.nodes["b"])
		return r.Refusals["unauthenticated"] > 0, fmt.Sprintf("b refused %d of a's requests with the old secret", r.Refusals["unauthenticated"])
	})
	t.Logf("secret rotated in three steps under writes at both clusters: %d acknowledged writes crossed, none refused; the old secret is refused after", n)
}

package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPeerAddedAtRunTime (issue 49): a third cluster joins a running pair
// while all three write, by `replicator peer add` at a and at b (c names
// them by its flags): the three converge, every acknowledged write
// everywhere. Removed at a and b, c's link from them stops and c's writes
// are refused there; added again, its link begins anew (a re-seed) and the
// three converge once more. The secret given at run time is in no admin
// answer and not in the log in clear.
func TestPeerAddedAtRunTime(t *testing.T) {
	dir := t.TempDir()
	key := make([]byte, 32)
	rand.Read(key)
	keyFile := filepath.Join(dir, "secrets.key")
	os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600)
	secretFiles := map[string]string{}
	for _, pair := range []string{"ac", "bc"} {
		secretFiles[pair] = filepath.Join(dir, pair+".secret")
		os.WriteFile(secretFiles[pair], []byte("runtime-secret-"+pair+"-0123456789\n"), 0o600)
	}
	m := &mesh{t: t, nodes: map[string]*proc{}, names: []string{"a", "b", "c"}}
	for _, n := range m.names {
		m.nodes[n] = newProc(t, n, n)
	}
	a, b, c := m.nodes["a"], m.nodes["b"], m.nodes["c"]
	a.args = append(a.args, "--peer", "b="+b.url, "--peer-secret", "b=secret-ab", "--secrets-key-file", keyFile)
	b.args = append(b.args, "--peer", "a="+a.url, "--peer-secret", "a=secret-ab", "--secrets-key-file", keyFile)
	c.args = append(c.args, "--peer", "a="+a.url, "--peer-secret", "a=runtime-secret-ac-0123456789",
		"--peer", "b="+b.url, "--peer-secret", "b=runtime-secret-bc-0123456789")
	m.start()

	var mu sync.Mutex
	acked := map[string]string{}
	round := 0
	// write runs a writer at every cluster for d (all three write at once,
	// as the peers change under them).
	write := func(d time.Duration) {
		round++
		stop := time.Now().Add(d)
		var wg sync.WaitGroup
		for _, name := range m.names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl := m.nodes[name].client()
				for i := 0; time.Now().Before(stop); i++ {
					k := fmt.Sprintf("%s/%d/%05d", name, round, i)
					if _, err := cl.Put(bg(), k, []byte(k)); err == nil {
						mu.Lock()
						acked[k] = k
						mu.Unlock()
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
	}
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(binPath, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("replicator %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	addC := func() {
		for _, p := range []*proc{a, b} {
			out := cli("peer", "add", "c", c.url, "--secret-file", secretFiles[p.name+"c"], "--addr", p.url)
			if !strings.Contains(out, "sealed in the cluster's log") {
				t.Fatalf("peer add at %s: %s", p.name, out)
			}
		}
	}
	write(500 * time.Millisecond)
	done := make(chan struct{})
	go func() { write(time.Second); close(done) }()
	addC() // while all three write
	<-done
	m.converge(60 * time.Second)
	// No secret in an answer.
	for _, p := range []*proc{a, b} {
		for _, path := range []string{"/admin/peers", "/admin/peers/c"} {
			var raw []byte
			if _, err := p.client().Do(bg(), "GET", path, nil, nil, &raw); err != nil || strings.Contains(string(raw), "runtime-secret") {
				t.Fatalf("%s %s holds the secret (%v)", p.name, path, err)
			}
		}
	}

	// Removed: a and b stop their links to c and refuse it.
	for _, p := range []*proc{a, b} {
		cli("peer", "remove", "c", "--addr", p.url)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		for _, p := range []*proc{a, b} {
			for _, l := range peersReport(t, p).Links {
				if l.Peer == "c" {
					return false, p.name + " still links to c"
				}
			}
		}
		return true, ""
	})
	refusedBefore := peersReport(t, a).Refusals["unauthenticated"]
	write(2 * time.Second) // c's link retries, refused
	if n := peersReport(t, a).Refusals["unauthenticated"]; n <= refusedBefore {
		t.Fatalf("a took c's requests after removing it (%d refusals, %d before)", n, refusedBefore)
	}

	// Added again, while all three write: the three converge.
	done = make(chan struct{})
	go func() { write(time.Second); close(done) }()
	addC()
	<-done
	m.converge(90 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	for k, v := range acked {
		for _, p := range []*proc{a, b, c} {
			got, err := p.client().Get(bg(), k)
			if err != nil || string(got.Value) != v {
				t.Fatalf("%s at %s: %q %v", k, p.name, got.Value, err)
			}
		}
	}
	t.Logf("c added at run time to a running pair, removed and added again under writes at all three: %d acknowledged writes everywhere", len(acked))
}

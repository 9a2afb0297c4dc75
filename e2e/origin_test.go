package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
)

func originOf(t *testing.T, p *proc) api.OriginReport {
	var o api.OriginReport
	if _, err := p.client().Do(bg(), http.MethodGet, "/admin/origin", nil, nil, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestResolversEndToEnd starts real nodes whose cluster comes from the
// environment, a file, and the host name.
func TestResolversEndToEnd(t *testing.T) {
	dir := t.TempDir()
	idFile := filepath.Join(dir, "cluster")
	os.WriteFile(idFile, []byte("from-file\n"), 0o644)
	tests := []struct {
		spec, env, want string
	}{
		{"env:REPL_CLUSTER", "REPL_CLUSTER=from-env", "from-env"},
		{"file:" + idFile, "", "from-file"},
		{`hostname:^(?P<cluster>[a-z0-9-]+)-node-[0-9]+$`, "REPLICATOR_HOSTNAME=eu-west-node-7", "eu-west"},
	}
	for _, tc := range tests {
		p := newProc(t, "n", "unused")
		// replace --cluster-id with --origin
		for i, a := range p.args {
			if a == "--cluster-id" {
				p.args[i], p.args[i+1] = "--origin", tc.spec
			}
		}
		if tc.env != "" {
			p.env = append(p.env, tc.env)
		}
		p.startReady()
		o := originOf(t, p)
		if o.Cluster != tc.want || !strings.HasPrefix(o.Resolver, strings.SplitN(tc.spec, ":", 2)[0]+":") {
			t.Fatalf("%s: /admin/origin %+v, want cluster %s", tc.spec, o, tc.want)
		}
		p.kill()
	}
	// a host name the expression does not match refuses to start, naming both
	out, err := exec.Command(binPath, "serve", "--origin", `hostname:^(?P<cluster>[a-z]+)-node-[0-9]+$`,
		"--data", t.TempDir(), "--listen", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "hostname:") {
		t.Fatalf("unmatched host name: %v %s", err, out)
	}
}

// TestReassignOrigin: a data directory refuses another cluster ID, naming
// both; --reassign-origin takes it over and says so in the log.
func TestReassignOrigin(t *testing.T) {
	p := newProc(t, "a", "east-1")
	p.startReady()
	p.kill()
	run := func(extra ...string) (string, error) {
		args := []string{"serve", "--cluster-id", "west-2", "--data", p.dataDir(), "--listen", "127.0.0.1:0"}
		cmd := exec.Command(binPath, append(args, extra...)...)
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
			return string(out), err
		case <-time.After(3 * time.Second):
			cmd.Process.Kill()
			<-done
			return string(out), nil
		}
	}
	out, err := run()
	if err == nil || !strings.Contains(out, "east-1") || !strings.Contains(out, "west-2") {
		t.Fatalf("start as another cluster: %v\n%s", err, out)
	}
	out, _ = run("--reassign-origin")
	if !strings.Contains(out, "reassigned") || !strings.Contains(out, "previous=east-1") {
		t.Fatalf("--reassign-origin not logged:\n%s", out)
	}
	b, _ := os.ReadFile(filepath.Join(p.dataDir(), "CLUSTER_ID"))
	if strings.TrimSpace(string(b)) != "west-2" {
		t.Fatalf("pin after reassign: %q", b)
	}
}

func TestInvalidClusterIDRefused(t *testing.T) {
	for _, id := range []string{"Bad_ID!", "-x", strings.Repeat("a", 64)} {
		out, err := exec.Command(binPath, "serve", "--cluster-id", id, "--data", t.TempDir(), "--listen", "127.0.0.1:0").CombinedOutput()
		if err == nil || !strings.Contains(string(out), fmt.Sprintf("%q", id)) {
			t.Fatalf("%q: %v %s", id, err, out)
		}
	}
}

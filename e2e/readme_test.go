package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestREADMERecipes runs the README's recipes on loopback as written (the
// pair of clusters, and the cluster of three), in a shell, with two
// substitutions only: this test's binary for the `go build` line, and a
// directory of the test's for /tmp. They wait for the nodes they start
// (healthcheck --ready --wait) before they write; the image's recipe is run
// by deploy's TestDockerfile.
func TestREADMERecipes(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	want := map[string][]string{
		"--peer b=http://127.0.0.1:7402": {"hello", "healthy", "digest"},
		"--raft-listen 127.0.0.1:750$i":  {"leader", "voters     3 of 3 answering", "k\tversion"},
	}
	ran := 0
	for _, m := range blocks {
		script := m[1]
		if strings.Contains(script, "docker ") {
			continue
		}
		var expect []string
		for marker, w := range want {
			if strings.Contains(script, marker) {
				expect = w
			}
		}
		if expect == nil {
			continue
		}
		ran++
		dir := t.TempDir()
		if err := os.Symlink(binPath, filepath.Join(dir, "replicator")); err != nil {
			t.Fatal(err)
		}
		script = regexp.MustCompile(`(?m)^go build -o replicator ./cmd/replicator\n`).ReplaceAllString(script, "")
		script = strings.ReplaceAll(script, "/tmp/", dir+"/")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-e", "-c", "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n"+script)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("the README's recipe failed: %v\n--- script\n%s\n--- output\n%s", err, script, out.String())
		}
		for _, w := range expect {
			if !strings.Contains(out.String(), w) {
				t.Fatalf("the README's recipe printed no %q:\n%s", w, out.String())
			}
		}
	}
	if ran != len(want) {
		t.Fatalf("ran %d of the README's %d loopback recipes: a recipe's marker changed", ran, len(want))
	}
}

// Package e2e runs real `replicator serve` child processes, built once per
// test run, on free loopback ports and temporary directories, and checks
// what they hold from the outside.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/replicator/replicator/client"
)

var (
	binPath  string
	seedFlag = flag.Uint64("seed", 0, "seed for randomized tests (0: from the clock)")
)

func TestMain(m *testing.M) {
	flag.Parse()
	redis.SetLogger(quietRedisLog{})
	dir, err := os.MkdirTemp("", "replicator-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "replicator")
	build := exec.Command("go", "build", "-o", binPath, "../cmd/replicator")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the binary:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// seed returns the test's seed, printed so a failure can be replayed with
// -seed.
func seed(t *testing.T) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -seed %d)", s, s)
	return s
}

func newRand(s uint64) *rand.Rand { return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15)) }

// freePort returns a loopback port that was free a moment ago, and that no
// earlier call of this test binary returned: the kernel hands a released
// port out again soon, and two nodes given one port (a raft port and
// another node's gossip port) fail to start.
func freePort(t *testing.T) int {
	t.Helper()
	handedMu.Lock()
	defer handedMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handed[port] {
			handed[port] = true
			return port
		}
	}
}

var (
	handedMu sync.Mutex
	handed   = map[int]bool{}
)

// proc is one `replicator serve` child process that can be killed and
// restarted with the same arguments.
type proc struct {
	t    *testing.T
	name string
	args []string
	env  []string
	log  string
	url  string
	// token, when set, is the API token client() sends.
	token string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited and been reaped
	waitErr error
}

// newProc prepares a node on a free port with its own data directory. extra
// arguments follow the defaults.
func newProc(t *testing.T, name, cluster string, extra ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	p := &proc{
		t:    t,
		name: name,
		log:  filepath.Join(logDir(dir), name+".log"),
		url:  fmt.Sprintf("http://127.0.0.1:%d", port),
		args: append([]string{"serve", "--cluster-id", cluster, "--data", filepath.Join(dir, "data"),
			"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "debug"}, extra...),
	}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) > 30 {
				lines = lines[len(lines)-30:]
			}
			t.Logf("last lines of %s's log:\n%s", p.name, strings.Join(lines, "\n"))
		}
	})
	return p
}

// logDir is where a node's log goes: its test directory, or
// $E2E_KEEP_LOGS (kept after the run, to read a long run's failure whole).
func logDir(dir string) string {
	if d := os.Getenv("E2E_KEEP_LOGS"); d != "" {
		os.MkdirAll(d, 0o755)
		return d
	}
	return dir
}

func (p *proc) dataDir() string {
	for i, a := range p.args {
		if a == "--data" {
			return p.args[i+1]
		}
	}
	return ""
}

func (p *proc) start() {
	p.t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(binPath, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	// A node dies with the test binary, even one that crashed or was
	// killed before its cleanups ran (orphaned nodes took CPU from the
	// runs after them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), p.env...)
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	f.Close()
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	go func() {
		// Exits when the child does.
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()
}

// startReady starts the node and waits until /healthz answers.
func (p *proc) startReady() {
	p.t.Helper()
	p.start()
	p.waitReady(30 * time.Second)
}

func (p *proc) waitReady(d time.Duration) {
	p.t.Helper()
	c := client.New(p.url, nil)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Healthy(ctx)
		cancel()
		if err == nil {
			return
		}
		p.mu.Lock()
		exited := p.exited
		p.mu.Unlock()
		select {
		case <-exited:
			deadline = time.Time{}
		case <-time.After(50 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(p.log)
	p.t.Fatalf("%s did not become healthy; log:\n%s", p.name, tail(string(b), 20))
}

// kill sends SIGKILL and reaps the process.
func (p *proc) kill() {
	p.signalWait(syscall.SIGKILL)
}

// stop sends SIGTERM and waits for a graceful exit.
func (p *proc) stop() error {
	return p.signalWait(syscall.SIGTERM)
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(sig)
	}
}

func (p *proc) signalWait(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(sig)
	<-exited
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

func (p *proc) client() *client.Client {
	if p.token != "" {
		return client.New(p.url, &client.Options{Token: p.token})
	}
	return client.New(p.url, nil)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func bg() context.Context { return context.Background() }

// eventually polls cond until it holds or d passes; it fails the test with
// the last reason cond gave. Convergence is polled, never slept on.
func eventually(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var why string
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = cond(); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("condition not reached in %s: %s", d, why)
}

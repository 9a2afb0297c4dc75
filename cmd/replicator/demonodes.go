package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/internal/loopback"
	"github.com/replicator/replicator/policy"
)

// demoNode is one `replicator serve` child of `demo --nodes N`.
type demoNode struct {
	id, cluster string
	url         string
	args        []string
	log         string
	cmd         *exec.Cmd
}

func (d *demoNode) start() error {
	f, err := os.OpenFile(d.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	d.cmd = exec.Command(self, d.args...)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	return d.cmd.Start()
}

func (d *demoNode) kill() {
	if d.cmd != nil && d.cmd.Process != nil {
		d.cmd.Process.Kill()
		d.cmd.Wait()
		d.cmd = nil
	}
}

func (d *demoNode) stop() {
	if d.cmd != nil && d.cmd.Process != nil {
		d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			d.cmd.Process.Kill()
			<-done
		}
		d.cmd = nil
	}
}

func (d *demoNode) client() *client.Client { return client.New(d.url, nil) }

func (d *demoNode) report(ctx context.Context) (api.ClusterReport, error) {
	var r api.ClusterReport
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := d.client().Do(ctx, http.MethodGet, "/admin/cluster?local=1", nil, nil, &r)
	return r, err
}

// runDemoNodes is `demo --nodes N`: two clusters of N nodes each as child
// processes on loopback, writes at every node of both, the leader of a
// SIGKILLed mid-run, the failover and the convergence shown.
func runDemoNodes(size, writes int, keep bool, timeout time.Duration) error {
	dir, err := os.MkdirTemp("", "replicator-demo-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	type addrs struct{ api, raft, gossip string }
	all := map[string]addrs{}
	var order []string
	free, err := loopback.Addrs(2 * size * 3)
	if err != nil {
		return err
	}
	for _, c := range []string{"a", "b"} {
		for i := 1; i <= size; i++ {
			id := fmt.Sprintf("%s%d", c, i)
			a := addrs{free[0], free[1], free[2]}
			free = free[3:]
			all[id] = a
			order = append(order, id)
		}
	}
	nodes := map[string]*demoNode{}
	for _, id := range order {
		c := id[:1]
		peer := map[string]string{"a": "b", "b": "a"}[c]
		args := []string{"serve", "--cluster-id", c, "--node-id", id, "--data", filepath.Join(dir, id), "--listen", all[id].api,
			"--raft-listen", all[id].raft, "--gossip-bind", all[id].gossip, "--gossip-profile", "local",
			"--bootstrap-expect", fmt.Sprint(size), "--raft-election-timeout", "500ms",
			"--peer", peer + "=http://" + all[peer+"1"].api, "--peer-secret", peer + "=demo-secret", "--log-level", "warn"}
		for _, o := range order {
			if o[:1] == c && o != id {
				args = append(args, "--join", all[o].gossip)
			}
		}
		nodes[id] = &demoNode{id: id, cluster: c, url: "http://" + all[id].api, args: args, log: filepath.Join(dir, id+".log")}
	}
	defer func() {
		if keep {
			return
		}
		for _, n := range nodes {
			n.stop()
		}
	}()
	for _, id := range order {
		if err := nodes[id].start(); err != nil {
			return err
		}
	}
	ctx := context.Background()
	leaderOf := func(c string) *demoNode {
		for _, id := range order {
			if n := nodes[id]; n.cluster == c && n.cmd != nil {
				if r, err := n.report(ctx); err == nil && r.State == "leader" {
					return n
				}
			}
		}
		return nil
	}
	waitLeader := func(c string, d time.Duration) (*demoNode, error) {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if l := leaderOf(c); l != nil {
				return l, nil
			}
		}
		return nil, fmt.Errorf("cluster %s elected no leader in %s (logs in %s)", c, d, dir)
	}
	for _, c := range []string{"a", "b"} {
		l, err := waitLeader(c, 30*time.Second)
		if err != nil {
			return err
		}
		fmt.Printf("cluster %s: %d nodes formed by gossip; %s leads\n", c, size, l.id)
	}

	// Every node of both clusters takes writes; a's leader dies a third in.
	var wg sync.WaitGroup
	var acked, failed, gone atomic.Int64
	start := time.Now()
	// Writers retry under an idempotency key (a write answered 503 during
	// the election is retried, and one whose answer was lost applies once).
	retry := policy.MustNew(policy.Options{MaxAttempts: 20, InitialDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond})
	const writers = 4 // per node
	for _, id := range order {
		n := nodes[id]
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl := client.New(n.url, &client.Options{Retry: retry, HTTPClient: &http.Client{Timeout: 5 * time.Second}})
				for i := w; i < writes/size; i += writers {
					key := fmt.Sprintf("demo/%s/%05d", n.id, i)
					if i%10 == 0 {
						key = fmt.Sprintf("demo/shared/%03d", i/10%100)
					}
					wctx := policy.WithKey(ctx, policy.Key{ID: fmt.Sprintf("demo-%s-%d", n.id, i)})
					if _, err := cl.Put(wctx, key, []byte("written at "+n.id)); err != nil {
						var ce *client.Error
						if !errors.As(err, &ce) {
							// its node was killed: its client gives up on it
							gone.Add(int64((writes/size - i + writers - 1) / writers))
							return
						}
						failed.Add(1)
						continue
					}
					acked.Add(1)
				}
			}()
		}
	}
	time.Sleep(500 * time.Millisecond)
	old := leaderOf("a")
	if old == nil {
		return errors.New("cluster a has no leader to kill")
	}
	killed := time.Now()
	old.kill()
	fmt.Printf("\nSIGKILL %s (a's leader) %s into the writes\n", old.id, killed.Sub(start).Round(time.Millisecond))
	next, err := waitLeader("a", 20*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("%s leads cluster a %s later: writes resume there and at every node (they forward to it)\n",
		next.id, time.Since(killed).Round(time.Millisecond))
	wg.Wait()
	wrote := time.Since(start)
	if err := old.start(); err != nil {
		return err
	}
	fmt.Printf("restarted %s: it rejoins as a follower and catches up from the log\n", old.id)

	// Convergence: the same digest on all nodes of both clusters.
	deadline := time.Now().Add(timeout)
	var digests map[string]string
	for {
		digests = map[string]string{}
		same := true
		first := ""
		for _, id := range order {
			var d api.DigestReport
			if _, err := nodes[id].client().Do(ctx, http.MethodGet, "/admin/digest", nil, nil, &d); err != nil {
				same = false
				break
			}
			digests[id] = d.Digest
			if first == "" {
				first = d.Digest
			}
			same = same && d.Digest == first
		}
		if same && len(digests) == len(order) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the nodes did not converge within %s: %v (logs in %s)", timeout, digests, dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("\n%d writes acknowledged in %s, %d refused, %d not sent (their node was the one killed); converged %s after the first write\n",
		acked.Load(), wrote.Round(time.Millisecond), failed.Load(), gone.Load(), time.Since(start).Round(time.Millisecond))
	for _, c := range []string{"a", "b"} {
		l := leaderOf(c)
		if l == nil {
			continue
		}
		var r api.ClusterReport
		if _, err := l.client().Do(ctx, http.MethodGet, "/admin/cluster", nil, nil, &r); err == nil {
			fmt.Println()
			printCluster(os.Stdout, &r)
		}
		var pr api.PeersReport
		if _, err := l.client().Do(ctx, http.MethodGet, "/admin/peers", nil, nil, &pr); err == nil {
			fmt.Printf("\nlinks of cluster %s (shipped by its leader %s):\n", c, l.id)
			printLinks(os.Stdout, pr.Links)
		}
	}
	fmt.Printf("\ndigest %s on all %d nodes: EQUAL\n", digests[order[0]], len(order))
	if keep {
		fmt.Printf("\nThe nodes keep running (logs and data in %s).\n", dir)
		for _, id := range order {
			fmt.Printf("  %s  %s/admin/ui\n", id, nodes[id].url)
		}
		fmt.Printf("  try: replicator admin cluster --addr %s\nCtrl-C stops them.\n", nodes[order[0]].url)
		sig, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		<-sig.Done()
		for _, n := range nodes {
			n.stop()
		}
	}
	return nil
}

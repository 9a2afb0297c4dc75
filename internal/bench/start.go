package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/replicator/replicator/internal/loopback"
)

// errStart is a node that did not come up.
var errStart = errors.New("bench: a node did not start")

// lastLine is the last non-empty line of a log.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// start launches the two clusters as child processes: a node alone each,
// or nodes of several (raft) each, with the writes' target (the leader)
// first for each.
func start(cfg *Config, dir string, nodes int) ([]*cluster, error) {
	bin := cfg.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	type spec struct{ cluster, id, api, raft, gossip, resp string }
	var specs []spec
	perNode := 1
	if nodes > 1 {
		perNode = 3
	}
	// Held until the proxies are up, so that none of them takes a node's.
	if cfg.RESP {
		perNode++
	}
	free, release, err := loopback.Hold(2 * nodes * perNode)
	if err != nil {
		return nil, err
	}
	defer release()
	next := func() string {
		a := free[0]
		free = free[1:]
		return a
	}
	addrs := map[string]string{} // cluster -> its first node's API address
	for _, n := range []string{"a", "b"} {
		for i := 1; i <= nodes; i++ {
			sp := spec{cluster: n, id: fmt.Sprintf("%s%d", n, i), api: next()}
			if cfg.RESP {
				sp.resp = next()
			}
			if nodes > 1 {
				sp.raft, sp.gossip = next(), next()
			}
			if i == 1 {
				addrs[n] = sp.api
			}
			specs = append(specs, sp)
		}
	}
	// What each cluster dials to reach the other: the other's address, or a
	// proxy that delays the traffic.
	via := map[string]string{"a": addrs["a"], "b": addrs["b"]}
	proxies := map[string]*delayProxy{}
	if cfg.PeerDelay > 0 {
		for _, n := range []string{"a", "b"} {
			p, err := startDelayProxy(addrs[n], cfg.PeerDelay)
			if err != nil {
				for _, p := range proxies {
					p.close()
				}
				return nil, err
			}
			proxies[n] = p
			via[n] = p.addr()
		}
	}
	release()
	var out []*cluster
	for _, sp := range specs {
		n := sp.cluster
		peer := map[string]string{"a": "b", "b": "a"}[n]
		args := []string{"serve", "--cluster-id", n, "--data", filepath.Join(dir, sp.id), "--listen", sp.api,
			"--peer", peer + "=http://" + via[peer], "--peer-secret", peer + "=bench",
			"--wal-high-water-entries", "100000000", "--wal-high-water-bytes", "1099511627776", "--wal-high-water-age", "24h",
			"--log-level", "warn"}
		if nodes > 1 {
			args = append(args, "--node-id", sp.id, "--raft-listen", sp.raft, "--gossip-bind", sp.gossip, "--gossip-profile", "local",
				"--bootstrap-expect", strconv.Itoa(nodes))
			if proxies[n] != nil && sp.api == addrs[n] {
				// Peers reach the first node through the delay; the
				// others they learn of by the answers would be direct, so
				// each node says its replicate URL is that one.
				args = append(args, "--advertise-replicate", "http://"+proxies[n].addr())
			}
			for _, o := range specs {
				if o.cluster == n && o.id != sp.id {
					args = append(args, "--join", o.gossip)
				}
			}
		}
		if cfg.PeerBandwidth != "" {
			args = append(args, "--peer-bandwidth", peer+"="+cfg.PeerBandwidth)
		}
		if cfg.PeerCompression != "" {
			args = append(args, "--peer-compression", peer+"="+cfg.PeerCompression)
		}
		if sp.resp != "" {
			args = append(args, "--resp-listen", sp.resp)
		}
		if cfg.Hostile && n == "a" {
			args = append(args, hostileArgs()...)
		}
		args = append(args, cfg.ServeArgs...)
		logf, err := os.Create(filepath.Join(dir, sp.id+".log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		name := n
		if nodes > 1 {
			name = sp.id
		}
		c := &cluster{name: name, url: "http://" + sp.api, resp: sp.resp, conns: make(chan *respConn, 512), cmd: cmd, exited: make(chan struct{}), log: logf.Name()}
		go func() { cmd.Wait(); close(c.exited) }() // the child's only waiter; ends with it
		if sp.api == addrs[n] {
			c.proxy = proxies[n]
		}
		out = append(out, c)
	}
	if err := awaitStarted(out, dir); err != nil {
		return out, err
	}
	if nodes == 1 {
		return out, nil
	}
	ordered, err := leadersFirst(out, dir)
	if err != nil {
		return out, err
	}
	return ordered, nil
}

// awaitStarted waits for every node of out to answer /healthz (30 s each),
// and fails at once for one that exited: its log's last line says why.
func awaitStarted(out []*cluster, dir string) error {
	for _, c := range out {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var v map[string]any
			if c.getJSON("/healthz", &v) == nil {
				break
			}
			select {
			case <-c.exited:
				b, _ := os.ReadFile(c.log)
				return fmt.Errorf("%w: node %s exited at start (logs in %s): %s", errStart, c.name, dir, lastLine(b))
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: node %s did not start (log in %s)", errStart, c.name, dir)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// leadersFirst waits for each cluster of out to elect a leader (30 s each)
// and orders out for the writes.
func leadersFirst(out []*cluster, dir string) ([]*cluster, error) {
	// Each cluster's leader first (named for the cluster), its followers
	// after both.
	var leaders, followers []*cluster
	for _, n := range []string{"a", "b"} {
		var lead *cluster
		deadline := time.Now().Add(30 * time.Second)
		for lead == nil {
			for _, c := range out {
				var r struct {
					State string `json:"state"`
				}
				if strings.HasPrefix(c.name, n) && c.getJSON("/admin/cluster?local=1", &r) == nil && r.State == "leader" {
					lead = c
				}
			}
			if lead == nil {
				if time.Now().After(deadline) {
					return nil, fmt.Errorf("cluster %s elected no leader in 30 s (logs in %s)", n, dir)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		for _, c := range out {
			if strings.HasPrefix(c.name, n) && c != lead {
				followers = append(followers, c)
			}
		}
		lead.name = n
		leaders = append(leaders, lead)
	}
	return append(leaders, followers...), nil
}

func stop(cl []*cluster) {
	for _, c := range cl {
		if c != nil && c.cmd != nil && c.cmd.Process != nil && c.exited != nil {
			c.cmd.Process.Signal(os.Interrupt)
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
				c.cmd.Process.Kill()
				<-c.exited
			}
		}
		if c != nil && c.proxy != nil {
			c.proxy.close()
		}
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/node"
)

// dropFirstAck forwards batches but loses the answer to the first one, as a
// network that fails after the receiver applied: the shipper must resend,
// and the receiver must absorb the duplicate.
type dropFirstAck struct {
	next    http.RoundTripper
	dropped atomic.Bool
}

func (d *dropFirstAck) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusOK || d.dropped.Load() {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var ack struct {
		Applied int `json:"applied"`
	}
	// Only the answer to a batch that applied entries (not a heartbeat).
	if json.Unmarshal(body, &ack) == nil && ack.Applied > 0 && d.dropped.CompareAndSwap(false, true) {
		return nil, errors.New("demo: ack lost on the way back")
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// runDemo starts clusters a and b in this process on loopback, writes on both
// at once (the same keys too), and reports once they converge.
func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	keep := fs.Bool("keep", false, "leave both clusters running and print how to reach them")
	writes := fs.Int("writes", 2000, "writes per cluster")
	timeout := fs.Duration("timeout", 60*time.Second, "give up converging after this long")
	verbose := fs.Bool("v", false, "show the nodes' logs")
	nodes := fs.Int("nodes", 1, "nodes per cluster: with several, each cluster is a raft group of child processes, and a's leader is killed mid-run")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *nodes > 1 {
		if *nodes > 7 {
			return fmt.Errorf("--nodes %d: at most 7", *nodes)
		}
		return runDemoNodes(*nodes, *writes, *keep, *timeout)
	}
	logLevel := slog.LevelWarn
	if *verbose {
		logLevel = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))
	dir, err := os.MkdirTemp("", "replicator-demo-")
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	lnA, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	lnB, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// Each cluster's Redis door too (docs/RESP.md): redis-cli and any
	// Redis client reach it.
	respA, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	respB, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	urlA, urlB := "http://"+lnA.Addr().String(), "http://"+lnB.Addr().String()
	const secret = "demo-secret"
	ctx := context.Background()
	lossy := &dropFirstAck{next: http.DefaultTransport}
	a, err := node.Open(ctx, &node.Options{ClusterID: "a", DataDir: dir + "/a", Listener: lnA, Logger: log, RESPListener: respA,
		Peers: []node.Peer{{Name: "b", URL: urlB, Secret: secret}}, PeerTransport: lossy})
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := node.Open(ctx, &node.Options{ClusterID: "b", DataDir: dir + "/b", Listener: lnB, Logger: log, RESPListener: respB,
		Peers: []node.Peer{{Name: "a", URL: urlA, Secret: secret}}})
	if err != nil {
		return err
	}
	defer b.Close()
	if err := errors.Join(a.Start(), b.Start()); err != nil {
		return err
	}
	fmt.Printf("cluster a on %s, cluster b on %s (data in %s)\n", urlA, urlB, dir)

	// Both sides write at once: their own keys, and 100 keys both write.
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, side := range []struct {
		n    *node.Node
		name string
	}{{a, "a"}, {b, "b"}} {
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < *writes; i += 8 {
					key := fmt.Sprintf("demo/%s/%05d", side.name, i)
					if i%10 == 0 {
						key = fmt.Sprintf("demo/shared/%03d", i/10%100)
					}
					var err error
					if i%97 == 0 {
						_, err = side.n.Delete(ctx, key)
					} else {
						_, err = side.n.Put(ctx, key, []byte(fmt.Sprintf("written at %s, write %d", side.name, i)))
					}
					if err != nil {
						failed.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	wrote := time.Since(start)
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d writes failed", n)
	}

	deadline := time.Now().Add(*timeout)
	var da, db api.DigestReport
	for {
		da, err = a.DigestReport()
		if err != nil {
			return err
		}
		db, err = b.DigestReport()
		if err != nil {
			return err
		}
		if da.Digest == db.Digest && caughtUp(a) && caughtUp(b) {
			break
		}
		if time.Now().After(deadline) {
			printReport(a, b, da, db)
			return fmt.Errorf("clusters did not converge within %s", *timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	converged := time.Since(start)

	// Conflicts: keys both sides wrote; last-writer-wins picked one.
	won := map[string]int{}
	for i := 0; i < 100; i++ {
		if r, err := a.Get(fmt.Sprintf("demo/shared/%03d", i)); err == nil {
			won[r.Stamp.Origin]++
		} else {
			won["deleted"]++
		}
	}
	fmt.Printf("\nwrote %d writes on each cluster in %s; converged %s after the first write\n",
		*writes, wrote.Round(time.Millisecond), converged.Round(time.Millisecond))
	fmt.Printf("conflicts resolved: 100 keys written on both sides; last writer wins: a's write on %d, b's on %d, a delete on %d\n",
		won["a"], won["b"], won["deleted"])
	printReport(a, b, da, db)
	// The Redis door: a SET at a's, read back at b's once it crossed.
	if err := demoRESP(respA.Addr().String(), respB.Addr().String(), *timeout); err != nil {
		return err
	}
	if *keep {
		fmt.Printf("\nBoth clusters keep running.\n  dashboards: %s/admin/ui  %s/admin/ui\n", urlA, urlB)
		fmt.Printf("  try:        curl -X PUT --data hello %s/v1/kv/greeting && curl %s/v1/kv/greeting\n", urlA, urlB)
		fmt.Printf("              replicator peers --addr %s\n", urlA)
		fmt.Printf("  Redis door: redis-cli -p %d SET greeting hello && redis-cli -p %d GET greeting\n",
			respA.Addr().(*net.TCPAddr).Port, respB.Addr().(*net.TCPAddr).Port)
		fmt.Printf("Ctrl-C stops them; their data stays in %s (rm -rf it when done).\n", dir)
		sig, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		<-sig.Done()
	}
	return nil
}

func caughtUp(n *node.Node) bool {
	for _, l := range n.PeerStatus() {
		if l.EntriesBehind > 0 {
			return false
		}
	}
	return true
}

func printReport(a, b *node.Node, da, db api.DigestReport) {
	for _, n := range []*node.Node{a, b} {
		r := n.PeersReport()
		var dups, applied uint64
		for _, c := range r.Incoming {
			dups += c.Duplicates
			applied += c.Applied + c.Stale
		}
		w := n.WALReport()
		fmt.Printf("\ncluster %s: %d local writes in %d fsynced groups; received %d entries, %d duplicates absorbed\n",
			r.Cluster, w.Writes, w.Groups, applied, dups)
		printLinks(os.Stdout, r.Links)
	}
	same := "EQUAL"
	if da.Digest != db.Digest {
		same = "DIFFERENT"
	}
	fmt.Printf("\ndigest a %s (%d keys)\ndigest b %s (%d keys)\n%s\n", da.Digest, da.Keys, db.Digest, db.Keys, same)
}

// demoRESP writes a key through a's Redis door (SET, answered +OK once
// durable) and reads it back through b's (GET) once it crossed.
func demoRESP(addrA, addrB string, timeout time.Duration) error {
	call := func(addr string, args ...string) (string, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		req := fmt.Sprintf("*%d\r\n", len(args))
		for _, a := range args {
			req += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := c.Write([]byte(req)); err != nil {
			return "", err
		}
		rd := bufio.NewReader(c)
		line, err := rd.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "$") || line == "$-1\r\n" {
			return strings.TrimSpace(line), err
		}
		body, err := rd.ReadString('\n')
		return strings.TrimSpace(body), err
	}
	const val = "hello from a's Redis door"
	if got, err := call(addrA, "SET", "demo/resp", val); err != nil || got != "+OK" {
		return fmt.Errorf("SET through a's Redis door: %q %v", got, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		got, err := call(addrB, "GET", "demo/resp")
		if err == nil && got == val {
			fmt.Printf("\nRedis door: SET demo/resp at a (%s) answered +OK; GET at b (%s) reads %q\n", addrA, addrB, got)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET through b's Redis door: %q %v", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/replicator/replicator/hashtree"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/internal/treeforge"
	"github.com/replicator/replicator/wire"
)

// hostilePeer is a peer cluster m of the multi-node robustness run (issue
// 46) that holds its links' secrets and abuses them. m itself is a real
// node (its links to a and b carry real batches, so they drain), and a's and
// b's links to it go through a proxy that forges its tree answers; besides,
// the test process, as m, all along:
//
//   - floods every node of a and b with tree requests that each scan the
//     tree anew (a new pass, a filter);
//   - sends zstd bombs to their replicate endpoints;
//   - opens RESP connections that write, ask WAIT for every peer, and leave.
//
// The run's promises must hold, and: no forged version is taken, every
// bomb is refused, a node spends at most about a quarter of a core on m's
// tree requests, and the RESP connections m left are closed.
type hostilePeer struct {
	t      *testing.T
	m      *rmesh
	mc     *multiCombo
	node   *proc
	hist   *history
	leaf   int
	forged map[string][]wire.TreeVersion // by the asking cluster
	proxy  map[string]*httptest.Server
	stop   chan struct{}
	wg     sync.WaitGroup
	start  time.Time

	trees, treeAnswered, bombs, waits atomic.Int64
	preAuth, preAuthClosed            atomic.Int64
	mu                                sync.Mutex
	surprises                         []string
}

// prepareHostilePeer adds m to the mesh's configuration (before it
// starts): every node of a and b links to m through its cluster's proxy.
func prepareHostilePeer(t *testing.T, m *rmesh, mc *multiCombo, h *history) *hostilePeer {
	hp := &hostilePeer{t: t, m: m, mc: mc, hist: h, forged: map[string][]wire.TreeVersion{}, proxy: map[string]*httptest.Server{},
		stop: make(chan struct{}), leaf: hashtree.Leaf("hostile/probe")}
	var args []string
	for _, c := range m.clusters {
		args = append(args, "--peer", c+"="+m.nodes[c+"1"].url, "--peer-secret", c+"=secret-"+pair(c, "m"))
	}
	hp.node = newProc(t, "m", "m", args...)
	mc.others++
	at := hlc.Timestamp{Wall: time.Now().UnixNano()}
	for _, c := range m.clusters {
		vs := []wire.TreeVersion{
			{Key: treeforge.KeyIn("hostile/own-", hp.leaf, true), Origin: c, Value: []byte("forged: the asker's own origin")},
			{Key: treeforge.KeyIn("hostile/nobody-", hp.leaf, true), Origin: "zz", Value: []byte("forged: nobody's")},
			{Key: treeforge.KeyIn("hostile/unasked-", hp.leaf, false), Origin: "m", Value: []byte("forged: a leaf not asked")},
		}
		for i := range vs {
			vs[i].Stamp, vs[i].Whole, vs[i].Hash = at, true, uint64(i+1)
		}
		hp.forged[c] = vs
		hp.proxy[c] = forgingProxy(t, hp.node.url, &treeforge.Forger{Secret: "secret-" + pair(c, "m"), Forge: hp.forge(vs)})
		more := []string{"--peer", "m=" + hp.proxy[c].URL, "--peer-secret", "m=secret-" + pair(c, "m")}
		for _, n := range m.members(c) {
			n.args = append(n.args, more...)
		}
		if m.more == nil {
			m.more = map[string][]string{}
		}
		m.more[c] = append(m.more[c], more...) // for nodes added later

	}
	return hp
}

// forge rewrites m's tree answers: the path to one leaf differs, and that
// leaf holds versions m must never get taken.
func (hp *hostilePeer) forge(vs []wire.TreeVersion) func(req *wire.TreeRequest, ans *wire.TreeAnswer) {
	return func(req *wire.TreeRequest, ans *wire.TreeAnswer) {
		switch req.Op {
		case wire.TreeSums:
			for i, n := range req.Nodes {
				if n == hp.leaf>>(hashtree.FanoutBits*(hashtree.Depth-req.Level)) && i < len(ans.Sums) && len(ans.Sums[i]) > 0 {
					ans.Sums[i][0] ^= 0xff
				}
			}
		case wire.TreeLeaves:
			if slices.Contains(req.Nodes, hp.leaf) {
				for _, v := range vs {
					v.Value, v.Whole = nil, false
					ans.Versions = append(ans.Versions, v)
				}
			}
		case wire.TreeVersions:
			for _, k := range req.Keys {
				for _, v := range vs {
					if v.Key == k.Key && !k.Counter {
						ans.Versions = append(ans.Versions, v)
					}
				}
			}
		}
	}
}

// run starts m and the floods (after the mesh started).
func (hp *hostilePeer) run() {
	hp.node.startReady()
	hp.start = time.Now()
	bomb := func() []byte {
		var buf bytes.Buffer
		w, _ := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
		w.Write(make([]byte, 8<<20))
		w.Close()
		return buf.Bytes()
	}()
	loop := func(every time.Duration, f func(r *rand.Rand)) {
		hp.wg.Add(1)
		r := newRand(uint64(time.Now().UnixNano()))
		go func() {
			// Exits at end.
			defer hp.wg.Done()
			for {
				select {
				case <-hp.stop:
					return
				case <-time.After(every):
				}
				f(r)
			}
		}()
	}
	pick := func(r *rand.Rand) *rnode {
		run := hp.m.running()
		if len(run) == 0 {
			return nil
		}
		return run[r.IntN(len(run))]
	}
	// dialRESP opens a connection to the RESP door of a running node
	// (nil: none runs, or the dial failed).
	dialRESP := func(r *rand.Rand) (*rnode, net.Conn) {
		n := pick(r)
		if n == nil {
			return nil, nil
		}
		hp.mc.mu.Lock()
		port := hp.mc.resp[n.id]
		hp.mc.mu.Unlock()
		nc, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err != nil {
			return nil, nil
		}
		return n, nc
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	post := func(n *rnode, path string, body []byte, hdr ...string) int {
		// 0: no answer (a node killed by the schedule).
		code, _, _ := treeforge.Post(context.Background(), hc, n.url+path, "m", "secret-"+pair(n.cluster, "m"), body, hdr...)
		return code
	}
	var pass atomic.Uint64
	for i := 0; i < 2; i++ {
		loop(10*time.Millisecond, func(r *rand.Rand) {
			n := pick(r)
			if n == nil {
				return
			}
			body, _ := wire.EncodeTree(&wire.TreeRequest{Protocol: hashtree.Version, Op: wire.TreeSums, Nodes: []int{0},
				Pass: pass.Add(1) + 1<<40, Filters: []wire.Filter{{Include: []string{"k/"}}}})
			hp.trees.Add(1)
			switch code := post(n, wire.PathTree, body); code {
			case http.StatusOK:
				hp.treeAnswered.Add(1)
			case 0, http.StatusServiceUnavailable, http.StatusTooManyRequests:
			default:
				hp.surprise(fmt.Sprintf("a tree request to %s: %d", n.id, code))
			}
		})
	}
	loop(100*time.Millisecond, func(r *rand.Rand) {
		n := pick(r)
		if n == nil {
			return
		}
		hp.bombs.Add(1)
		switch code := post(n, wire.PathReplicate, bomb, "Content-Encoding", wire.EncodingZstd); code {
		case 0, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable, http.StatusTooManyRequests:
		default:
			hp.surprise(fmt.Sprintf("a zstd bomb to %s: %d", n.id, code))
		}
	})
	loop(100*time.Millisecond, func(r *rand.Rand) {
		n, nc := dialRESP(r)
		if nc == nil {
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		seq := hp.waits.Add(1)
		key, value := fmt.Sprintf("hostile-wait/%d", seq), fmt.Sprintf("m-wait-%d", seq)
		// Possibly written, whatever the answer: the history knows it.
		hp.hist.add(callRecord{Client: "hostile-wait", Cluster: n.cluster, Kind: "put", Key: key, Value: value, Outcome: outUnknown,
			Start: time.Now(), End2: time.Now()})
		br := bufio.NewReader(nc)
		if hp.m.token != "" {
			// m's clients hold the token too: a client of the door.
			fmt.Fprintf(nc, "AUTH %s\r\n", hp.m.token)
			br.ReadString('\n')
		}
		fmt.Fprintf(nc, "SET %s %s\r\nWAIT 5 0\r\n", key, value)
		br.ReadString('\n') // the SET's answer; the WAIT's never read
	})
	if hp.m.token != "" {
		// Clients without the token that PING every 200 ms: each is
		// closed at the deadline set at accept, however many PINGs it
		// sends (before issue 46 each PING re-armed it).
		loop(200*time.Millisecond, func(r *rand.Rand) {
			n, nc := dialRESP(r)
			if nc == nil {
				return
			}
			hp.preAuth.Add(1)
			hp.wg.Add(1)
			go func() {
				// Exits when the node closes the connection, or at 30 s.
				defer hp.wg.Done()
				defer nc.Close()
				opened := time.Now()
				for time.Since(opened) < 30*time.Second {
					nc.SetDeadline(time.Now().Add(time.Second))
					if _, err := fmt.Fprint(nc, "PING\r\n"); err != nil {
						hp.preAuthClosed.Add(1)
						return
					}
					buf := make([]byte, 64)
					if _, err := nc.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
						hp.preAuthClosed.Add(1)
						return
					}
					time.Sleep(200 * time.Millisecond)
				}
				hp.surprise(fmt.Sprintf("a client of %s without the token kept its RESP connection 30 s", n.id))
			}()
		})
	}
}

func (hp *hostilePeer) surprise(s string) {
	hp.mu.Lock()
	defer hp.mu.Unlock()
	if len(hp.surprises) < 10 {
		hp.surprises = append(hp.surprises, s)
	}
}

// end stops the floods and judges what m achieved.
func (hp *hostilePeer) end() []string {
	close(hp.stop)
	hp.wg.Wait()
	d := time.Since(hp.start)
	hp.mu.Lock()
	bad := append([]string(nil), hp.surprises...)
	hp.mu.Unlock()
	if hp.treeAnswered.Load() == 0 || hp.bombs.Load() == 0 || hp.waits.Load() == 0 {
		bad = append(bad, fmt.Sprintf("the hostile peer's floods proved nothing: %d tree requests answered, %d bombs, %d WAITs",
			hp.treeAnswered.Load(), hp.bombs.Load(), hp.waits.Load()))
	}
	unasked := 0.0
	for _, n := range hp.m.running() {
		_, scrape := rawRequest(hp.t, "GET", n.url+"/metrics", hp.m.token)
		if cpu := metricValue(scrape, fmt.Sprintf(`replicator_antientropy_answer_seconds_total{cluster=%q,peer="m"}`, n.cluster)); cpu > 0.25*d.Seconds()+2 {
			bad = append(bad, fmt.Sprintf("%s spent %.1f s answering m's tree requests in %s: more than a quarter core", n.id, cpu, d.Round(time.Second)))
		}
		if v := metricValue(scrape, fmt.Sprintf(`replicator_antientropy_refused_total{cluster=%q,peer="m",why="unasked"}`, n.cluster)); v > 0 {
			unasked += v
		}
		// m's RESP clients left: their connections close (the
		// workload's waiter has stopped too).
		var open float64
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			_, scrape = rawRequest(hp.t, "GET", n.url+"/metrics", hp.m.token)
			if open = metricValue(scrape, fmt.Sprintf(`replicator_resp_connections{cluster=%q}`, n.cluster)); open <= 0 {
				break
			}
		}
		if open > 0 {
			bad = append(bad, fmt.Sprintf("%s holds %v RESP connections after every client left", n.id, open))
		}
		for c, vs := range hp.forged {
			for _, v := range vs {
				if _, err := n.client().Get(bg(), v.Key); err == nil {
					bad = append(bad, fmt.Sprintf("%s holds %s, which m forged in its tree answers to %s (origin %s)", n.id, v.Key, c, v.Origin))
				}
			}
		}
	}
	hp.t.Logf("the hostile peer m: %d tree requests (%d answered), %d zstd bombs, %d WAITs left behind, %d clients without the token (%d closed by the nodes); %v of its forged versions refused as unasked",
		hp.trees.Load(), hp.treeAnswered.Load(), hp.bombs.Load(), hp.waits.Load(), hp.preAuth.Load(), hp.preAuthClosed.Load(), unasked)
	return bad
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/policy"
)

// The combined schedule's transactions and counter deletes (issue 48):
//
//   - each cluster's RESP door takes transactions of three fresh keys
//     (MULTI, SET, SET, SET, EXEC; at c one of the three under c-only/,
//     which c's link keeps from b), and a checker reads a random one at a
//     random cluster inside MULTI (one moment): it must hold all of the
//     keys its filters let cross, or none;
//   - each cluster's WATCH loop adds 1 to a key of its own (WATCH, GET,
//     MULTI, SET, EXEC, again on nil): the key ends at the number of
//     acknowledged rounds at every cluster;
//   - each cluster increments counters of its own, deletes them, and
//     increments some again: every cluster ends with what was counted after
//     the delete, never with what the delete had seen.
//
// A cluster that lost its data (a wipe, a restore, the fourth cluster's
// start) is rebuilt by re-seeds, each of which relays what its sender
// holds of third clusters' transactions, clipped by their filters toward
// it: a reader there may see part of a transaction until every peer's
// re-seed ended, so the checker does not judge it for a minute after the
// loss. A transaction whose writer lost its data after writing it is not
// judged at all: a part only the writer held may be gone for good while
// the rest lives on where it was relayed. Any other snapshot (a re-seed on request, a widening's backfill)
// shows whole at its trailer and relays no clipped stream (issue 48): a
// cluster taking one is judged throughout.

// txnRec is a transaction of three fresh keys.
type txnRec struct {
	cluster string
	keys    []string
	at      time.Time
}

// ctrDel is a counter counted, deleted and counted again at one cluster.
type ctrDel struct {
	cluster, key        string
	before, beforeMaybe int64 // increments before the delete: acknowledged, unknown
	deleted             bool  // the delete was acknowledged
	at                  time.Time
	after, afterMaybe   int64
}

// txnWork is what those workloads recorded.
type txnWork struct {
	mu    sync.Mutex
	txns  []txnRec
	dels  []ctrDel
	watch map[string][2]int64 // cluster -> acknowledged, unknown rounds
	// acked transactions, and reads that found a whole one: a workload
	// that never wrote or was never checked proves nothing.
	acked, whole int
}

// txnHost is where the workloads run: the robustness run's clusters of one
// node (combo) or the multi-node run's clusters of three (multiCombo).
type txnHost interface {
	// respAddr is the RESP address of a running node of cluster c (any
	// of its nodes), "" when none runs; respPassword the API token.
	respAddr(c string, r *rand.Rand) string
	respPassword() string
	// httpClient is a client of a running node of cluster c (nil: none).
	httpClient(c string, r *rand.Rand) *client.Client
	// readable are the clusters a reader may ask now.
	readable() []string
	// lostSince reports that cluster c lost data (acknowledged writes, or
	// its whole tree) at t or later.
	lostSince(c string, t time.Time) bool
	// homeOnly is a prefix c writes that some link keeps from a cluster
	// ("" for none), and hiddenAt the prefix kept from cluster at.
	homeOnly(c string) string
	hiddenAt(at string) string
	count(what string, n int)
	violation(format string, args ...any)
}

// recoveryGrace is how long after a loss a cluster's reads are not judged
// for whole transactions (its re-seeds run meanwhile).
const recoveryGrace = time.Minute

// redisClients keeps a client per RESP address.
type redisClients map[string]*redis.Client

func (rcs redisClients) get(addr, password string) *redis.Client {
	if rcs[addr] == nil {
		rcs[addr] = redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Password: password,
			DialTimeout: time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second})
	}
	return rcs[addr]
}

func (rcs redisClients) close() {
	for _, c := range rcs {
		c.Close()
	}
}

// transactor writes name's transactions and WATCH rounds until until,
// each through the RESP door of a running node of cluster name.
func (tw *txnWork) transactor(h txnHost, name string, r *rand.Rand, until time.Time) {
	rcs := redisClients{}
	defer rcs.close()
	ctx := context.Background()
	wkey := "tw/" + name
	for seq := 0; time.Now().Before(until); seq++ {
		addr := h.respAddr(name, r)
		if addr == "" {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		rc := rcs.get(addr, h.respPassword())
		if r.IntN(3) == 0 {
			tw.watchRound(ctx, rc, name, wkey)
			continue
		}
		keys := []string{fmt.Sprintf("tx/%s-%d/a", name, seq), fmt.Sprintf("tx/%s-%d/b", name, seq), fmt.Sprintf("tx/%s-%d/c", name, seq)}
		if p := h.homeOnly(name); p != "" && r.IntN(2) == 0 {
			keys[1] = fmt.Sprintf("%stx-%d", p, seq)
		}
		at := time.Now()
		_, err := rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Set(ctx, k, name, 0)
			}
			return nil
		})
		// Written, refused or unknown: whatever a reader finds of it must
		// be all of it or none.
		tw.mu.Lock()
		tw.txns = append(tw.txns, txnRec{cluster: name, keys: keys, at: at})
		if err == nil {
			tw.acked++
		}
		tw.mu.Unlock()
		time.Sleep(time.Duration(20+r.IntN(80)) * time.Millisecond)
	}
}

// watchRound adds 1 to key through WATCH, GET, MULTI, SET, EXEC, running
// again while another write came between (at most 50 times).
func (tw *txnWork) watchRound(ctx context.Context, rc *redis.Client, name, key string) {
	for range 50 {
		err := rc.Watch(ctx, func(tx *redis.Tx) error {
			n, err := tx.Get(ctx, key).Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, key, strconv.FormatInt(n+1, 10), 0)
				return nil
			})
			return err
		}, key)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		tw.mu.Lock()
		w := tw.watch[name]
		switch {
		case err == nil:
			w[0]++
		case strings.HasPrefix(err.Error(), "NOTWRITTEN"):
		default:
			w[1]++ // the EXEC's outcome is not known
		}
		tw.watch[name] = w
		tw.mu.Unlock()
		return
	}
}

// txnChecker reads recorded transactions at random clusters (a random
// node of each) until until.
func (tw *txnWork) txnChecker(h txnHost, r *rand.Rand, until time.Time) {
	rcs := redisClients{}
	defer rcs.close()
	ctx := context.Background()
	for time.Now().Before(until) {
		time.Sleep(time.Duration(50+r.IntN(100)) * time.Millisecond)
		tw.mu.Lock()
		n := len(tw.txns)
		var t txnRec
		if n > 0 {
			t = tw.txns[n-1-r.IntN(min(n, 200))] // the recent ones
		}
		tw.mu.Unlock()
		names := h.readable()
		if n == 0 || len(names) == 0 {
			continue
		}
		at := names[r.IntN(len(names))]
		addr := h.respAddr(at, r)
		if addr == "" {
			continue
		}
		keys := t.keys
		if hidden := h.hiddenAt(at); hidden != "" {
			keys = nil // a link keeps these from at
			for _, k := range t.keys {
				if !strings.HasPrefix(k, hidden) {
					keys = append(keys, k)
				}
			}
		}
		start := time.Now()
		var mget *redis.SliceCmd
		_, err := rcs.get(addr, h.respPassword()).TxPipelined(ctx, func(p redis.Pipeliner) error {
			mget = p.MGet(ctx, keys...)
			return nil
		})
		if err != nil {
			continue
		}
		held := 0
		for _, v := range mget.Val() {
			if v != nil {
				held++
			}
		}
		h.count("txn-checks", 1)
		if held == len(keys) {
			tw.mu.Lock()
			tw.whole++
			tw.mu.Unlock()
		}
		// A transaction whose writer lost its data since it wrote it may
		// survive only in part, anywhere: the key only the writer held (one
		// its filter keeps from the peer that relays the rest) went with
		// the loss, and re-seeds relay the rest, the writer's rejoin among
		// them.
		if held != 0 && held != len(keys) && !h.lostSince(at, start.Add(-recoveryGrace)) && !h.lostSince(t.cluster, t.at) {
			h.violation("transaction: %s read %d of %v (written at %s at %s) at %s: part of a transaction",
				at, held, keys, t.cluster, t.at.Format(time.RFC3339Nano), start.Format(time.RFC3339Nano))
		}
	}
}

// counterDeleter counts counters of name's own, deletes them, and counts
// some again, through name's HTTP API (each increment under an
// idempotency key: a retry replays).
func (tw *txnWork) counterDeleter(h txnHost, name string, r *rand.Rand, until time.Time) {
	var c *client.Client
	call := func(id string, f func(ctx context.Context) error) (ok, maybe bool) {
		if c == nil {
			return false, true // no node of the cluster runs: may or may not
		}
		ctx, cancel := context.WithTimeout(policy.WithKey(bg(), policy.Key{ID: id}), 5*time.Second)
		defer cancel()
		switch outcomeOf(f(ctx)) {
		case outOK:
			return true, false
		case outUnknown:
			return false, true
		}
		return false, false
	}
	count := func(key, id string, n int) (acked, maybe int64) {
		for i := range n {
			ok, unk := call(fmt.Sprintf("%s-%d", id, i), func(ctx context.Context) error {
				_, err := c.Increment(ctx, key, 1)
				return err
			})
			if ok {
				acked++
			}
			if unk {
				maybe++
			}
		}
		return acked, maybe
	}
	for seq := 0; time.Now().Before(until); seq++ {
		c = h.httpClient(name, r)
		d := ctrDel{cluster: name, key: fmt.Sprintf("cd/%s-%d", name, seq)}
		id := fmt.Sprintf("%s-cd-%d", name, seq)
		d.at = time.Now()
		d.before, d.beforeMaybe = count(d.key, id+"-b", 1+r.IntN(4))
		d.deleted, _ = call(id+"-del", func(ctx context.Context) error {
			_, err := c.Delete(ctx, d.key)
			return err
		})
		d.after, d.afterMaybe = count(d.key, id+"-a", r.IntN(3))
		tw.mu.Lock()
		tw.dels = append(tw.dels, d)
		tw.mu.Unlock()
		time.Sleep(time.Duration(100+r.IntN(200)) * time.Millisecond)
	}
}

// judge checks, after convergence, the WATCH loops' keys and the deleted
// counters at every node readers names (node -> its client).
func (tw *txnWork) judge(h txnHost, readers map[string]*client.Client) []string {
	var bad []string
	tw.mu.Lock()
	defer tw.mu.Unlock()
	deleted := 0
	for _, d := range tw.dels {
		if d.deleted {
			deleted++
		}
	}
	if tw.acked == 0 || tw.whole == 0 || deleted == 0 {
		bad = append(bad, fmt.Sprintf("the workloads proved nothing: %d transactions acknowledged, %d read whole, %d counter deletes acknowledged",
			tw.acked, tw.whole, deleted))
	}
	for n, hc := range readers {
		for w, got := range tw.watch {
			v, err := hc.Get(bg(), "tw/"+w)
			var held int64
			if err == nil {
				held, _ = strconv.ParseInt(string(v.Value), 10, 64)
			} else if !isNotFound(err) {
				bad = append(bad, fmt.Sprintf("tw/%s at %s: %v", w, n, err))
				continue
			}
			lost := h.lostSince(w, time.Time{})
			if held > got[0]+got[1] || (!lost && held < got[0]) {
				bad = append(bad, fmt.Sprintf("WATCH loop: tw/%s reads %d at %s; %d rounds acknowledged, %d unknown (its cluster lost data: %v)",
					w, held, n, got[0], got[1], lost))
			}
		}
		for _, d := range tw.dels {
			var held int64
			if v, err := hc.Counter(bg(), d.key); err == nil {
				held = v.Value
			} else if !isNotFound(err) {
				bad = append(bad, fmt.Sprintf("%s at %s: %v", d.key, n, err))
				continue
			}
			low, high := d.after, d.after+d.afterMaybe+d.beforeMaybe
			if !d.deleted || h.lostSince(d.cluster, d.at) {
				// The delete may not have happened, or the cluster that
				// made it lost what it had seen.
				low, high = 0, d.before+d.beforeMaybe+d.after+d.afterMaybe
			}
			if held < low || held > high {
				bad = append(bad, fmt.Sprintf("counter delete: %s reads %d at %s, want %d to %d (%d counted and deleted at %s, %d unknown; then %d counted, %d unknown)",
					d.key, held, n, low, high, d.before, d.cluster, d.beforeMaybe, d.after, d.afterMaybe))
			}
		}
	}
	return bad
}

func isNotFound(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == 404
}

// The robustness run's clusters of one node.

func (cb *combo) respAddr(c string, _ *rand.Rand) string {
	if !cb.rb.startedPeer(c) {
		return ""
	}
	return fmt.Sprintf("127.0.0.1:%d", cb.resp[c])
}

func (cb *combo) httpClient(c string, _ *rand.Rand) *client.Client { return cb.rb.m.nodes[c].client() }

func (cb *combo) readable() []string {
	var out []string
	for _, n := range cb.rb.names() {
		if cb.rb.startedPeer(n) {
			out = append(out, n)
		}
	}
	return out
}

func (cb *combo) homeOnly(c string) string {
	if c == "c" {
		return comboThird // c's link to b keeps it home
	}
	return ""
}

func (cb *combo) hiddenAt(at string) string {
	if at == "b" {
		return comboThird
	}
	return ""
}

func (cb *combo) respPassword() string { return "" }

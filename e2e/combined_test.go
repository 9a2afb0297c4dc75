package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/policy"
)

// The combined schedule (issue 45). Each feature of the last round held its
// promise alone; pairs of them broke each other's. TestRobustness therefore
// also runs, under every fault it injects:
//
//   - a short tombstone retention (10 s, as the idempotency window, pin
//     window 2 s, collection every half second), so that deletes are
//     collected while links are narrowed and widened (the filter event,
//     whose narrowing then outlasts the retention);
//   - a third cluster's own filter: c's link to b keeps c-only/ home for the
//     whole run, while c writes there and a and d hold it;
//   - the background comparison every 2 s with automatic repair, during
//     live replication;
//   - compression on a's links, and a bandwidth limit on a -> b;
//   - pauses that are checked as barriers, and WAITs through the RESP door
//     over filtered and unfiltered links;
//
// and the checker asks, beside its usual promises: equal digests of what
// every link carries (everything but c-only/ everywhere, c-only/ everywhere
// but b, and nothing of it at b); every cluster's own final state against
// the history (not only a's); no comparison finding divergence, range
// deletes included, with c's keys listed apart between a and b; the same
// conflict record for a loser at every cluster that holds the same final
// version; no WAIT counting a peer that lacks the write; no write made
// after a pause answered reaching the peer before the resume; the wire
// rate of a -> b within its limit.

const (
	// comboThird is what c's link to b keeps home all along.
	comboThird = "c-only/"
	// comboBandwidth is a -> b's limit.
	comboBandwidth = 512 << 10
)

// comboPrefixes are the key spaces every cluster holds alike.
var comboPrefixes = []string{"k/", "p/", "ctr/", "w/", "tx/", "tw/", "cd/"}

// combo is what the combined schedule adds to a robustness run.
type combo struct {
	rb   *robust
	resp map[string]int // RESP port of each cluster (d's too)
	mu   sync.Mutex
	bad  []string
	// counts of the checks made, for the run's report.
	counts map[string]int
	// lost is when each cluster last lost data (a wipe or a restore): a
	// WAIT check does not judge a peer that lost data since its write.
	lost map[string]time.Time
	// kept is the most tombstones a narrowed link was seen keeping.
	kept int
	// tw is what the transactions and counter deletes recorded.
	tw *txnWork
}

func newCombo(rb *robust) *combo {
	return &combo{rb: rb, resp: map[string]int{}, counts: map[string]int{}, lost: map[string]time.Time{}, tw: &txnWork{watch: map[string][2]int64{}}}
}

func (cb *combo) violation(format string, args ...any) {
	cb.mu.Lock()
	cb.bad = append(cb.bad, fmt.Sprintf(format, args...))
	cb.mu.Unlock()
}

func (cb *combo) count(what string, n int) {
	cb.mu.Lock()
	cb.counts[what] += n
	cb.mu.Unlock()
}

func (cb *combo) lostData(name string) {
	cb.mu.Lock()
	cb.lost[name] = time.Now()
	cb.mu.Unlock()
}

func (cb *combo) lostSince(name string, t time.Time) bool {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	l, ok := cb.lost[name]
	return ok && !l.Before(t)
}

// prepare gives a node of the run (cluster name) the combined settings.
func (cb *combo) prepare(p *proc, name string) {
	port := freePort(cb.rb.t)
	cb.resp[name] = port
	p.args = append(p.args, "--tombstone-retention", "10s", "--idempotency-window", "10s", "--pin-window", "2s",
		"--antientropy-interval", "2s", "--antientropy-repair",
		"--resp-listen", fmt.Sprintf("127.0.0.1:%d", port))
	p.env = append(p.env, node.TestingEnvPrefix+"GC_INTERVAL=500ms", node.TestingEnvPrefix+"SHORT_RETENTION=1")
	switch name {
	case "a":
		p.args = append(p.args, "--peer-compression", "b=zstd", "--peer-compression", "c=zstd", "--peer-bandwidth", "b=512KiB")
	case "c":
		p.args = append(p.args, "--peer-exclude", "b="+comboThird)
	}
}

// baseExclude is what a link keeps home all along (c -> b: c-only/).
func baseExclude(from, to string, combined bool) []string {
	if combined && from == "c" && to == "b" {
		return []string{comboThird}
	}
	return nil
}

// filterJSON is a filter excluding prefixes.
func filterJSON(exclude []string) string {
	if len(exclude) == 0 {
		return `{}`
	}
	return fmt.Sprintf(`{"exclude": ["%s"]}`, strings.Join(exclude, `", "`))
}

// thirdKey is one of c's keys that c's link to b keeps home.
func thirdKey(r *rand.Rand) string { return fmt.Sprintf("%s%02d", comboThird, r.IntN(8)) }

// pauseChecked pauses from's link to to as the admin-pause event does, and
// checks that it is a barrier: a write made at from once the pause answered
// does not reach to before the resume (from's link does not acknowledge
// its index). The node is claimed meanwhile (a restart forgets a pause).
func (cb *combo) pauseChecked(from, to string, d time.Duration, h *history) bool {
	rb := cb.rb
	if !rb.claim(from, d+10*time.Second) {
		return false
	}
	defer rb.release(from)
	if !rb.admin(from, "/admin/peers/"+to+"/pause") {
		rb.resume(from, to)
		return false
	}
	c := rb.m.nodes[from].client()
	key := fmt.Sprintf("w/pause-%s-%d", from, time.Now().UnixNano())
	op := callRecord{Client: from + "-pause", Cluster: from, Kind: "put", Key: key, Value: key, Start: time.Now()}
	ctx, cancel := context.WithTimeout(bg(), 3*time.Second)
	var res client.WriteResult
	hdr, err := c.Do(ctx, http.MethodPut, "/v1/kv/"+key, []byte(op.Value), nil, &res)
	cancel()
	op.Outcome, op.Version, op.End2 = outcomeOf(err), res.Version, time.Now()
	if err != nil {
		op.Err = shorten(err.Error(), 200)
	}
	h.add(op)
	time.Sleep(d)
	if index, perr := strconv.ParseUint(hdr.Get("X-Replicator-Index"), 10, 64); err == nil && perr == nil && index > 0 {
		var r struct {
			Links []client.LinkStatus `json:"links"`
		}
		if _, err := c.Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &r); err == nil {
			for _, l := range r.Links {
				if l.Peer == to {
					cb.count("pause-checks", 1)
					if l.Acked >= index {
						cb.violation("pause %s -> %s: the write of %s at index %d, made after the pause answered, was acknowledged (at %d) before the resume",
							from, to, key, index, l.Acked)
					}
				}
			}
		}
	}
	rb.resume(from, to)
	return true
}

// waiter writes through name's RESP door on a connection of its own per
// write, asks WAIT for every peer, and checks the answer against what the
// peers hold right after: WAIT must never count a peer that lacks the
// write. Some writes go under w/1 (narrowed by the filter event), some at c
// under c-only/ (which b never gets), some carry values past a lowered
// limit (dead letters).
func (cb *combo) waiter(name string, r *rand.Rand, until time.Time, h *history) {
	rb := cb.rb
	rc := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", cb.resp[name]), MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second})
	defer rc.Close()
	// w/1 keys this waiter wrote, some deleted again later: tombstones of
	// a range the filter event narrows, which a collection must keep for
	// the widening.
	var mine []string
	hc := rb.m.nodes[name].client()
	for seq := 0; time.Now().Before(until); seq++ {
		if len(mine) > 0 && seq%4 == 0 {
			k := mine[0]
			mine = mine[1:]
			op := callRecord{Client: name + "-wait", Cluster: name, Kind: "del", Key: k, Start: time.Now(), IdemKey: fmt.Sprintf("%s-wait-del-%d", name, seq)}
			ctx, cancel := context.WithTimeout(policy.WithKey(bg(), policy.Key{ID: op.IdemKey}), 5*time.Second)
			res, err := hc.Delete(ctx, k)
			cancel()
			op.Outcome, op.Version, op.End2 = outcomeOf(err), res.Version, time.Now()
			if err != nil {
				op.Err = shorten(err.Error(), 200)
			}
			h.add(op)
		}
		key := fmt.Sprintf("w/0%s-%d", name, seq)
		switch x := r.IntN(10); {
		case x < 3:
			key = fmt.Sprintf("w/1%s-%d", name, seq)
		case x < 4 && name == "c":
			key = fmt.Sprintf("%sw-%d", comboThird, seq)
		}
		value := fmt.Sprintf("%s-wait-%d", name, seq)
		if r.IntN(10) == 0 {
			value += "-" + strings.Repeat("v", 100+r.IntN(100)) // past a lowered limit
		}
		// Every cluster of the run but the writer, the fourth too once its
		// process exists (the writer links to it from its restart on, before
		// the run counts it among its names): one not running answers
		// nothing and is not judged.
		var others []string
		for p := range rb.m.nodes {
			if p != name {
				others = append(others, p)
			}
		}
		sort.Strings(others)
		peers := len(others)
		start := time.Now()
		op := callRecord{Client: name + "-wait", Cluster: name, Kind: "put", Key: key, Value: value, Start: start}
		ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
		conn := rc.Conn()
		err := conn.Set(ctx, key, value, 0).Err()
		var got int64
		var werr error
		if err == nil {
			got, werr = conn.Wait(ctx, peers, 800*time.Millisecond).Result()
		}
		conn.Close()
		cancel()
		op.End2 = time.Now()
		switch {
		case err == nil:
			op.Outcome = outOK
		case strings.HasPrefix(err.Error(), "NOTWRITTEN") || strings.HasPrefix(err.Error(), "ERR"):
			op.Outcome, op.Err = outFailed, shorten(err.Error(), 200)
		default:
			op.Outcome, op.Err = outUnknown, shorten(err.Error(), 200)
		}
		if err != nil || werr != nil {
			h.add(op)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		// Its version, read at the writer (nobody else writes the key).
		v, gerr := rb.m.nodes[name].client().Get(bg(), key)
		if gerr != nil || string(v.Value) != value {
			h.add(op)
			continue
		}
		op.Version = v.Version
		h.add(op)
		if strings.HasPrefix(key, "w/1") {
			mine = append(mine, key)
		}
		written, ok := stampOf(v.Version)
		if !ok {
			continue
		}
		holders, unjudged := 0, 0
		var lacking []string
		for _, p := range others {
			if cb.lostSince(p, start) {
				unjudged++ // it lost data since
				continue
			}
			pv, perr := rb.m.nodes[p].client().Get(bg(), key)
			var ce *client.Error
			switch {
			case perr == nil:
				if st, ok := stampOf(pv.Version); ok && st.Compare(written) >= 0 {
					holders++
				} else {
					lacking = append(lacking, p+" holds "+pv.Version)
				}
			case errors.As(perr, &ce) && ce.Status == http.StatusNotFound:
				lacking = append(lacking, p+" holds nothing")
			case !rb.startedPeer(p):
				// The fourth cluster before it was added: no link can
				// count it, and it holds nothing.
				lacking = append(lacking, p+" not started")
			default:
				unjudged++ // unreachable (down for its own event)
			}
		}
		if unjudged > 0 {
			continue // judged only where every peer answered for itself
		}
		cb.count("wait-checks", 1)
		if strings.HasPrefix(key, "w/1") || strings.HasPrefix(key, comboThird) {
			cb.count("wait-checks-filtered", 1)
		}
		if got > int64(holders) {
			// What the lacking peers say of the writer's stream, and hold a
			// moment later: for the report.
			time.Sleep(time.Second)
			var more []string
			for _, p := range others {
				var r struct {
					Streams []struct {
						Origin, Stream string
						HWM            uint64 `json:"hwm"`
					} `json:"streams"`
				}
				rb.m.nodes[p].client().Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &r)
				_, gerr := rb.m.nodes[p].client().Get(bg(), key)
				more = append(more, fmt.Sprintf("%s: streams of %s %+v, get a second later: %v", p, name, filterStreams(r.Streams, name), gerr))
			}
			var wr struct {
				Links []client.LinkStatus `json:"links"`
			}
			rb.m.nodes[name].client().Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &wr)
			for _, l := range wr.Links {
				more = append(more, fmt.Sprintf("%s's link to %s: acked %d, state %s, reseed %+v", name, l.Peer, l.Acked, l.State, l.Reseed))
			}
			cb.violation("WAIT %d after SET %s at %s (version %s) answered %d, but only %d of %d peers hold it: %v (%s)",
				peers, key, name, v.Version, got, holders, peers, lacking, strings.Join(more, "; "))
		}
	}
}

// comboConverged is converged for the combined run: every link drained,
// and equal digests of what each link carries.
func (cb *combo) converged(m *mesh) (bool, string) {
	if ok, why := linksDrained(m); !ok {
		return false, why
	}
	prefixDigest := func(n string, prefixes []string) (string, int, error) {
		var d struct {
			Digest   string `json:"digest"`
			Keys     int    `json:"keys"`
			Counters int    `json:"counters"`
		}
		q := make([]string, len(prefixes))
		for i, p := range prefixes {
			q[i] = "prefix=" + p
		}
		_, err := m.nodes[n].client().Do(bg(), http.MethodGet, "/admin/digest?"+strings.Join(q, "&"), nil, nil, &d)
		return d.Digest, d.Keys + d.Counters, err
	}
	var common, third string
	for _, n := range m.names {
		d, _, err := prefixDigest(n, comboPrefixes)
		if err != nil {
			return false, err.Error()
		}
		if common == "" {
			common = d
		} else if d != common {
			return false, "digests of " + strings.Join(comboPrefixes, " ") + " differ"
		}
		t, held, err := prefixDigest(n, []string{comboThird})
		if err != nil {
			return false, err.Error()
		}
		switch {
		case n == "b" && held > 0:
			return false, fmt.Sprintf("b holds %d keys under %s, which c's link to it keeps home", held, comboThird)
		case n == "b":
		case third == "":
			third = t
		case t != third:
			return false, "digests of " + comboThird + " differ between the clusters that hold it"
		}
	}
	return true, ""
}

// finalOf is a cluster's live keys.
func finalOf(p *proc) (map[string]client.Item, error) {
	items, err := p.client().ScanAll(bg(), client.ScanOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]client.Item{}
	for _, it := range items {
		out[it.Key] = it
	}
	return out, nil
}

// without is a copy of the history without the operations on keys under
// prefix (b's own check: c's link keeps them from it).
func (h *history) without(prefix string) *history {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := &history{}
	for _, op := range h.ops {
		if !strings.HasPrefix(op.Key, prefix) {
			out.ops = append(out.ops, op)
		}
	}
	return out
}

// sameRecords checks the conflict logs of clusters that hold the same final
// version F of a key: a loser one of them names against F is named against
// F by every other that logged it. F's context is the same everywhere, so
// wherever F does not cover the loser, a record of it ends against F: one
// written when the loser arrived after F, or moved to F when F replaced the
// record's winner (docs/DATAMODEL.md "When a line moves on"), relays
// included. (Records against an earlier winner that F descends from stay
// as each cluster judged them, and may differ: the clusters saw different
// versions in between.)
func sameRecords(finals map[string]map[string]client.Item, logs map[string][]client.Conflict) []string {
	var bad []string
	type rec struct{ id, winner string }
	byKey := map[string]map[string]map[string]rec{} // cluster -> key -> loser -> record
	for n, cs := range logs {
		byKey[n] = map[string]map[string]rec{}
		for _, c := range cs {
			if c.Restored != "" {
				continue
			}
			if byKey[n][c.Key] == nil {
				byKey[n][c.Key] = map[string]rec{}
			}
			byKey[n][c.Key][c.Loser.Version] = rec{c.ID, c.Winner.Version}
		}
	}
	names := make([]string, 0, len(logs))
	for n := range logs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, x := range names {
		for _, y := range names {
			if x == y {
				continue
			}
			for key, lx := range byKey[x] {
				fx, okx := finals[x][key]
				fy, oky := finals[y][key]
				if !okx || !oky || fx.Version != fy.Version {
					continue
				}
				for loser, rx := range lx {
					if rx.winner != fx.Version {
						continue
					}
					if ry, ok := byKey[y][key][loser]; ok && ry != rx {
						bad = append(bad, fmt.Sprintf("key %s (final %s at %s and %s): %s logs loser %s against %s (%s), %s against %s (%s)",
							key, fx.Version, x, y, x, loser, rx.winner, rx.id, y, ry.winner, ry.id))
					}
				}
			}
		}
	}
	return bad
}

// judge adds the combined checks to a converged run's violations, and
// returns the figures of what the combined schedule did.
func (cb *combo) judge(m *mesh, h *history, logs map[string][]client.Conflict) ([]string, string) {
	var bad []string
	finals := map[string]map[string]client.Item{}
	counters := map[string]int64{}
	for i := 0; i < 3; i++ {
		k := fmt.Sprintf("ctr/%d", i)
		if v, err := m.nodes["a"].client().Counter(bg(), k); err == nil {
			counters[k] = v.Value
		}
	}
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf("k/%02d", i)
	}
	for _, n := range m.names {
		f, err := finalOf(m.nodes[n])
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s's keys: %v", n, err))
			continue
		}
		finals[n] = f
		if n == "a" {
			continue // judged by the run itself
		}
		hh := h
		if n == "b" {
			hh = h.without(comboThird)
		}
		for _, v := range hh.check(f, counters, keys) {
			bad = append(bad, n+": "+v)
		}
	}
	bad = append(bad, sameRecords(finals, logs)...)
	readers := map[string]*client.Client{}
	for _, n := range m.names {
		readers[n] = m.nodes[n].client()
	}
	bad = append(bad, cb.tw.judge(cb, readers)...)
	most, total := m.proxies["a->b"].maxWindow(5 * time.Second)
	if allowed := 1.15*5*comboBandwidth + comboBandwidth/4; float64(most) > allowed {
		bad = append(bad, fmt.Sprintf("a -> b carried %d bytes in a 5 s window, over its limit of %d B/s (%.2fx)", most, comboBandwidth, float64(most)/(5*comboBandwidth)))
	}
	var repaired, withheld, unheard, possible int
	var throttled float64
	for _, n := range m.names {
		r := peersReport(cb.rb.t, m.nodes[n])
		for _, l := range r.Links {
			if l.AntiEntropy != nil {
				repaired += l.AntiEntropy.Repaired
			}
			if n == "a" && l.Peer == "b" {
				throttled = l.ThrottledSeconds
			}
		}
		for _, in := range r.Incoming {
			withheld += int(in.Withheld)
			unheard += int(in.WithheldUnheard)
			possible += int(in.Resurrections)
		}
	}
	var horizons []string
	for _, n := range m.names {
		if h := cb.horizon(n); h.IsZero() {
			horizons = append(horizons, n+" none")
		} else {
			horizons = append(horizons, fmt.Sprintf("%s %s ago", n, time.Since(h).Round(time.Second)))
		}
	}
	cb.tw.mu.Lock()
	txns, dels := len(cb.tw.txns), len(cb.tw.dels)
	cb.tw.mu.Unlock()
	cb.mu.Lock()
	defer cb.mu.Unlock()
	bad = append(bad, cb.bad...)
	figures := fmt.Sprintf("combined: %d WAIT checks (%d over filtered keys), %d pause checks, %d expiry checks, %d transaction checks, %d transactions, %d counters deleted, %d collection horizon moves, %d narrowings collected past, most tombstones a narrowed link kept %d, "+
		"%d versions repaired by the background pass, %d relays withheld by an origin's filter (%d before it was heard), %d possible resurrections not taken, "+
		"a -> b %d bytes, at most %d in 5 s (%.2f of the limit), throttled %.1f s; collected below: %s",
		cb.counts["wait-checks"], cb.counts["wait-checks-filtered"], cb.counts["pause-checks"], cb.counts["expiry-checks"], cb.counts["txn-checks"], txns, dels, cb.counts["horizon-moves"], cb.counts["collected-while-narrowed"], cb.kept,
		repaired, withheld, unheard, possible, total, most, float64(most)/(5*comboBandwidth), throttled, strings.Join(horizons, ", "))
	return bad, figures
}

// horizon is the cutoff below which name collected tombstones (zero: none,
// or unknown), as a read of a key never written says.
func (cb *combo) horizon(name string) time.Time {
	resp, err := http.Get(cb.rb.m.nodes[name].url + "/v1/kv/zz/never-written")
	if err != nil {
		return time.Time{}
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			CollectedBelow string `json:"collected_below"`
		} `json:"error"`
	}
	if json.NewDecoder(resp.Body).Decode(&e) != nil {
		return time.Time{}
	}
	st, ok := stampOf(e.Error.CollectedBelow + "@x")
	if !ok {
		return time.Time{}
	}
	return time.Unix(0, st.HLC.Wall)
}

// awaitCollection waits until name collected tombstones past since (for at
// most d), and counts it when it did.
func (cb *combo) awaitCollection(name string, since time.Time, d time.Duration) {
	var h time.Time
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if h = cb.horizon(name); h.After(since.Add(time.Second)) {
			cb.count("collected-while-narrowed", 1)
			return
		}
	}
	cb.rb.t.Logf("narrowing at %s: %s collected below %s by %s, not past it", since.Format("15:04:05.000"), name, h.Format("15:04:05.000"), time.Now().Format("15:04:05.000"))
}

// sampleHorizons counts, until until, how often each cluster's collection
// horizon moved (sampled every second): the run's report says how often
// collection ran under the faults.
func (cb *combo) sampleHorizons(until time.Time) {
	last := map[string]time.Time{}
	for time.Now().Before(until) {
		for _, n := range cb.rb.names() {
			if h := cb.horizon(n); h.After(last[n]) {
				if !last[n].IsZero() {
					cb.count("horizon-moves", 1)
				}
				last[n] = h
			}
		}
		time.Sleep(time.Second)
	}
}

// noteKept records what from's link to to keeps for a widening.
func (cb *combo) noteKept(from, to string) {
	var r struct {
		Links []client.LinkStatus `json:"links"`
	}
	if _, err := cb.rb.m.nodes[from].client().Do(bg(), http.MethodGet, "/admin/peers", nil, nil, &r); err != nil {
		return
	}
	for _, l := range r.Links {
		if l.Peer == to && l.KeptTombstones != nil {
			cb.mu.Lock()
			cb.kept = max(cb.kept, l.KeptTombstones.Tombstones)
			cb.mu.Unlock()
		}
	}
}

// thirdOrigin checks a comparison between two clusters of the combined run:
// keys it lists apart must be c's keys that c's link keeps from b.
func thirdOrigin(r client.DiffReport) []string {
	var bad []string
	for _, d := range r.ThirdOrigin {
		if !strings.HasPrefix(d.Key, comboThird) {
			bad = append(bad, fmt.Sprintf("%s: a third cluster's version differs (%+v)", d.Key, d))
		}
	}
	return bad
}

// thirdOp is one of c's writes under c-only/ (a put or a delete), which c's
// link to b keeps home, recorded.
func thirdOp(c *client.Client, r *rand.Rand, id string, seq int, h *history) {
	op := callRecord{Client: id, Cluster: "c", Key: thirdKey(r), Start: time.Now(), IdemKey: fmt.Sprintf("%s-%d", id, seq)}
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
	defer cancel()
	var res client.WriteResult
	var err error
	if r.IntN(4) == 0 {
		op.Kind = "del"
		res, err = c.Delete(ctx, op.Key)
	} else {
		op.Kind, op.Value = "put", fmt.Sprintf("%s-%d", id, seq)
		res, err = c.Put(ctx, op.Key, []byte(op.Value))
	}
	op.Outcome, op.Version, op.End2 = outcomeOf(err), res.Version, time.Now()
	if err != nil {
		op.Err = shorten(err.Error(), 200)
	}
	h.add(op)
}

func filterStreams[S any](ss []S, origin string) []S {
	var out []S
	for _, s := range ss {
		if fmt.Sprint(s)[1:len(origin)+1] == origin {
			out = append(out, s)
		}
	}
	return out
}

// multiCombo is what the combined schedule adds to the multi-node run: a
// short tombstone retention (deletes collected while the filter event
// narrows links), the background comparison with repair, compression on
// a's link, and WAITs through the RESP door of leaders and followers,
// checked against what the peer cluster's leader holds right after.
type multiCombo struct {
	m    *rmesh
	resp map[string]int // RESP port of each node
	mu   sync.Mutex
	bad  []string
	// waits and filtered count the WAIT checks (over keys the filter event
	// narrows), atFollowers those asked at a follower.
	waits, filtered, atFollowers int
	// others are peer clusters outside the mesh (the hostile peer m):
	// WAIT asks for every peer.
	others int
	// tw is what the transactions and counter deletes recorded; lost is
	// when each cluster last lost acknowledged writes (a recovery from a
	// minority); counts are the checks made.
	tw     *txnWork
	lost   map[string]time.Time
	counts map[string]int
}

func newMultiCombo(m *rmesh) *multiCombo {
	return &multiCombo{m: m, resp: map[string]int{}, tw: &txnWork{watch: map[string][2]int64{}},
		lost: map[string]time.Time{}, counts: map[string]int{}}
}

// lostData notes that cluster c lost acknowledged writes now.
func (mc *multiCombo) lostData(c string) {
	mc.mu.Lock()
	mc.lost[c] = time.Now()
	mc.mu.Unlock()
}

// A cluster of three for the transaction and counter-delete workloads
// (txnwork_test.go): a random running node of it, leader or follower.

func (mc *multiCombo) node(c string, r *rand.Rand) *rnode {
	var up []*rnode
	for _, n := range mc.m.running() {
		if n.cluster == c {
			up = append(up, n)
		}
	}
	if len(up) == 0 {
		return nil
	}
	return up[r.IntN(len(up))]
}

func (mc *multiCombo) respAddr(c string, r *rand.Rand) string {
	n := mc.node(c, r)
	if n == nil {
		return ""
	}
	mc.mu.Lock()
	defer mc.mu.Unlock()
	return fmt.Sprintf("127.0.0.1:%d", mc.resp[n.id])
}

func (mc *multiCombo) httpClient(c string, r *rand.Rand) *client.Client {
	if n := mc.node(c, r); n != nil {
		return n.client()
	}
	return nil
}

func (mc *multiCombo) readable() []string { return mc.m.clusters }

func (mc *multiCombo) lostSince(c string, t time.Time) bool {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	l, ok := mc.lost[c]
	return ok && !l.Before(t)
}

func (mc *multiCombo) respPassword() string { return mc.m.token }

func (mc *multiCombo) homeOnly(string) string { return "" }
func (mc *multiCombo) hiddenAt(string) string { return "" }

func (mc *multiCombo) count(what string, n int) {
	mc.mu.Lock()
	mc.counts[what] += n
	mc.mu.Unlock()
}

func (mc *multiCombo) violation(format string, args ...any) {
	mc.mu.Lock()
	mc.bad = append(mc.bad, fmt.Sprintf(format, args...))
	mc.mu.Unlock()
}

// peers is how many peer clusters each cluster links to.
func (mc *multiCombo) peers() int { return len(mc.m.clusters) - 1 + mc.others }

// prepare gives a node the combined settings (before it starts).
func (mc *multiCombo) prepare(n *rnode) {
	port := freePort(mc.m.t)
	mc.mu.Lock()
	mc.resp[n.id] = port
	mc.mu.Unlock()
	n.args = append(n.args, "--tombstone-retention", "10s", "--idempotency-window", "10s", "--pin-window", "2s",
		"--antientropy-interval", "2s", "--antientropy-repair", "--resp-listen", fmt.Sprintf("127.0.0.1:%d", port))
	if n.cluster == "a" {
		n.args = append(n.args, "--peer-compression", "b=zstd")
	}
	n.env = append(n.env, node.TestingEnvPrefix+"GC_INTERVAL=500ms", node.TestingEnvPrefix+"SHORT_RETENTION=1")
}

// waiter writes through the RESP door of a node of cluster c (the leader
// or a follower, at random), on a connection of its own per write, asks
// WAIT for the peer cluster, and checks the answer: WAIT must never count
// the peer while its leader lacks the write.
func (mc *multiCombo) waiter(c string, r *rand.Rand, until time.Time, h *history) {
	peer := ""
	for _, o := range mc.m.clusters {
		if o != c {
			peer = o
		}
	}
	for seq := 0; time.Now().Before(until); seq++ {
		members := mc.m.running()
		var mine []*rnode
		for _, n := range members {
			if n.cluster == c {
				mine = append(mine, n)
			}
		}
		if len(mine) == 0 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		n := mine[r.IntN(len(mine))]
		mc.mu.Lock()
		port := mc.resp[n.id]
		mc.mu.Unlock()
		key := fmt.Sprintf("w/0%s-%d", c, seq)
		if r.IntN(3) == 0 {
			key = fmt.Sprintf("w/1%s-%d", c, seq)
		}
		value := fmt.Sprintf("%s-wait-%d", n.id, seq)
		op := callRecord{Client: c + "-wait", Cluster: c, Kind: "put", Key: key, Value: value, Start: time.Now()}
		rc := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1, Password: mc.m.token,
			DialTimeout: time.Second, ReadTimeout: 4 * time.Second, WriteTimeout: 4 * time.Second})
		ctx, cancel := context.WithTimeout(bg(), 6*time.Second)
		conn := rc.Conn()
		err := conn.Set(ctx, key, value, 0).Err()
		var got int64
		var werr error
		if err == nil {
			got, werr = conn.Wait(ctx, mc.peers(), 800*time.Millisecond).Result()
		}
		conn.Close()
		rc.Close()
		cancel()
		op.End2 = time.Now()
		switch {
		case err == nil:
			op.Outcome = outOK
		case strings.HasPrefix(err.Error(), "NOTWRITTEN") || strings.HasPrefix(err.Error(), "ERR"):
			op.Outcome, op.Err = outFailed, shorten(err.Error(), 200)
		default:
			op.Outcome, op.Err = outUnknown, shorten(err.Error(), 200)
		}
		if err != nil || werr != nil {
			h.add(op)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var v client.Value
		var gerr error
		for _, o := range mine {
			if v, gerr = consistentGet(o, key); gerr == nil {
				break
			}
		}
		if gerr != nil || string(v.Value) != value {
			h.add(op)
			continue
		}
		op.Version = v.Version
		h.add(op)
		if got < int64(mc.peers()) {
			continue // not every peer: which holds it cannot be told
		}
		// The peer's leader: it acknowledged the batch only once it
		// applied it, so a consistent read there holds it.
		held, judged := false, false
		for _, o := range members {
			if o.cluster != peer {
				continue
			}
			pv, perr := consistentGet(o, key)
			var ce *client.Error
			switch {
			case perr == nil:
				judged, held = true, pv.Version == v.Version
			case errors.As(perr, &ce) && ce.Status == http.StatusNotFound:
				judged = true
			}
			if judged {
				break
			}
		}
		mc.mu.Lock()
		mc.waits++
		if strings.HasPrefix(key, "w/1") {
			mc.filtered++
		}
		if l := mc.m.leader(c); l != nil && l.id != n.id {
			mc.atFollowers++
		}
		if judged && !held {
			mc.bad = append(mc.bad, fmt.Sprintf("WAIT %d after SET %s at %s (version %s) answered %d, but cluster %s lacks it", mc.peers(), key, n.id, v.Version, got, peer))
		}
		mc.mu.Unlock()
	}
}

// consistentGet reads key at n, as its cluster's leader holds it.
func consistentGet(n *rnode, key string) (client.Value, error) {
	var b []byte
	h, err := n.client().Do(bg(), http.MethodGet, "/v1/kv/"+key+"?consistent=true", nil, nil, &b)
	if err != nil {
		return client.Value{}, err
	}
	return client.Value{Value: b, Version: strings.Trim(h.Get("ETag"), `"`)}, nil
}

func (mc *multiCombo) figures() string {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	mc.tw.mu.Lock()
	txns, dels := len(mc.tw.txns), len(mc.tw.dels)
	mc.tw.mu.Unlock()
	return fmt.Sprintf("combined: %d WAIT checks (%d over filtered keys, %d at followers), %d expiry checks, %d transaction checks, %d transactions, %d counters deleted",
		mc.waits, mc.filtered, mc.atFollowers, mc.counts["expiry-checks"], mc.counts["txn-checks"], txns, dels)
}

// quietRedisLog is go-redis's logger for the runs: a pool that cannot dial
// a node the schedule stopped is the schedule working (the call's error
// says so to its caller), not news; anything else is printed.
type quietRedisLog struct{}

func (quietRedisLog) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "failed to dial") {
		return
	}
	fmt.Fprintln(os.Stderr, "redis:", msg)
}

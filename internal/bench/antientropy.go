package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/wire"
)

// runAntiEntropy measures anti-entropy (docs/ANTIENTROPY.md): AEKeys keys
// written at a and replicated to b; then AEDivergent of them deleted from
// b's Pebble while b is stopped (a hand edit: b lacks them, and
// replication will never send them again); b started again compares its
// tree with a's and repairs what it lacks. The figures: the time of the
// comparison and repair, the bytes it exchanged on the wire, what it found
// and applied, and the digests equal after; beside them, what a comparison
// by a full scan moves and takes on the same data.
func runAntiEntropy(ctx context.Context, cfg *Config, prefix string, cl []*cluster) ([]Result, error) {
	a, b := cl[0], cl[1]
	if b.cmd == nil || len(cl) != 2 {
		return nil, errors.New("antientropy: needs the two clusters bench starts, a node each (it edits b's tree while b is stopped)")
	}
	n, d := cfg.AEKeys, cfg.AEDivergent
	if d > n {
		return nil, fmt.Errorf("antientropy: %d divergent keys among %d", d, n)
	}
	t0 := time.Now()
	if err := write(ctx, cfg, a, prefix, 0, n); err != nil {
		return nil, err
	}
	if err := waitCaughtUp(ctx, [2]*cluster{a, b}); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Log, "antientropy: %d keys at both clusters in %.0fs; deleting %d of them in b's Pebble\n", n, time.Since(t0).Seconds(), d)
	err := b.restart(func(dataDir string) error {
		db, err := pebble.Open(filepath.Join(dataDir, "store"), &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			return err
		}
		bt := db.NewBatch()
		for j := 0; j < d; j++ {
			// 'd' is the store's data key space (store/keys.go).
			bt.Delete([]byte("d"+key(prefix, j*(n/d))), nil)
		}
		return errors.Join(bt.Commit(pebble.Sync), db.Close())
	})
	if err != nil {
		return nil, fmt.Errorf("antientropy: edit b's tree: %w", err)
	}

	// b compares with a and repairs (its link to a comes up first).
	before := cpuNow(cl)
	start := time.Now()
	var rep client.DiffReport
	for {
		err := b.postJSON("/admin/peers/a/diff?repair=true", &rep)
		if err == nil {
			break
		}
		if time.Since(start) > 30*time.Second || ctx.Err() != nil {
			return nil, fmt.Errorf("antientropy: b's comparison with a: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(start)
	lacked := rep.Count(client.LacksLocal)
	if len(rep.Divergent) != d || lacked != d || rep.Repaired != d {
		return nil, fmt.Errorf("antientropy: %d divergent keys (%d lacked here), %d repaired; want %d of each", len(rep.Divergent), lacked, rep.Repaired, d)
	}
	var da, db struct {
		Digest string `json:"digest"`
	}
	if err := errors.Join(a.getJSON("/admin/digest", &da), b.getJSON("/admin/digest", &db)); err != nil {
		return nil, err
	}
	if da.Digest != db.Digest {
		return nil, fmt.Errorf("antientropy: the digests differ after the repair: %s, %s", da.Digest, db.Digest)
	}

	// A comparison by a full scan (Couchbase's xdcrDiffer, a digest per
	// key): every key's (key, stamp, origin, value hash) crosses once, and
	// each side reads its whole tree. The bytes: this build's own encoding
	// of one such version, times the keys; the time: a's digest, one
	// scan of one tree.
	one := wire.TreeVersion{Key: key(prefix, n/2), Stamp: hlc.Timestamp{Wall: time.Now().UnixNano()}, Origin: "a", Hash: 1 << 63}
	empty, _ := wire.EncodeTree(&wire.TreeAnswer{Protocol: 1})
	withOne, _ := wire.EncodeTree(&wire.TreeAnswer{Protocol: 1, Versions: []wire.TreeVersion{one}})
	perKey := len(withOne) - len(empty)
	scanStart := time.Now()
	if err := a.getJSON("/admin/digest", &da); err != nil {
		return nil, err
	}
	scan := time.Since(scanStart)

	r := Result{Scenario: "antientropy", DivergentFound: len(rep.Divergent), Repaired: rep.Repaired, ExchangedBytes: rep.Bytes,
		FullScanBytes: int64(perKey) * int64(n), FullScanSeconds: scan.Seconds(), LeavesDiffering: rep.LeavesDiffering, KeysCompared: rep.Compared}
	r.finish(cl, before, d, took, cfg.ValueSize)
	r.Note = fmt.Sprintf("b found and repaired %d of %d keys in %.1fs, %.2f MB on the wire (%d leaves, %d keys compared); a full scan moves %.0f MB (%d B a key) and reads each tree (a's digest: %.1fs)",
		d, n, took.Seconds(), float64(rep.Bytes)/1e6, rep.LeavesDiffering, rep.Compared, float64(r.FullScanBytes)/1e6, perKey, scan.Seconds())
	return []Result{r}, nil
}

// postJSON posts an empty body and decodes a 200 answer into out.
func (c *cluster) postJSON(path string, out any) error {
	resp, err := hc.Post(c.url+path, "application/json", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s%s: %d %s", c.url, path, resp.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}

// restart stops a child node, lets between act on its data directory, and
// starts it again with the same flags.
func (c *cluster) restart(between func(dataDir string) error) error {
	if c.cmd == nil {
		return errors.New("not a child of bench")
	}
	dataDir := ""
	for i, a := range c.cmd.Args {
		if a == "--data" && i+1 < len(c.cmd.Args) {
			dataDir = c.cmd.Args[i+1]
		}
	}
	c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
	if err := between(dataDir); err != nil {
		return err
	}
	logf, err := os.OpenFile(c.log, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.cmd.Path, c.cmd.Args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	c.cmd, c.exited = cmd, make(chan struct{})
	exited := c.exited
	go func() { cmd.Wait(); close(exited) }() // the child's only waiter; ends with it
	return awaitStarted([]*cluster{c}, filepath.Dir(c.log))
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/replicator/replicator/client"
)

// runData serves the data-model sub-commands: del-range, incr, counter,
// batch, load.
func runData(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var start, end, prefix, opID, format string
	switch cmd {
	case "del-range":
		fs.StringVar(&start, "start", "", "first key (inclusive)")
		fs.StringVar(&end, "end", "", "last key (exclusive); empty: to the end")
		fs.StringVar(&prefix, "prefix", "", "delete every key with this prefix")
		cf.registerWrite(fs)
	case "incr":
		cf.registerWrite(fs)
	case "batch":
		fs.StringVar(&opID, "operation-id", "", "makes the batch idempotent: the same id with other ops is refused")
	case "load":
		fs.StringVar(&format, "format", "", "ndjson or csv (default: from the file name)")
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	timeout := cf.timeout
	if cmd == "load" {
		timeout = 24 * time.Hour
	}
	ctx, cancel := context.WithTimeout(cf.scope(context.Background()), timeout)
	defer cancel()
	switch cmd {
	case "del-range":
		if fs.NArg() != 0 || (prefix == "") == (start == "") {
			return usagef("usage: replicator del-range --prefix P | --start S [--end E]")
		}
		var res client.WriteResult
		if prefix != "" {
			res, err = c.DeletePrefix(ctx, prefix)
		} else {
			res, err = c.DeleteRange(ctx, start, end)
		}
		if err != nil {
			return unknownOutcome(err, cf.idemKey)
		}
		return cf.out.print(writeOut{res, res.Replayed}, func(w io.Writer) {
			// A range delete removes values; a counter's increments stay
			// (docs/DATAMODEL.md "Range deletes"): said, not left to find.
			fmt.Fprintf(w, "range deleted\tversion %s\torigin %s%s\tcounters' increments kept (del KEY removes one)\n",
				res.Version, res.Origin, replayed(res))
		})
	case "incr":
		if fs.NArg() < 1 || fs.NArg() > 2 {
			return usagef("usage: replicator incr KEY [DELTA]")
		}
		delta := int64(1)
		if fs.NArg() == 2 {
			if delta, err = strconv.ParseInt(fs.Arg(1), 10, 64); err != nil || delta == 0 {
				return usagef("DELTA %q: want a non-zero integer", fs.Arg(1))
			}
		}
		res, err := c.Increment(ctx, fs.Arg(0), delta)
		if err != nil {
			return unknownOutcome(err, cf.idemKey)
		}
		out := struct {
			client.CounterValue
			Replayed bool `json:"replayed"`
		}{res, res.Replayed}
		return cf.out.print(out, func(w io.Writer) {
			fmt.Fprintf(w, "%s\t%d\tversion %s%s\n", fs.Arg(0), res.Value, res.Version, replayed(client.WriteResult{Replayed: res.Replayed}))
		})
	case "counter":
		if fs.NArg() != 1 {
			return usagef("usage: replicator counter KEY")
		}
		res, err := c.Counter(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		return cf.out.print(res, func(w io.Writer) {
			fmt.Fprintf(w, "%s\t%d\tversion %s\n", res.Key, res.Value, res.Version)
			clusters := slices.Sorted(maps.Keys(res.Totals))
			for _, cluster := range clusters {
				t := res.Totals[cluster]
				fmt.Fprintf(w, "  %s\t+%d\t-%d\n", cluster, t.P, t.N)
			}
		})
	case "batch":
		if fs.NArg() != 1 {
			return usagef("usage: replicator batch [--operation-id ID] FILE|-   (FILE: {\"ops\":[{\"op\":\"set\",\"key\":...,\"value\":...}]})")
		}
		b, err := readArg(fs.Arg(0))
		if err != nil {
			return err
		}
		var req struct {
			Ops         []client.BatchOp `json:"ops"`
			OperationID string           `json:"operation_id"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			return fmt.Errorf("%s: %w", fs.Arg(0), err)
		}
		if opID != "" {
			req.OperationID = opID
		}
		res, err := c.Batch(ctx, req.Ops, req.OperationID)
		if err != nil {
			return unknownOutcome(err, req.OperationID)
		}
		out := struct {
			writeOut
			Ops int `json:"ops"`
		}{writeOut{res, res.Replayed}, len(req.Ops)}
		return cf.out.print(out, func(w io.Writer) {
			fmt.Fprintf(w, "%d ops applied atomically\tversion %s%s\n", len(req.Ops), res.Version, replayed(res))
		})
	case "load":
		if fs.NArg() != 1 {
			return usagef("usage: replicator load [--format ndjson|csv] FILE")
		}
		return load(ctx, c, fs.Arg(0), format, &cf.out)
	}
	return nil
}

func readArg(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

// countingReader counts what the HTTP body has read of the file.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// load streams a file to /v1/bulk with a progress bar on stderr.
func load(ctx context.Context, c *client.Client, path, format string, out *outputFlags) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if format == "" {
		format = "ndjson"
		if strings.HasSuffix(strings.ToLower(path), ".csv") {
			format = "csv"
		}
	}
	if format != "ndjson" && format != "csv" {
		return usagef("--format %q: want ndjson or csv", format)
	}
	cr := &countingReader{r: f}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		// Draws the bar until the load ends.
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				n := cr.n.Load()
				fmt.Fprintf(os.Stderr, "\r%s %s/%s", bar(int(n>>10), int(fi.Size()>>10), 30), human(n), human(fi.Size()))
			}
		}
	}()
	res, err := c.Bulk(ctx, cr, format == "csv")
	close(done)
	el := time.Since(start)
	fmt.Fprintf(os.Stderr, "\r%s %s/%s\n", bar(1, 1, 30), human(cr.n.Load()), human(fi.Size()))
	if err != nil {
		return err
	}
	rate := float64(res.Loaded) / el.Seconds()
	return out.print(struct {
		client.BulkResult
		Bytes      int64   `json:"bytes"`
		Seconds    float64 `json:"seconds"`
		KeysPerSec float64 `json:"keys_per_second"`
	}{res, cr.n.Load(), el.Seconds(), rate}, func(w io.Writer) {
		fmt.Fprintf(w, "loaded %s keys (%s) in %d batches in %s (%s keys/s); last version %s\n",
			count(res.Loaded), human(cr.n.Load()), res.Batches, el.Round(time.Millisecond), count(int64(rate)), res.Version)
	})
}

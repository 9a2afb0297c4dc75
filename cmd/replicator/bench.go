package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/replicator/replicator/internal/bench"
)

// runBench parses `replicator bench` and runs it.
func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg bench.Config
	scenarios := fs.String("scenarios", "baseline,oneway,bidirectional,steady,puts,catchup", "comma-separated scenarios")
	fs.IntVar(&cfg.Writes, "writes", 200000, "writes of oneway and bidirectional (and the baseline)")
	fs.IntVar(&cfg.ValueSize, "value-size", 100, "value bytes (the fixed value mix)")
	fs.StringVar(&cfg.Values, "values", "fixed", "value mix: fixed (--value-size bytes of one letter) or json (documents of a few hundred bytes with repeated field names, like real data)")
	fs.StringVar(&cfg.PeerBandwidth, "peer-bandwidth", "", "limit each started cluster's link to the other, e.g. 20MiB (per second, as sent)")
	fs.StringVar(&cfg.PeerCompression, "peer-compression", "", "compress each started cluster's link to the other: zstd or none")
	fs.IntVar(&cfg.Keys, "keys", 0, "key space of bidirectional (default writes/2: every key written on both sides)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 8, "concurrent writers")
	fs.StringVar(&cfg.Mode, "mode", "bulk", "how writes are sent: bulk (POST /v1/bulk), batch (POST /v1/batch) or put")
	fs.IntVar(&cfg.BatchOps, "batch-ops", 100, "writes per request in batch mode")
	rates := fs.String("rates", "5000,20000", "steady: writes/s, comma-separated")
	fs.DurationVar(&cfg.SteadyFor, "steady-for", 0, "steady and puts: how long each runs (default 10s)")
	fs.BoolVar(&cfg.RESP, "resp", false, "steady: write through each cluster's RESP door (SET) instead of HTTP PUTs")
	fs.BoolVar(&cfg.Hostile, "hostile", false, "steady: a peer of a holding its secret floods a meanwhile (tree requests, zstd bombs, WAITs left behind: docs/SECURITY.md)")
	fs.IntVar(&cfg.CatchupN, "catchup", 1000000, "catchup: entries accumulated while the peer is paused")
	fs.IntVar(&cfg.PutClients, "put-clients", 64, "puts: concurrent single-PUT clients (server CPU per write)")
	fs.IntVar(&cfg.AEKeys, "ae-keys", 1000000, "antientropy: keys at both clusters (not among the default scenarios)")
	fs.IntVar(&cfg.AEDivergent, "ae-divergent", 1000, "antientropy: of them, deleted in b's tree beneath replication, then found and repaired")
	serve := fs.String("serve-args", "", "extra flags for the started clusters, e.g. \"--batch-max-entries 4096\"")
	fs.StringVar(&cfg.Binary, "server-binary", "", "start the clusters from this replicator binary (default: this one), to compare builds under one driver")
	fs.DurationVar(&cfg.PeerDelay, "peer-delay", 0, "hold replication traffic this long each way (a proxy between the clusters): the round trip of two regions is twice it")
	fs.StringVar(&cfg.AddrA, "addr", "", "target a running cluster a instead of starting two (needs --peer-addr)")
	fs.StringVar(&cfg.AddrB, "peer-addr", "", "the running cluster b paired with --addr")
	nodes := fs.String("nodes", "1", "cluster sizes to run the scenarios with, in turn, e.g. 1,3 (the ratio of each to a node alone is printed)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg.Scenarios = strings.Split(*scenarios, ",")
	for _, r := range strings.Split(*rates, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || v <= 0 {
			return fmt.Errorf("--rates %q: want positive integers", *rates)
		}
		cfg.Rates = append(cfg.Rates, v)
	}
	for _, n := range strings.Split(*nodes, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(n))
		if err != nil || v < 1 || v > 7 {
			return fmt.Errorf("--nodes %q: want cluster sizes from 1 to 7", *nodes)
		}
		cfg.Nodes = append(cfg.Nodes, v)
	}
	if cfg.AddrA != "" && len(cfg.Nodes) > 1 {
		return fmt.Errorf("--nodes with --addr: the clusters given are what they are")
	}
	if *serve != "" {
		cfg.ServeArgs = strings.Fields(*serve)
	}
	if (cfg.AddrA == "") != (cfg.AddrB == "") {
		return fmt.Errorf("--addr and --peer-addr go together")
	}
	if cfg.Values != "fixed" && cfg.Values != "json" {
		return fmt.Errorf("--values %q: want fixed or json", cfg.Values)
	}
	if cfg.AddrA != "" && (cfg.PeerBandwidth != "" || cfg.PeerCompression != "") {
		return fmt.Errorf("--peer-bandwidth and --peer-compression set the clusters bench starts; with --addr, set your own links")
	}
	if cfg.AddrA != "" && cfg.PeerDelay > 0 {
		return fmt.Errorf("--peer-delay puts a proxy between the clusters bench starts; with --addr, put one between your own")
	}
	if !*asJSON {
		cfg.Log = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if rep != nil && len(rep.Results) > 0 {
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			enc.Encode(rep)
		} else {
			rep.Print(os.Stdout)
		}
	}
	return err
}

// runHTTPFloor is the hidden `replicator bench-httpfloor`: bench starts it.
func runHTTPFloor(args []string) error {
	fs := flag.NewFlagSet("bench-httpfloor", flag.ContinueOnError)
	addr := fs.String("listen", "127.0.0.1:0", "address to serve on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return bench.ServeHTTPFloor(ctx, *addr)
}

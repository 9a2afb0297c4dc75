// Command replicator runs a replication node (serve), a two-cluster demo
// (demo), and the client sub-commands that talk to a running node.
package main

import (
	"fmt"
	"os"
)

const usage = `replicator replicates a key-value tree between clusters, active-active.

Usage:
  replicator demo   [--keep]           two clusters on loopback, writing at once, converging
  replicator serve  [flags]            run a node (see 'replicator serve -h')
  replicator bench  [flags]            two clusters, named scenarios, figures beside raw Pebble
  replicator put    --addr URL [--idempotency-key K [--retries N]] KEY VALUE|-
  replicator get    --addr URL KEY
  replicator del    --addr URL [--idempotency-key K [--retries N]] KEY
  replicator status --addr URL --idempotency-key K   what a keyed request was answered
  replicator del-range --addr URL --prefix P | --start S [--end E]
  replicator incr   --addr URL KEY [DELTA]     add to a PN-counter (counter KEY reads it)
  replicator batch  --addr URL [--operation-id ID] FILE|-   atomic batch of set/delete ops
  replicator load   --addr URL FILE            bulk load NDJSON {"key","value"} lines or CSV key,value
  replicator scan   --addr URL [--prefix P] [--start S --end E] [--limit N]
  replicator peers  --addr URL [--json]   replication links and what came in
  replicator digest --addr URL [--json]   hash of the live state (equal on converged clusters)
  replicator admin  wal|peers|origin|digest [--json]      the admin documents as tables
  replicator admin  pause|resume|reseed|detach PEER       act on a peer link (reseed shows progress)

The client sub-commands default to --addr http://127.0.0.1:7400.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "serve":
		err = runServe(args)
	case "demo":
		err = runDemo(args)
	case "bench":
		err = runBench(args)
	case "put", "get", "del", "scan":
		err = runClient(cmd, args)
	case "peers", "digest", "admin":
		err = runAdmin(cmd, args)
	case "status":
		err = runStatus(args)
	case "del-range", "incr", "counter", "batch", "load":
		err = runData(cmd, args)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "replicator: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "replicator "+cmd+":", err)
		os.Exit(1)
	}
}

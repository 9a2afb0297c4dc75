// Command replicator runs a replication node (serve), a two-cluster demo
// (demo), and the client sub-commands that talk to a running node.
package main

import (
	"errors"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/replicator/replicator/node"
)

const intro = `replicator replicates a key-value tree between clusters, active-active.

The client commands talk to --addr (default $REPLICATOR_ADDR, else
http://127.0.0.1:7400); flags may come anywhere among the arguments, and
'replicator COMMAND -h' lists a command's flags with their defaults.`

// command is one sub-command: its flags are parsed by run (flags anywhere,
// -h prints them), so cobra only routes, suggests and completes.
func command(use, short string, run func(args []string) error) *cobra.Command {
	return &cobra.Command{
		Use:                use,
		Short:              short,
		DisableFlagParsing: true,
		RunE:               func(_ *cobra.Command, args []string) error { return run(args) },
		// With flag parsing off, cobra leaves flags to us: a word that
		// starts with "-" completes to the command's own flags.
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if !strings.HasPrefix(toComplete, "-") {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return completeFlags(run, args, toComplete), cobra.ShellCompDirectiveNoFileComp
		},
	}
}

func root() *cobra.Command {
	r := &cobra.Command{
		Use:           "replicator",
		Short:         "active-active replication of a key-value tree between clusters",
		Long:          intro,
		SilenceUsage:  true, // a typo prints one line, not the whole usage
		SilenceErrors: true,
		Version:       version(),
	}
	r.SetVersionTemplate("replicator {{.Version}}\n")
	client := func(name string) func([]string) error { return func(a []string) error { return runClient(name, a) } }
	data := func(name string) func([]string) error { return func(a []string) error { return runData(name, a) } }
	admin := func(name string) func([]string) error { return func(a []string) error { return runAdmin(name, a) } }
	r.AddCommand(
		command("serve [flags]", "run a node", runServe),
		command("demo [--keep]", "two clusters on loopback, writing at once, converging", runDemo),
		command("bench [flags]", "two clusters, named scenarios, figures beside raw Pebble", runBench),
		command("put KEY VALUE|- [--idempotency-key K [--retries N]]", "write a value", client("put")),
		command("get KEY", "read a value", client("get")),
		command("del KEY [--idempotency-key K [--retries N]]", "delete a key", client("del")),
		command("scan [--prefix P] [--start S --end E] [--limit N]", "list live keys", client("scan")),
		command("status", "the cluster at a glance: leader, nodes, links, saturation, readiness", runStatus),
		command("outcome --idempotency-key K", "what a keyed request was answered (also: status --idempotency-key K)", runOutcome),
		command("del-range --prefix P | --start S [--end E]", "delete a range of keys' values (counters' increments stay)", data("del-range")),
		command("incr KEY [DELTA]", "add to a PN-counter", data("incr")),
		command("counter KEY", "read a PN-counter", data("counter")),
		command("batch FILE|- [--operation-id ID]", "an atomic batch of set/delete ops", data("batch")),
		command("load FILE", "bulk load NDJSON {\"key\",\"value\"} lines or CSV key,value", data("load")),
		command("peers [--json]", "replication links and what came in", admin("peers")),
		command("digest [--prefix P]... [--json]", "hash of the live state, or of the keys under prefixes (equal on converged clusters)", admin("digest")),
		command("diff --peer PEER [--repair]", "compare this cluster's tree with a peer's: the keys they disagree on, and who lacks what (anti-entropy)", runDiff(false)),
		command("repair --peer PEER", "pull and apply what this cluster lacks of a peer's tree (diff --repair)", runDiff(true)),
		command("filter PEER [--include P]... [--exclude P]... [--every-key] [--release]", "show or change what crosses the link to a peer (the cluster's log records it)", admin("filter")),
		command("peer add NAME URL... [--secret-file F] | remove NAME | show NAME", "peers at run time: the cluster's log records them (both clusters add each other)", runPeer),
		command("compression PEER [zstd|none]", "show or change the link's compression of batch bodies (the cluster's log records it)", admin("compression")),
		command("bandwidth PEER [RATE]", "show or change the link's bandwidth limit, e.g. 20MiB (0: none; the cluster's log records it)", admin("bandwidth")),
		command("admin wal|peers|origin|digest|cluster|rebuild-tree | pause|resume|reseed|detach|filter|bandwidth|compression PEER | cluster join|remove NODE", "admin documents as tables, peer link actions and the cluster's membership", admin("admin")),
		command("conflicts [--key K | --prefix P] [--since 1h] [-o json] | restore ID", "what last-writer-wins discarded although the winner had not seen it (the conflict log); restore writes a loser back", runConflicts),
		command("healthcheck [--addr URL]", "exit 0 when the node answers /healthz (container health checks)", runHealthcheck),
		command("inspect --data DIR [--data DIR...]", "what a stopped node's data directory holds (the survivor to recover after losing a majority)", runInspect),
		command("backup [--addr URL] DIR", "an online backup of the node addressed (its tree while it serves writes) into DIR, a data directory restore takes", runBackup),
		command("restore --data DIR", "prepare a data directory put back from a backup or copy, before the node starts on it", runRestore),
		command("version [-o json]", "print the version", runVersion),
	)
	// bench's puts scenario starts this binary as a bare net/http server,
	// to report the part of a write's CPU that net/http itself costs.
	floor := command("bench-httpfloor --listen ADDR", "net/http alone, for bench", runHTTPFloor)
	floor.Hidden = true
	floor.ValidArgsFunction = nil // its flags are parsed by the flag package alone: completing would start it
	r.AddCommand(floor)
	// `replicator help X` prints what `replicator X -h` prints: the one
	// place a command's flags are described is its own parser.
	r.SetHelpCommand(&cobra.Command{
		Use:   "help [COMMAND]",
		Short: "a command's flags with their defaults (same as COMMAND -h)",
		RunE: func(c *cobra.Command, args []string) error {
			sub, _, err := r.Find(args)
			if err != nil || sub == r || len(args) == 0 {
				return r.Help()
			}
			if sub.RunE == nil {
				return sub.Help()
			}
			return sub.RunE(sub, []string{"-h"})
		},
	})
	return r
}

func main() {
	node.Version = version()
	r := root()
	err := r.Execute()
	switch {
	case err == nil, errors.Is(err, errHelp):
		return
	}
	name := "replicator"
	if c, _, ferr := r.Find(os.Args[1:]); ferr == nil && c != r {
		name += " " + c.Name()
	}
	exit(err, name, os.Args[1:])
}

package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/replicator/replicator/datadir"
)

// runRestore serves `replicator restore --data DIR`: run it on a stopped
// node's data directory after putting a backup (or any copy) in place,
// before the node starts on it (docs/OPERATIONS.md).
func runRestore(args []string) error {
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	dir := fs.String("data", "", "the data directory put back from a backup or copy (the node stopped)")
	out, err := parseOut(fs, args)
	if err != nil {
		return err
	}
	if *dir == "" || fs.NArg() > 0 {
		return usagef("usage: replicator restore --data DIR")
	}
	r, err := datadir.Restore(*dir)
	if err != nil {
		return err
	}
	return out.print(r, func(w io.Writer) {
		if r.Replaced {
			fmt.Fprintf(w, "%s: node %s, one of %d raft servers: new incarnation %s (was %q)\n", r.Dir, r.Node, r.Servers, r.Incarnation, r.Previous)
		} else {
			fmt.Fprintf(w, "%s: node %s alone in its cluster: identity kept\n", r.Dir, r.Node)
		}
		fmt.Fprintf(w, "next: %s\n", r.Next)
	})
}

// runInspect serves `replicator inspect --data DIR`: what a stopped node's
// data directory holds (after the loss of a majority, recover the node
// whose log is the most up to date: LAST TERM, then LAST INDEX).
func runInspect(args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var dirs []string
	fs.Var(listFlag{&dirs, "DIR"}, "data", "a stopped node's data directory (repeatable: the most up-to-date log is marked)")
	out, err := parseOut(fs, args)
	if err != nil {
		return err
	}
	if len(dirs) == 0 || fs.NArg() > 0 {
		return usagef("usage: replicator inspect --data DIR [--data DIR...]")
	}
	var rs []datadir.InspectReport
	best := -1
	for _, d := range dirs {
		r, err := datadir.Inspect(d)
		if err != nil {
			return err
		}
		rs = append(rs, r)
		t, ix := r.Newest()
		if best >= 0 {
			bt, bix := rs[best].Newest()
			if t < bt || (t == bt && ix <= bix) {
				continue
			}
		}
		best = len(rs) - 1
	}
	return out.print(rs, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DIR\tNODE\tINCARNATION\tLAST TERM\tLAST INDEX\tAPPLIED\tVOTERS\tNOTE")
		for i, r := range rs {
			note := ""
			if len(rs) > 1 && i == best {
				note = "most up to date: the survivor to recover"
			}
			if r.Copied != "" {
				note = strings.TrimSpace(note + " COPIED: run replicator restore first")
			}
			t, ix := r.Newest()
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t#%d\t#%d\t%s\t%s\n", r.Dir, r.Node, dash(r.Incarnation), t, ix, r.Applied,
				strings.Join(r.Voters, ","), dash(note))
		}
		tw.Flush()
	})
}

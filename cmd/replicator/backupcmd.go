package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"
)

// runBackup serves `replicator backup --addr NODE DIR`: an online backup of
// the node addressed (its own tree, while it serves writes) written into
// DIR as a data directory; `replicator restore --data DIR` then takes it
// as it takes an offline copy (docs/OPERATIONS.md "Online backups").
func runBackup(args []string) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("usage: replicator backup --addr URL DIR (DIR must not exist or be empty)")
	}
	timeout := cf.timeout
	if !flagSet(fs, "timeout") {
		timeout = time.Hour // a tree of many GiB takes minutes
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dir := fs.Arg(0)
	began := time.Now()
	m, err := c.Backup(ctx, dir)
	if err != nil {
		return fmt.Errorf("backup of %s into %s failed (remove %s before trying again): %w", cf.addr, dir, dir, err)
	}
	return cf.out.print(m, func(w io.Writer) {
		fmt.Fprintf(w, "%s: backup of node %s of cluster %s, applied through log index %d, %d files, %s, in %.1fs\n",
			dir, m.Node, m.Cluster, m.Applied, m.Files, human(m.Bytes), time.Since(began).Seconds())
		fmt.Fprintf(w, "restore: stop the node (or lose it), put %s in place of its data directory, run replicator restore --data DIR, start it\n", dir)
	})
}

// flagSet reports whether the command line set flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/replicator/replicator/node"
)

// runRestore serves `replicator restore --data DIR`: run it on a stopped
// node's data directory after putting a backup (or any copy) in place,
// before the node starts on it (docs/OPERATIONS.md).
func runRestore(args []string) error {
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	dir := fs.String("data", "", "the data directory put back from a backup or copy (the node stopped)")
	var out outputFlags
	out.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if *dir == "" || fs.NArg() > 0 {
		return errors.New("usage: replicator restore --data DIR")
	}
	r, err := node.Restore(*dir)
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

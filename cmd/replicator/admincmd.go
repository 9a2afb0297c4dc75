package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/transport"
)

// runAdmin serves the read-only admin sub-commands: peers, digest.
func runAdmin(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the JSON document instead of a table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	c, err := cf.client()
	if err != nil {
		return err
	}
	var out any
	switch cmd {
	case "peers":
		out = &node.PeersReport{}
	case "digest":
		out = &node.DigestReport{}
	}
	path := map[string]string{"peers": "/admin/peers", "digest": "/admin/digest"}[cmd]
	if _, err := c.Do(ctx, http.MethodGet, path, nil, nil, out); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	switch v := out.(type) {
	case *node.PeersReport:
		printPeers(v)
	case *node.DigestReport:
		fmt.Printf("cluster %s\ndigest  %s\nkeys    %d\ntombstones %d\n", v.Cluster, v.Digest, v.Keys, v.Tombstones)
	}
	return nil
}

func printPeers(r *node.PeersReport) {
	fmt.Printf("cluster %s\n\n", r.Cluster)
	printLinks(os.Stdout, r.Links)
	if len(r.Incoming) > 0 {
		fmt.Println()
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FROM\tBATCHES\tAPPLIED\tSTALE\tDUPLICATES\tREFUSED")
		for name, c := range r.Incoming {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", name, c.Batches, c.Applied, c.Stale, c.Duplicates, c.Refused)
		}
		tw.Flush()
	}
}

func printLinks(w *os.File, links []transport.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tSTATE\tACKED\tBEHIND\tBYTES BEHIND\tOLDEST\tLAST CONTACT\tERRORS\tLAST ERROR")
	for _, l := range links {
		contact := "never"
		if !l.LastContact.IsZero() {
			contact = time.Since(l.LastContact).Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1fs\t%s\t%d\t%s\n", l.Peer, l.State, l.Acked, l.EntriesBehind,
			l.BytesBehind, l.OldestUnackedAge, contact, l.ConsecutiveErrors, l.LastError)
	}
	tw.Flush()
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/transport"
)

const adminUsage = `replicator admin wal|peers|origin|digest [--addr URL] [--json]
replicator admin pause|resume|reseed|detach PEER [--addr URL]`

// runAdmin serves `replicator admin ...` (and the peers/digest shortcuts).
func runAdmin(cmd string, args []string) error {
	if cmd == "admin" {
		if len(args) == 0 {
			return fmt.Errorf("usage:\n%s", adminUsage)
		}
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			fmt.Println(adminUsage)
			return errHelp
		}
		// flags may come before the sub-command too
		for i, a := range args {
			if !strings.HasPrefix(a, "-") && (i == 0 || !strings.HasPrefix(args[i-1], "--") || strings.Contains(args[i-1], "=") || isBoolFlag(args[i-1])) {
				cmd, args = a, append(append([]string(nil), args[:i]...), args[i+1:]...)
				break
			}
		}
		if cmd == "admin" {
			return fmt.Errorf("usage:\n%s", adminUsage)
		}
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the JSON document instead of a table")
	wait := fs.Bool("wait", true, "reseed: follow the re-seed with a progress bar until it ends")
	if err := parse(fs, args); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	switch cmd {
	case "pause", "resume", "reseed", "detach":
		if fs.NArg() != 1 {
			return fmt.Errorf("usage: replicator admin %s PEER", cmd)
		}
		peer := fs.Arg(0)
		var st transport.Status
		if _, err := c.Do(ctx, http.MethodPost, "/admin/peers/"+peer+"/"+cmd, nil, nil, &st); err != nil {
			return err
		}
		fmt.Printf("%s: %s requested; link state %s\n", peer, cmd, st.State)
		if cmd == "reseed" && *wait {
			return followReseed(c.Do, peer, os.Stdout)
		}
		return nil
	}
	paths := map[string]string{"wal": "/admin/wal", "peers": "/admin/peers", "origin": "/admin/origin", "digest": "/admin/digest"}
	path, ok := paths[cmd]
	if !ok {
		return fmt.Errorf("unknown admin command %q\nusage:\n%s", cmd, adminUsage)
	}
	var out any
	switch cmd {
	case "wal":
		out = &node.WALReport{}
	case "peers":
		out = &node.PeersReport{}
	case "origin":
		out = &node.OriginReport{}
	case "digest":
		out = &node.DigestReport{}
	}
	if _, err := c.Do(ctx, http.MethodGet, path, nil, nil, out); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	switch v := out.(type) {
	case *node.WALReport:
		printWAL(os.Stdout, v)
	case *node.PeersReport:
		printPeers(v)
	case *node.OriginReport:
		fmt.Printf("cluster  %s\nresolver %s\nstream   %s\n", v.Cluster, v.Resolver, v.Stream)
	case *node.DigestReport:
		fmt.Printf("cluster    %s\ndigest     %s\nkeys       %d\ntombstones %d\n", v.Cluster, v.Digest, v.Keys, v.Tombstones)
	}
	return nil
}

type doFunc func(ctx context.Context, method, path string, body []byte, hdr http.Header, out any) (http.Header, error)

// followReseed draws a progress bar until the peer's re-seed ends.
func followReseed(do doFunc, peer string, w io.Writer) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var r node.PeersReport
		_, err := do(ctx, http.MethodGet, "/admin/peers", nil, nil, &r)
		cancel()
		if err != nil {
			return err
		}
		for _, l := range r.Links {
			if l.Peer != peer {
				continue
			}
			rs := l.Reseed
			fmt.Fprintf(w, "\r%s %s", bar(rs.Sent, rs.Total, 30), fmt.Sprintf("%d/%d keys", rs.Sent, rs.Total))
			if !rs.Running && !rs.Finished.IsZero() && rs.Runs > 0 {
				fmt.Fprintln(w)
				if rs.Error != "" {
					return fmt.Errorf("re-seed of %s failed: %s (it is retried while the peer needs one)", peer, rs.Error)
				}
				fmt.Fprintf(w, "re-seed of %s done in %s; shipping resumed\n", peer, rs.Finished.Sub(rs.Started).Round(time.Millisecond))
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func bar(done, total, width int) string {
	if total <= 0 {
		return "[" + strings.Repeat(" ", width) + "]"
	}
	n := min(width, done*width/total)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

func printWAL(w io.Writer, r *node.WALReport) {
	fmt.Fprintf(w, "stream %s  entries [%d, %d]  applied %d  %d bytes in %d segments\n",
		r.Stream, r.First, r.Last, r.Applied, r.Bytes, r.Segments)
	s := r.Saturation
	fmt.Fprintf(w, "saturation %s", strings.ToUpper(s.State))
	if s.Cause != "" {
		fmt.Fprintf(w, " (peer %s: %s)", s.Peer, s.Cause)
	}
	fmt.Fprintf(w, "\nthresholds entries %d/%d  bytes %d/%d  age %s/%s (high/low)\n",
		s.Thresholds.HighEntries, s.Thresholds.LowEntries, s.Thresholds.HighBytes, s.Thresholds.LowBytes, s.Thresholds.HighAge, s.Thresholds.LowAge)
	fmt.Fprintf(w, "replay permits %d/%d in use, %d/%d queued (%s)\n", r.Permits.InUse, r.Permits.Capacity, r.Permits.Queued, r.Permits.QueueCap, r.Permits.State)
	fmt.Fprintf(w, "refusals: %v\n\n", r.Refusals)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tSTATE\tACKED\tBACKLOG\tBYTES\tOLDEST\tOVERFLOW\tWAL RETAINED")
	for _, p := range r.Peers {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1fs\t%s\t%v\n", p.Peer, p.State, p.Acked, p.Entries, p.Bytes, p.OldestAgeSeconds, p.Overflow, p.Retained)
	}
	tw.Flush()
}

func printPeers(r *node.PeersReport) {
	fmt.Printf("cluster %s\n\n", r.Cluster)
	printLinks(os.Stdout, r.Links)
	for _, l := range r.Links {
		if l.Reseed.Runs > 0 {
			fmt.Printf("re-seeds of %s: %d, last %s (%s)\n", l.Peer, l.Reseed.Runs,
				l.Reseed.Finished.Format(time.RFC3339), l.Reseed.LastReason)
		}
	}
	for p, ph := range r.Rejoin.Phases {
		fmt.Printf("rejoin with %s: %s\n", p, ph)
	}
	for p, what := range r.Rejoin.Requests {
		fmt.Printf("peer %s lost data: %s\n", p, strings.Join(what, ", "))
	}
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
	fmt.Fprintln(tw, "PEER\tSTATE\tACKED\tBEHIND\tBYTES BEHIND\tOLDEST\tLAST CONTACT\tERRORS\tSKEW\tLAST ERROR")
	for _, l := range links {
		contact := "never"
		if !l.LastContact.IsZero() {
			contact = time.Since(l.LastContact).Round(time.Millisecond).String() + " ago"
		}
		state := l.State
		if l.Reseed.Running {
			state = fmt.Sprintf("%s %d/%d", state, l.Reseed.Sent, l.Reseed.Total)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1fs\t%s\t%d\t%.1fms\t%s\n", l.Peer, state, l.Acked, l.EntriesBehind,
			l.BytesBehind, l.OldestUnackedAge, contact, l.ConsecutiveErrors, l.ClockSkewMS, l.LastError)
	}
	tw.Flush()
}

// isBoolFlag reports whether an admin flag takes no value.
func isBoolFlag(arg string) bool {
	switch strings.TrimLeft(arg, "-") {
	case "json", "wait":
		return true
	}
	return false
}

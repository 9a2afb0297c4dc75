package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/replicator/replicator/client"
)

const diffUsage = `replicator diff --peer NAME [--repair] [--limit N] [--addr URL] [-o json]
    compare this cluster's tree with the peer's: the keys they disagree on
    (writes in flight left out), and who lacks what; --repair pulls what
    this cluster lacks (run it at the peer too for the other direction)
    (pass after pass until nothing repairable remains, or --max-passes N;
    a line of progress a pass on stderr; --timeout bounds the whole run)
replicator repair --peer NAME   same as diff --repair`

// runDiff compares the node's cluster with a peer (docs/ANTIENTROPY.md).
func runDiff(repair bool) func(args []string) error {
	return func(args []string) error {
		fs := flag.NewFlagSet("diff", flag.ContinueOnError)
		var cf clientFlags
		cf.register(fs)
		peer := fs.String("peer", "", "the peer cluster to compare with")
		fs.BoolVar(&repair, "repair", repair, "pull and apply what this cluster lacks")
		limit := fs.Int("limit", 50, "list at most this many divergent keys in the table (0: all)")
		maxPasses := fs.Int("max-passes", 100, "with --repair: stop after this many passes (each compares up to 65,536 differing leaves)")
		if err := parse(fs, args); err != nil {
			return err
		}
		if *peer == "" && fs.NArg() == 1 {
			*peer = fs.Arg(0)
		} else if *peer == "" || fs.NArg() != 0 {
			return usagef("usage:\n%s", diffUsage)
		}
		timeoutSet := false
		fs.Visit(func(f *flag.Flag) { timeoutSet = timeoutSet || f.Name == "timeout" })
		if !timeoutSet {
			// A comparison waits for the link's lag and reads the
			// differing leaves on both sides: more than a write's 10s.
			cf.timeout = 10 * time.Minute
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
		defer cancel()
		if !repair {
			rep, err := c.Diff(ctx, *peer, false)
			if err != nil {
				return err
			}
			return cf.out.print(rep, func(w io.Writer) { diffTable(w, &rep, *limit) })
		}
		rep, passes, done, err := repairAll(ctx, c, *peer, *maxPasses, os.Stderr)
		if err != nil {
			return err
		}
		if perr := cf.out.print(rep, func(w io.Writer) { diffTable(w, &rep, *limit) }); perr != nil {
			return perr
		}
		if !done {
			return fmt.Errorf("stopped after %d passes (--max-passes) with versions still to repair: %d repaired in all; run it again", passes, rep.Repaired)
		}
		return nil
	}
}

// repairAll repairs this cluster from peer pass after pass until a pass
// compared every differing leaf and repaired nothing: what it still lists
// no repair may copy (possible resurrections, same-stamp disagreements,
// third clusters' versions, writes in flight, this cluster's own lost
// writes). It stops sooner after maxPasses passes. The report returned is
// the last pass's, its Repaired the sum over every pass; done says the
// last pass found nothing more to repair. Progress goes to progress, a
// line a pass.
func repairAll(ctx context.Context, c *client.Client, peer string, maxPasses int, progress io.Writer) (rep client.DiffReport, passes int, done bool, err error) {
	total := 0
	for pass := 1; ; pass++ {
		rep, err = c.Diff(ctx, peer, true)
		if err != nil {
			if total > 0 {
				err = fmt.Errorf("%w (after %d versions repaired in %d passes)", err, total, pass-1)
			}
			return rep, pass - 1, false, err
		}
		total += max(rep.Repaired, 0)
		done = repairDone(&rep)
		if pass > 1 || !done {
			fmt.Fprintf(progress, "pass %d: %s; %d divergent, %d repaired (%d in all)\n", pass, leavesCompared(&rep), len(rep.Divergent), rep.Repaired, total)
		}
		if done || pass >= maxPasses {
			rep.Repaired = total
			return rep, pass, done, nil
		}
	}
}

// repairDone: the pass compared every differing leaf and found nothing
// more to repair.
func repairDone(r *client.DiffReport) bool { return !r.Truncated && r.Repaired <= 0 }

// leavesCompared says how much of the difference a pass compared.
func leavesCompared(r *client.DiffReport) string {
	if r.Truncated {
		return fmt.Sprintf("the first %d of %d differing leaves compared", r.LeavesCompared, r.LeavesDiffering)
	}
	return fmt.Sprintf("%d differing leaves compared", r.LeavesDiffering)
}

func diffTable(w io.Writer, r *client.DiffReport, limit int) {
	switch {
	case r.Equal && !r.RangesDiffer:
		fmt.Fprintf(w, "equal: this cluster and %s hold the same live versions (%s exchanged, %.1fs)\n", r.Peer, human(r.Bytes), r.Seconds)
		if r.Repaired > 0 {
			// A repair's last pass: equal after what the earlier ones pulled.
			fmt.Fprintf(w, "repaired: %d versions pulled from %s and applied here\n", r.Repaired, r.Peer)
		}
		return
	case r.Equal:
		fmt.Fprintf(w, "equal: this cluster and %s hold the same live versions (%s exchanged, %.1fs)\n", r.Peer, human(r.Bytes), r.Seconds)
	case len(r.Divergent) == 0:
		fmt.Fprintf(w, "no divergent key: %d leaves differed, %d keys compared, %d in flight (%s exchanged, %.1fs)\n",
			r.LeavesDiffering, r.Compared, r.InFlight, human(r.Bytes), r.Seconds)
	default:
		fmt.Fprintf(w, "%d divergent keys: %d this cluster lacks, %d %s lacks, %d counters both lack parts of, %d possible resurrections, %d unknown, %d own writes lost\n",
			len(r.Divergent), r.Count(client.LacksLocal), r.Count(client.LacksPeer), r.Peer, r.Count(client.LacksBoth),
			r.Count(client.LacksMaybeDeleted), r.Count(client.LacksUnknown), r.Count(client.LacksOwnWrite))
		fmt.Fprintf(w, "(%d leaves differed, %d keys compared, %d in flight; %s exchanged, %.1fs)\n",
			r.LeavesDiffering, r.Compared, r.InFlight, human(r.Bytes), r.Seconds)
	}
	if r.Truncated {
		fmt.Fprintf(w, "partial: %s; run it again for the rest (repair does on its own)\n", leavesCompared(r))
	}
	if r.LinkBehind {
		fmt.Fprintf(w, "the link to %s was behind: keys it lacks were counted in flight\n", r.Peer)
	}
	if len(r.Expired) > 0 {
		fmt.Fprintf(w, "%d keys differ only in an expired version one side collected and the other has not yet: not divergence; -o json lists them\n", len(r.Expired))
	}
	if len(r.ThirdOrigin) > 0 {
		fmt.Fprintf(w, "%d keys differ only in a third cluster's version: not divergence between these two (that cluster's links carry them, or its filter keeps them from one side); -o json lists them\n", len(r.ThirdOrigin))
	}
	if r.RangesDiffer {
		fmt.Fprintf(w, "they keep different range deletes of their own: %d only here, %d only at %s (-o json lists them; docs/OPERATIONS.md)\n", len(r.RangesOnlyHere), len(r.RangesOnlyPeer), r.Peer)
	}
	if r.Repaired >= 0 {
		fmt.Fprintf(w, "repaired: %d versions pulled from %s and applied here\n", r.Repaired, r.Peer)
	}
	if len(r.Divergent) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tLACKS\tHERE\tAT PEER")
	held := func(h *client.Held) string {
		switch {
		case h == nil:
			return "-"
		case h.Tombstone:
			return "deleted " + h.Stamp + " " + h.Origin
		}
		return h.Stamp + " " + h.Origin
	}
	for i, d := range r.Divergent {
		if limit > 0 && i == limit {
			fmt.Fprintf(tw, "... %d more (-o json lists every one)\n", len(r.Divergent)-limit)
			break
		}
		key := d.Key
		if d.Counter {
			key += " (counter)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", key, d.Lacks, held(d.Local), held(d.Peer))
	}
	tw.Flush()
}

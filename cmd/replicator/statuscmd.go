package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
)

// statusOut is `replicator status`: the answering node's view of its
// cluster, its links and its saturation, and whether it takes traffic.
type statusOut struct {
	Ready       bool                 `json:"ready"`
	NotReady    string               `json:"not_ready,omitempty"`
	Cluster     api.ClusterReport    `json:"cluster"`
	Links       []client.LinkStatus  `json:"links"`
	Saturation  api.SaturationReport `json:"saturation"`
	Backlogs    []api.PeerBacklog    `json:"backlogs"`
	VotersLive  int                  `json:"voters_live"`
	VotersTotal int                  `json:"voters"`
}

// runStatus prints the cluster's status. With --idempotency-key it is the
// first name of `outcome` (what a keyed request was answered), kept so that
// scripts written against it still run.
func runStatus(args []string) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		if n := "-" + strings.TrimLeft(a, "-"); n == "-idempotency-key" || strings.HasPrefix(n, "-idempotency-key=") {
			return runOutcome(args)
		}
	}
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("status takes no arguments (what a keyed request was answered: replicator outcome --idempotency-key K)")
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	var out statusOut
	if _, err := c.Do(ctx, http.MethodGet, "/admin/cluster", nil, nil, &out.Cluster); err != nil {
		return err
	}
	var peers api.PeersReport
	if _, err := c.Do(ctx, http.MethodGet, "/admin/peers", nil, nil, &peers); err != nil {
		return err
	}
	out.Links = peers.Links
	var wal api.WALReport
	if _, err := c.Do(ctx, http.MethodGet, "/admin/wal", nil, nil, &wal); err != nil {
		return err
	}
	out.Saturation, out.Backlogs = wal.Saturation, wal.Peers
	if err := c.Ready(ctx); err != nil {
		var ce *client.Error
		if !errors.As(err, &ce) {
			return err
		}
		out.NotReady = ce.Message
	} else {
		out.Ready = true
	}
	for _, n := range out.Cluster.Nodes {
		if !n.Voter {
			continue
		}
		out.VotersTotal++
		if _, lag := appliedLag(n); lag != "-" {
			out.VotersLive++
		}
	}
	return cf.out.print(out, func(w io.Writer) { printStatus(w, &out) })
}

func printStatus(w io.Writer, s *statusOut) {
	r := &s.Cluster
	leader := r.Leader
	if leader == "" {
		leader = "NONE KNOWN (writes are refused until one is elected)"
	}
	ready := "yes"
	if !s.Ready {
		ready = "NO: " + s.NotReady
	}
	fmt.Fprintf(w, "cluster    %s (%s), answered by %s (%s)\n", r.Cluster, r.Mode, r.Node, r.State)
	fmt.Fprintf(w, "leader     %s, term %d\n", leader, r.Term)
	fmt.Fprintf(w, "voters     %d of %d answering\n", s.VotersLive, s.VotersTotal)
	sat := strings.ToUpper(s.Saturation.State)
	if s.Saturation.Cause != "" {
		sat += fmt.Sprintf(" (peer %s: %s)", s.Saturation.Peer, s.Saturation.Cause)
	}
	fmt.Fprintf(w, "saturation %s, %s writes refused since start\n", sat, count(s.Saturation.Refusals))
	if note := stateNote[s.Saturation.State]; note != "" {
		fmt.Fprintf(w, "           %s\n", note)
	}
	for _, p := range s.Backlogs {
		if p.SecondsToLimit != nil {
			fmt.Fprintf(w, "           link %s: high-water mark %s at the last minute's rates (%.1f in/s, %.1f acked/s)\n", p.Peer, toLimit(p.Forecast), p.WriteRate, p.DrainRate)
		}
	}
	fmt.Fprintf(w, "ready      %s\n", ready)
	if rb := r.RefusedBy; rb != nil {
		fmt.Fprintf(w, "REFUSED    by %s: %s\n", rb.By, rb.Reason)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tVOTER\tAPPLIED\tLAG")
	for _, n := range r.Nodes {
		applied, lag := appliedLag(n)
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", n.ID, n.State, n.Voter, applied, lag)
	}
	tw.Flush()
	if len(s.Links) > 0 {
		fmt.Fprintln(w)
		printLinks(w, s.Links)
	}
}

// appliedLag is a node's applied index and lag as a table shows them: "-"
// for a node that gave no answer, whose figures are not known (not zero).
func appliedLag(n api.ClusterNode) (string, string) {
	switch n.State {
	case "unreachable", "removed", "not a member", "replaced", "older build", "":
		return "-", "-"
	}
	return fmt.Sprintf("#%d", n.Applied), fmt.Sprint(n.Lag)
}

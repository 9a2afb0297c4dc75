package main

import (
	"cmp"
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
	// Verdict is the one-word answer (healthy, degraded, down) and Why
	// its reasons; the command exits 6 unless it is healthy.
	Verdict     string               `json:"verdict"`
	Why         []string             `json:"why,omitempty"`
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
	out.Verdict, out.Why = verdict(&out)
	if err := cf.out.print(out, func(w io.Writer) { printStatus(w, &out) }); err != nil {
		return err
	}
	if out.Verdict != verdictHealthy {
		return unhealthyError{verdict: out.Verdict, why: out.Why}
	}
	return nil
}

const (
	verdictHealthy  = "healthy"
	verdictDegraded = "degraded"
	verdictDown     = "down"
)

// verdict sums up a status: down when the cluster cannot take writes
// through this node (no leader known, too few voters answering, the node
// kept out); degraded when it can but something an operator should look at
// is wrong (the node not ready, saturation, a link that is not healthy, a
// voter not answering); healthy otherwise.
func verdict(s *statusOut) (string, []string) {
	var down, degraded []string
	r := &s.Cluster
	if rb := r.RefusedBy; rb != nil {
		down = append(down, "this node is kept out by "+rb.By)
	}
	if r.Leader == "" {
		down = append(down, "no leader known")
	}
	for _, g := range r.Groups {
		if g.Leader == "" && g.Group > 0 {
			down = append(down, fmt.Sprintf("raft group %d: no leader known (the writes of its keys are refused)", g.Group))
		}
	}
	if s.VotersTotal > 0 && s.VotersLive <= s.VotersTotal/2 {
		down = append(down, fmt.Sprintf("%d of %d voters answering: no quorum", s.VotersLive, s.VotersTotal))
	} else if s.VotersLive < s.VotersTotal {
		degraded = append(degraded, fmt.Sprintf("%d of %d voters answering", s.VotersLive, s.VotersTotal))
	}
	if !s.Ready {
		degraded = append(degraded, "not ready: "+s.NotReady)
	}
	if st := s.Saturation.State; st != "" && st != api.StateHealthy {
		degraded = append(degraded, "saturation "+st)
	}
	for _, l := range s.Links {
		switch l.State {
		case "healthy", "follower", "unknown":
			continue
		}
		why := "link to " + l.Peer + " " + l.State
		if l.LastError != "" {
			why += " (" + l.LastError + ")"
		}
		degraded = append(degraded, why)
	}
	switch {
	case len(down) > 0:
		return verdictDown, append(down, degraded...)
	case len(degraded) > 0:
		return verdictDegraded, degraded
	}
	return verdictHealthy, nil
}

// unhealthyError ends a status that is not healthy: exit 6, after the
// status was printed whole.
type unhealthyError struct {
	verdict string
	why     []string
}

func (e unhealthyError) Error() string {
	return e.verdict + ": " + strings.Join(e.why, "; ")
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
	v := strings.ToUpper(s.Verdict)
	if len(s.Why) > 0 {
		v += ": " + strings.Join(s.Why, "; ")
	}
	fmt.Fprintf(w, "%s\n\n", v)
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
	for _, l := range s.Links {
		for _, d := range l.Drift {
			// Not a fault (the verdict does not count it): the flags
			// will not be what a reader of them expects.
			fmt.Fprintf(w, "drift      link %s %s: declared %s, in force %s (the cluster's log; replicator %s %s changes it)\n",
				l.Peer, d.Setting, d.Declared, d.InForce, d.Setting, l.Peer)
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tVOTER\tAPPLIED\tLAG")
	for _, n := range r.Nodes {
		applied, lag := appliedLag(n)
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", n.ID, n.State, n.Voter, applied, lag)
	}
	tw.Flush()
	if len(r.Groups) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GROUP	LEADER	SLOTS	APPLIED HERE")
		for _, g := range r.Groups {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\n", g.Group, cmp.Or(g.Leader, "(none known)"), g.Slots, g.Applied)
		}
		tw.Flush()
	}
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

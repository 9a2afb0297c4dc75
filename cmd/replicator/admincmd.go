package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/entry"
)

const adminUsage = `replicator admin wal|peers|origin|digest|cluster [--addr URL] [-o table|json]
replicator admin pause|resume|reseed|detach PEER [--addr URL]
replicator admin filter PEER [--include PREFIX]... [--exclude PREFIX]... [--every-key] [--release] [--addr URL]
replicator admin bandwidth PEER [RATE] [--addr URL]
replicator admin compression PEER [zstd|none] [--addr URL]
replicator admin cluster join NODE-ID RAFT-ADDR | cluster remove NODE-ID[.INCARNATION] [--addr URL]
replicator admin rebuild-tree [--addr URL]   sum the node's kept hashes afresh from its tree, correct wrong ones`

// runAdmin serves `replicator admin ...` (and the peers/digest shortcuts).
func runAdmin(cmd string, args []string) error {
	if cmd == "admin" {
		if len(args) == 0 {
			return usagef("usage:\n%s", adminUsage)
		}
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			fmt.Println(adminUsage)
			return errHelp
		}
		// flags may come before the sub-command too
		for i, a := range args {
			if !strings.HasPrefix(a, "-") && (i == 0 || !strings.HasPrefix(args[i-1], "-") || strings.Contains(args[i-1], "=") || isBoolFlag(args[i-1])) {
				cmd, args = a, append(append([]string(nil), args[:i]...), args[i+1:]...)
				break
			}
		}
		if cmd == "admin" {
			return usagef("usage:\n%s", adminUsage)
		}
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	// Each command lists (and takes) only its own flags.
	wait, force := new(bool), new(string)
	var prefixes, include, exclude []string
	everyKey, release := new(bool), new(bool)
	*wait = true
	switch cmd {
	case "reseed":
		fs.BoolVar(wait, "wait", true, "follow the re-seed with a progress bar until it ends")
	case "filter":
		fs.Var(listFlag{&include, "PREFIX"}, "include", "only keys under this prefix cross (repeatable); with --exclude, replaces the link's filter")
		fs.Var(listFlag{&exclude, "PREFIX"}, "exclude", "keys under this prefix never cross (repeatable)")
		fs.BoolVar(everyKey, "every-key", false, "let every key cross (no filter)")
		fs.BoolVar(release, "release", false, "declare the link's narrowing permanent: the tombstones kept for a later widening of what the filter keeps home go")
	case "digest":
		fs.Var(listFlag{&prefixes, "PREFIX"}, "prefix", "hash only the keys under this prefix (repeatable: under any of them), to prove two clusters agree on what a link's filter lets cross")
	case "cluster":
		fs.StringVar(force, "force", "", "join: add the node although its raft port does not say who it is (an emergency: give the reason, which the leader logs)")
	}
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
	case "filter":
		return runFilter(ctx, c, &cf, fs.Args(), include, exclude, *everyKey, *release)
	case "bandwidth":
		return runBandwidth(ctx, c, &cf, fs.Args())
	case "compression":
		return runCompression(ctx, c, &cf, fs.Args())
	case "pause", "resume", "reseed", "detach":
		if fs.NArg() != 1 {
			return usagef("usage: replicator admin %s PEER", cmd)
		}
		peer := fs.Arg(0)
		var st client.LinkStatus
		if _, err := c.Do(ctx, http.MethodPost, "/admin/peers/"+peer+"/"+cmd, nil, nil, &st); err != nil {
			return asWrite(err)
		}
		if cf.out.format == "json" {
			return cf.out.print(st, nil) // a script follows a re-seed by polling /admin/peers
		}
		fmt.Printf("%s: %s requested; link state %s\n", peer, cmd, st.State)
		if cmd == "reseed" && *wait {
			return followReseed(c.Do, peer, os.Stdout)
		}
		return nil
	}
	if cmd == "rebuild-tree" {
		if fs.NArg() != 0 {
			return usagef("usage: replicator admin rebuild-tree [--addr URL]")
		}
		r, err := c.RebuildTree(ctx)
		if err != nil {
			return err
		}
		return cf.out.print(r, func(w io.Writer) {
			fmt.Fprintf(w, "%d leaves summed afresh, %d corrected (%.1fs)\n", r.Leaves, r.Corrected, r.Seconds)
			if r.Corrected > 0 {
				fmt.Fprintf(w, "the tree changed beneath the kept hashes: compare with each peer (replicator diff --peer P) to find the keys\n")
			}
		})
	}
	if cmd == "cluster" && fs.NArg() > 0 {
		var body []byte
		switch {
		case fs.Arg(0) == "join" && fs.NArg() == 3:
			body, _ = json.Marshal(map[string]any{"id": fs.Arg(1), "raft": fs.Arg(2), "force": *force})
		case fs.Arg(0) == "remove" && fs.NArg() == 2:
			body, _ = json.Marshal(map[string]string{"id": fs.Arg(1)})
		default:
			return usagef("usage: replicator admin cluster join NODE-ID RAFT-ADDR | cluster remove NODE-ID")
		}
		var r api.ClusterReport
		if _, err := c.Do(ctx, http.MethodPost, "/admin/cluster/"+fs.Arg(0), body, http.Header{"Content-Type": {"application/json"}}, &r); err != nil {
			return asWrite(err)
		}
		if cf.out.format == "json" {
			return cf.out.print(r, nil)
		}
		fmt.Printf("%s %s: done\n", fs.Arg(0), fs.Arg(1))
		return nil
	}
	paths := map[string]string{"wal": "/admin/wal", "peers": "/admin/peers", "origin": "/admin/origin", "digest": "/admin/digest",
		"cluster": "/admin/cluster"}
	path, ok := paths[cmd]
	if !ok {
		return usagef("unknown admin command %q\nusage:\n%s", cmd, adminUsage)
	}
	var out any
	switch cmd {
	case "wal":
		out = &api.WALReport{}
	case "peers":
		out = &api.PeersReport{}
	case "origin":
		out = &api.OriginReport{}
	case "digest":
		out = &api.DigestReport{}
	case "cluster":
		out = &api.ClusterReport{}
	}
	if len(prefixes) > 0 {
		path += "?" + url.Values{"prefix": prefixes}.Encode()
	}
	if _, err := c.Do(ctx, http.MethodGet, path, nil, nil, out); err != nil {
		return err
	}
	return cf.out.print(out, func(w io.Writer) {
		switch v := out.(type) {
		case *api.WALReport:
			printWAL(w, v)
		case *api.PeersReport:
			printPeers(w, v)
		case *api.OriginReport:
			fmt.Fprintf(w, "cluster  %s\nresolver %s\nstream   %s\nversion  %s\n", v.Cluster, v.Resolver, v.Stream, v.Version)
		case *api.DigestReport:
			fmt.Fprintf(w, "cluster    %s\ndigest     %s\nkeys       %s\ncounters   %s\ntombstones %s\n", v.Cluster, v.Digest, count(v.Keys), count(v.Counters), count(v.Tombstones))
			if len(v.Prefixes) > 0 {
				fmt.Fprintf(w, "prefixes   %s\n", strings.Join(v.Prefixes, " "))
			}
		case *api.ClusterReport:
			printCluster(w, v)
		}
	})
}

// printCluster is the nodes table of `replicator admin cluster`.
func printCluster(w io.Writer, r *api.ClusterReport) {
	leader := r.Leader
	if leader == "" {
		leader = "none known"
	}
	fmt.Fprintf(w, "cluster %s (%s)  leader %s  term %d  commit #%d  stream %s\n(answered by %s: %s, applied #%d)\n",
		r.Cluster, r.Mode, leader, r.Term, r.Commit, r.Stream, r.Node, r.State, r.Applied)
	if rb := r.RefusedBy; rb != nil {
		fmt.Fprintf(w, "REFUSED: %s refuses this node (%s) since %s: %s\n", rb.By, r.Node, rb.At.Format(time.RFC3339), rb.Reason)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tINCARNATION\tSTATE\tVOTER\tRAFT\tAPI\tGOSSIP\tAPPLIED\tLAG\tERROR")
	for _, cn := range r.Nodes {
		state := cn.State
		if cn.Leader && !strings.HasPrefix(state, "leader") {
			state += " (the leader, as the others know)"
		}
		if !cn.Voter && cn.Raft != "" && state != "removed" && state != "not a member" && state != "replaced" {
			state += " (non-voter: votes once caught up)"
		}
		applied, lag := appliedLag(cn)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\n", cn.ID, dash(cn.Incarnation), state, cn.Voter, cn.Raft, dash(cn.API),
			dash(cn.Gossip), applied, lag, dash(cn.Error))
	}
	tw.Flush()
}

type doFunc func(ctx context.Context, method, path string, body []byte, hdr http.Header, out any) (http.Header, error)

// followReseed draws a progress bar until the peer's re-seed ends.
func followReseed(do doFunc, peer string, w io.Writer) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var r api.PeersReport
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

// asWrite marks a failed change (a link action, a membership change) as a
// write, so that its outcome is told as a write's: a 503 unknown_outcome or
// a lost answer may have taken effect (exit 5).
func asWrite(err error) error {
	return &client.WriteError{Err: err, MayHaveWritten: client.MayHaveWritten(err)}
}

// stateNote says what a saturation state means for writes: "throttled"
// reads as if writes were slowed, and it is the early warning.
var stateNote = map[string]string{
	"throttled": "an early warning: a link's backlog is over its low-water mark (half the high one by default); every write is still taken",
	"saturated": "local writes are refused until every link is under its low-water marks: bring the peer back, or detach it",
}

// toLimit is a link's time to its high-water mark at the last minute's
// rates: "-" when its backlog is not growing toward one.
func toLimit(f api.Forecast) string {
	switch {
	case f.SecondsToLimit == nil:
		return "-"
	case *f.SecondsToLimit == 0:
		return "reached (" + f.Mark + ")"
	}
	return age(*f.SecondsToLimit) + " (" + f.Mark + ")"
}

func printWAL(w io.Writer, r *api.WALReport) {
	fmt.Fprintf(w, "stream %s  writes #%d..#%d (applied #%d)  %s in %d segments\n",
		r.Stream, r.First, r.Last, r.Applied, human(r.Bytes), r.Segments)
	s := r.Saturation
	fmt.Fprintf(w, "saturation %s", strings.ToUpper(s.State))
	if s.Cause != "" {
		fmt.Fprintf(w, " (peer %s: %s)", s.Peer, s.Cause)
	}
	if note := stateNote[s.State]; note != "" {
		fmt.Fprintf(w, "\n  %s", note)
	}
	th := s.Thresholds
	fmt.Fprintf(w, "\nthresholds (high/low): %s/%s writes, %s/%s, %s/%s old\n",
		count(th.HighEntries), count(th.LowEntries), human(th.HighBytes), human(th.LowBytes), th.HighAge, th.LowAge)
	fmt.Fprintf(w, "replay permits %d/%d in use, %d/%d queued (%s)\n", r.Permits.InUse, r.Permits.Capacity, r.Permits.Queued, r.Permits.QueueCap, r.Permits.State)
	fmt.Fprintf(w, "refusals: %s\n\n", counts(r.Refusals))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tSTATE\tACKED THROUGH\tBEHIND\tBYTES BEHIND\tOLDEST\tIN/S\tACKED/S\tTO LIMIT\tOVERFLOW\tWAL RETAINED")
	for _, p := range r.Peers {
		fmt.Fprintf(tw, "%s\t%s\t#%d\t%s writes\t%s\t%s\t%.1f\t%.1f\t%s\t%s\t%v\n", p.Peer, p.State, p.Acked, count(p.Entries), human(p.Bytes),
			age(p.OldestAgeSeconds), p.WriteRate, p.DrainRate, toLimit(p.Forecast), dash(p.Overflow), p.Retained)
	}
	tw.Flush()
}

// counts prints a map of counters in key order: "none" when empty.
func counts(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %s", k, count(m[k])))
	}
	return strings.Join(parts, ", ")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printPeers(w io.Writer, r *api.PeersReport) {
	fmt.Fprintf(w, "cluster %s\n\n", r.Cluster)
	printLinks(w, r.Links)
	if len(r.Links) > 0 {
		// What each link carries and how: the table a filter, a limit or
		// compression changes (it was in -o json only).
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PEER\tFILTER\tCOMPRESSION\tBANDWIDTH\tTHROTTLED")
		for _, l := range r.Links {
			limit := "none"
			if l.BandwidthLimit > 0 {
				limit = human(l.BandwidthLimit) + "/s"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1fs\n", l.Peer, dash(l.Filter), dash(l.Compression), limit, l.ThrottledSeconds)
		}
		tw.Flush()
	}
	for _, l := range r.Links {
		if l.Reseed.Runs > 0 {
			fmt.Fprintf(w, "re-seeds of %s: %d, last %s (%s)\n", l.Peer, l.Reseed.Runs,
				l.Reseed.Finished.Format(time.RFC3339), l.Reseed.LastReason)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(r.Rejoin.Phases)) {
		fmt.Fprintf(w, "rejoin with %s: %s\n", p, r.Rejoin.Phases[p])
	}
	for _, p := range slices.Sorted(maps.Keys(r.Rejoin.Requests)) {
		fmt.Fprintf(w, "peer %s lost data: %s\n", p, strings.Join(r.Rejoin.Requests[p], ", "))
	}
	if len(r.Incoming) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FROM\tBATCHES\tAPPLIED\tSTALE\tDUPLICATES\tREFUSED")
		for _, name := range slices.Sorted(maps.Keys(r.Incoming)) {
			c := r.Incoming[name]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, count(c.Batches), count(c.Applied), count(c.Stale), count(c.Duplicates), count(c.Refused))
		}
		tw.Flush()
		for _, name := range slices.Sorted(maps.Keys(r.Incoming)) {
			if c := r.Incoming[name]; c.Withheld+c.WithheldUnheard > 0 {
				fmt.Fprintf(w, "relays of third clusters' writes from %s left out: %s kept home by their author's filter, %s before that filter was heard\n",
					name, count(c.Withheld), count(c.WithheldUnheard))
			}
		}
	}
}

// printLinks is the links table. ACKED THROUGH is a position in this
// node's write log (one entry per write: a batch or a range delete is one,
// whatever number of keys it touched), BEHIND the writes past it.
func printLinks(w io.Writer, links []client.LinkStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tSTATE\tVERSION\tACKED THROUGH\tBEHIND\tBYTES BEHIND\tOLDEST\tLAST CONTACT\tERRORS\tSKEW\tLAST ERROR")
	for _, l := range links {
		contact := "never"
		if !l.LastContact.IsZero() {
			contact = age(time.Since(l.LastContact).Seconds()) + " ago"
		}
		state := l.State
		if l.Reseed.Running {
			state = fmt.Sprintf("%s %s/%s keys", state, count(l.Reseed.Sent), count(l.Reseed.Total))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t#%d\t%s writes\t%s\t%s\t%s\t%d\t%s\t%s\n", l.Peer, state, dash(l.PeerVersion), l.Acked,
			count(l.EntriesBehind), human(l.BytesBehind), age(l.OldestUnackedAge), contact, l.ConsecutiveErrors,
			(time.Duration(l.ClockSkewMS * float64(time.Millisecond))).Round(time.Millisecond), dash(l.LastError))
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

// runFilter shows the link's filter, or sets it.
func runFilter(ctx context.Context, c *client.Client, cf *clientFlags, args, include, exclude []string, everyKey, release bool) error {
	if len(args) != 1 {
		return usagef("usage: replicator filter PEER [--include PREFIX]... [--exclude PREFIX]... [--every-key] [--release]")
	}
	if everyKey && (len(include) > 0 || len(exclude) > 0) {
		return usagef("--every-key takes no --include or --exclude")
	}
	if release && (everyKey || len(include) > 0 || len(exclude) > 0) {
		return usagef("--release takes no other flag: it releases the narrowing of the filter in force")
	}
	path := "/admin/peers/" + url.PathEscape(args[0]) + "/filter"
	var r api.FilterReport
	if release {
		if _, err := c.Do(ctx, http.MethodPost, path+"/release", nil, nil, &r); err != nil {
			return asWrite(err)
		}
	} else if !everyKey && len(include) == 0 && len(exclude) == 0 {
		if _, err := c.Do(ctx, http.MethodGet, path, nil, nil, &r); err != nil {
			return err
		}
	} else {
		body, _ := json.Marshal(map[string][]string{"include": include, "exclude": exclude})
		if _, err := c.Do(ctx, http.MethodPut, path, body, http.Header{"Content-Type": {"application/json"}}, &r); err != nil {
			return asWrite(err)
		}
	}
	return cf.out.print(r, func(w io.Writer) {
		state := "recorded in the cluster's log"
		if !r.Recorded {
			state = "from the leader's flags, not recorded yet"
		}
		fmt.Fprintf(w, "peer    %s\nfilter  %s (%s)\n", r.Peer, r.Filter.String(), state)
		for _, ep := range r.Epochs {
			fmt.Fprintf(w, "  from index %d: %s\n", ep.From, ep.Filter.String())
		}
		spans := func(ss []entry.Span) string {
			var parts []string
			for _, sp := range ss {
				parts = append(parts, fmt.Sprintf("[%q, %q)", sp.Start, sp.End))
			}
			return strings.Join(parts, " ")
		}
		if len(r.Keep) > 0 {
			fmt.Fprintf(w, "tombstones kept for a widening in %s\n", spans(r.Keep))
		}
		if k := r.Kept; k != nil {
			fmt.Fprintf(w, "  the last collection kept %d tombstones and %d range deletes (%s)\n", k.Tombstones, k.Ranges, human(k.Bytes))
		}
		if len(r.Released) > 0 {
			fmt.Fprintf(w, "released (a permanent narrowing: no tombstones kept) %s\n", spans(r.Released))
		}
		for _, on := range r.PeerKeeps {
			fmt.Fprintf(w, "%s keeps for its link to %s %s: its deletes there are kept here too\n", r.Peer, on.Target, spans(on.Spans))
		}
		if k := r.KeptForPeerLinks; k != nil {
			fmt.Fprintf(w, "  the last collection kept %d of %s's tombstones and %d range deletes for its links (%s)\n", k.Tombstones, r.Peer, k.Ranges, human(k.Bytes))
		}
	})
}

// runBandwidth shows the link's bandwidth limit, or sets it.
func runBandwidth(ctx context.Context, c *client.Client, cf *clientFlags, args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return usagef("usage: replicator bandwidth PEER [RATE]   (RATE: e.g. 20MiB, 500KB, 0 for no limit)")
	}
	path := "/admin/peers/" + url.PathEscape(args[0]) + "/bandwidth"
	var r api.BandwidthReport
	if len(args) == 1 {
		if _, err := c.Do(ctx, http.MethodGet, path, nil, nil, &r); err != nil {
			return err
		}
	} else {
		bps, err := parseRate(args[1])
		if err != nil {
			return usagef("bandwidth: %v", err)
		}
		body, _ := json.Marshal(map[string]int64{"bytes_per_second": bps})
		if _, err := c.Do(ctx, http.MethodPut, path, body, http.Header{"Content-Type": {"application/json"}}, &r); err != nil {
			return asWrite(err)
		}
	}
	return cf.out.print(r, func(w io.Writer) {
		limit := "none"
		if r.BytesPerSecond > 0 {
			limit = human(r.BytesPerSecond) + "/s"
		}
		state := "recorded in the cluster's log"
		if !r.Recorded {
			state = "from the leader's flags, not recorded yet"
		}
		fmt.Fprintf(w, "peer       %s\nlimit      %s (%s)\nthrottled  %.1fs\n", r.Peer, limit, state, r.ThrottledSeconds)
	})
}

// runCompression shows the link's compression of batch bodies, or sets it
// through the cluster's log (as bandwidth).
func runCompression(ctx context.Context, c *client.Client, cf *clientFlags, args []string) error {
	if len(args) < 1 || len(args) > 2 || (len(args) == 2 && args[1] != "zstd" && args[1] != "none") {
		return usagef("usage: replicator compression PEER [zstd|none]")
	}
	path := "/admin/peers/" + url.PathEscape(args[0]) + "/compression"
	var r api.CompressionReport
	if len(args) == 1 {
		if _, err := c.Do(ctx, http.MethodGet, path, nil, nil, &r); err != nil {
			return err
		}
	} else {
		body, _ := json.Marshal(map[string]string{"compression": args[1]})
		if _, err := c.Do(ctx, http.MethodPut, path, body, http.Header{"Content-Type": {"application/json"}}, &r); err != nil {
			return asWrite(err)
		}
	}
	return cf.out.print(r, func(w io.Writer) {
		state := "recorded in the cluster's log"
		if !r.Recorded {
			state = "from the leader's flags, not recorded yet"
		}
		fmt.Fprintf(w, "peer         %s\ncompression  %s (%s)\n", r.Peer, r.Compression, state)
	})
}

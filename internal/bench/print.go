package bench

import (
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
)

func numCPU() int { return runtime.NumCPU() }

func fmtMap(m map[string]float64, format string) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+" "+fmt.Sprintf(format, m[k]))
	}
	return strings.Join(parts, ", ")
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "machine: %s\n", r.Machine)
	if f := r.Floor; f != nil {
		fmt.Fprintf(w, "floor: %.2f ms = 2 x %.3f ms synced Pebble commit + %.3f ms loopback round trip (medians of %d; the commits' p99 is %.2f ms)\n",
			f.MS, f.CommitMS, f.RoundTripMS, floorSamples, f.CommitP99MS)
		for _, x := range r.Results {
			if x.Nodes > 1 {
				fmt.Fprintf(w, "floor of clusters of several nodes: %.2f ms (adds each cluster's raft round trip, 2 x %.3f ms)\n", f.RaftMS, f.RoundTripMS)
				break
			}
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tNODES\tWRITES\tWRITES/S\tMB/S\tx BASELINE\tx 1 NODE\tLAG p50/p99/max ms\tp50/p99 x FLOOR\tCPU s/M writes\tWIRE B/write\tPEAK RSS MiB")
	for _, x := range r.Results {
		lag, ratio, floor, single := "-", "-", "-", "-"
		if x.RatioSingle > 0 {
			single = fmt.Sprintf("%.2f", x.RatioSingle)
		}
		if x.LagMaxMS > 0 {
			lag = fmt.Sprintf("%.1f / %.1f / %.1f", x.LagP50MS, x.LagP99MS, x.LagMaxMS)
		}
		if x.LagP50Floor > 0 {
			floor = fmt.Sprintf("%.1f / %.1f", x.LagP50Floor, x.LagP99Floor)
		}
		if x.RatioBaseline > 0 {
			ratio = fmt.Sprintf("%.2f", x.RatioBaseline)
		}
		nodes := "-"
		if x.Nodes > 0 {
			nodes = fmt.Sprint(x.Nodes)
		}
		wire := "-"
		if x.WireBytesPerWrite > 0 {
			wire = fmt.Sprintf("%.0f", x.WireBytesPerWrite)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.Scenario, nodes, x.Writes, x.WritesPerSec, x.MBPerSec, ratio, single, lag, floor,
			fmtMap(x.CPUSecPerM, "%.1f"), wire, fmtMap(x.PeakRSSMiB, "%.0f"))
	}
	tw.Flush()
	for _, x := range r.Results {
		if x.Note != "" {
			fmt.Fprintf(w, "  %s (%d node(s)): %s\n", x.Scenario, x.Nodes, x.Note)
		}
	}
	for _, x := range r.Results {
		if len(x.Stages) > 0 {
			var parts []string
			for _, name := range []string{"ship", "wire", "apply"} {
				if st, ok := x.Stages[name]; ok {
					parts = append(parts, fmt.Sprintf("%s %.2f / %.2f", name, st[0], st[1]))
				}
			}
			fmt.Fprintf(w, "  %s (%d node(s)) lag by stage, p50 / p99 ms: %s\n", x.Scenario, x.Nodes, strings.Join(parts, ", "))
		}
	}
}

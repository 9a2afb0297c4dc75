package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Result is one scenario's figures.
type Result struct {
	Scenario     string  `json:"scenario"`
	Writes       int     `json:"writes"`
	Seconds      float64 `json:"seconds"`
	WritesPerSec float64 `json:"writes_per_sec"`
	MBPerSec     float64 `json:"mb_per_sec"`
	LagP50MS     float64 `json:"lag_p50_ms,omitempty"`
	LagP99MS     float64 `json:"lag_p99_ms,omitempty"`
	LagMaxMS     float64 `json:"lag_max_ms,omitempty"`
	// ClientP50MS and ClientP99MS are the writers' own latencies (steady).
	ClientP50MS   float64            `json:"client_p50_ms,omitempty"`
	ClientP99MS   float64            `json:"client_p99_ms,omitempty"`
	CPUSecPerM    map[string]float64 `json:"cpu_seconds_per_million,omitempty"`
	PeakRSSMiB    map[string]float64 `json:"peak_rss_mib,omitempty"`
	RatioBaseline float64            `json:"ratio_to_baseline,omitempty"`
	// LagP50Floor and LagP99Floor are the lag figures as multiples of the
	// run's floor: how close this machine's replication is to its own limit.
	LagP50Floor float64 `json:"lag_p50_x_floor,omitempty"`
	LagP99Floor float64 `json:"lag_p99_x_floor,omitempty"`
	// BatchesApplied counts the replication batches each node applied
	// during the scenario (writes / batches is the batching under load).
	BatchesApplied map[string]float64 `json:"batches_applied,omitempty"`
	// Stages is the lag's p50 and p99 (ms) by stage: ship (the sender's
	// commit to send), wire, apply (received to synced apply).
	Stages map[string][2]float64 `json:"lag_stages_p50_p99_ms,omitempty"`
	// HTTPFloorUS (puts) is the CPU per request of a bare net/http server
	// under the same load: the part of the server CPU per write that
	// serving HTTP/1.1 with net/http costs whatever the node does.
	HTTPFloorUS float64 `json:"http_floor_cpu_us,omitempty"`
	// Nodes is the size of each cluster of the pair; RatioSingle, for a
	// cluster of several, is its writes/s over the same scenario's with a
	// node alone per cluster, measured in the same run.
	Nodes       int     `json:"nodes"`
	RatioSingle float64 `json:"ratio_to_single_node,omitempty"`
	// WireBytesPerWrite is what the writing cluster sent its peer per
	// write, request bodies after compression (0: a build that does not
	// count them).
	WireBytesPerWrite float64 `json:"wire_bytes_per_write,omitempty"`
	// antientropy: the keys found divergent and repaired, the bytes the
	// comparison exchanged on the wire, the leaves that differed and the
	// keys compared; beside them what a comparison by a full scan moves
	// (bytes) and a's full scan's time.
	DivergentFound  int     `json:"divergent_found,omitempty"`
	Repaired        int     `json:"repaired,omitempty"`
	ExchangedBytes  int64   `json:"exchanged_bytes,omitempty"`
	LeavesDiffering int     `json:"leaves_differing,omitempty"`
	KeysCompared    int     `json:"keys_compared,omitempty"`
	FullScanBytes   int64   `json:"full_scan_bytes,omitempty"`
	FullScanSeconds float64 `json:"full_scan_seconds,omitempty"`
	Note            string  `json:"note,omitempty"`
}

// Report is the whole run.
type Report struct {
	Machine string   `json:"machine"`
	Floor   *Floor   `json:"floor,omitempty"`
	Config  Config   `json:"-"`
	Results []Result `json:"results"`
}

// mark is one node's CPU seconds and batches applied at one moment.
type mark struct {
	cpu, batches float64
	ok           bool
	wire         float64 // bytes sent to peers after compression
	wireOK       bool
}

// cpuMark is every node's mark, by name.
type cpuMark map[string]mark

func cpuNow(cl []*cluster) cpuMark {
	m := cpuMark{}
	for _, c := range cl {
		v, err := c.metrics("process_cpu_seconds_total", "replicator_apply_seconds_count")
		if err == nil {
			m[c.name] = mark{cpu: v["process_cpu_seconds_total"], batches: v["replicator_apply_seconds_count"], ok: true}
			mk := m[c.name]
			mk.wire, mk.wireOK = c.wireBytes()
			m[c.name] = mk
		}
	}
	return m
}

func (r *Result) finish(cl []*cluster, before cpuMark, writes int, el time.Duration, valueSize int) {
	r.Writes, r.Seconds = writes, el.Seconds()
	r.WritesPerSec = float64(writes) / el.Seconds()
	r.MBPerSec = float64(writes*valueSize) / el.Seconds() / 1e6
	after := cpuNow(cl)
	r.CPUSecPerM = map[string]float64{}
	r.PeakRSSMiB = map[string]float64{}
	if b, a := before[cl[0].name], after[cl[0].name]; b.wireOK && a.wireOK {
		r.WireBytesPerWrite = (a.wire - b.wire) / float64(writes)
	}
	for _, c := range cl {
		if b, a := before[c.name], after[c.name]; b.ok && a.ok {
			r.CPUSecPerM[c.name] = (a.cpu - b.cpu) / float64(writes) * 1e6
			if a.batches > b.batches {
				if r.BatchesApplied == nil {
					r.BatchesApplied = map[string]float64{}
				}
				r.BatchesApplied[c.name] = a.batches - b.batches
			}
		}
		if c.cmd != nil && c.cmd.Process != nil {
			c.peakRSS.Store(vmHWM(c.cmd.Process.Pid))
		}
		r.PeakRSSMiB[c.name] = float64(c.peakRSS.Load()) / (1 << 20)
	}
}

// vmHWM is a process's peak resident set in bytes (0 if unknown). Reading it
// from /proc costs the node nothing, where sampling /metrics ten times a
// second cost it CPU the figures would count.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

type lagDoc struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	Stages  map[string]struct {
		P50 float64 `json:"p50_ms"`
		P99 float64 `json:"p99_ms"`
	} `json:"stages"`
}

func (r *Result) lag(c *cluster, since time.Time) {
	var l lagDoc
	if c.getJSON(fmt.Sprintf("/admin/lag?since=%d", since.UnixNano()), &l) == nil && l.Samples > 0 {
		r.LagP50MS, r.LagP99MS, r.LagMaxMS = l.P50, l.P99, l.Max
		for name, st := range l.Stages {
			if r.Stages == nil {
				r.Stages = map[string][2]float64{}
			}
			r.Stages[name] = [2]float64{st.P50, st.P99}
		}
	}
}

func machine() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	model := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			_, model, _ = strings.Cut(l, ":")
			break
		}
	}
	return fmt.Sprintf("%d CPUs, %s", numCPU(), strings.TrimSpace(model))
}

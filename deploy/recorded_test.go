//go:build linux

package deploy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/replicator/replicator/api"
)

// TestRecordedSeries checks the alert rules and the dashboard's queries
// against series recorded from real nodes, with promtool's unit tests:
// cluster a of three nodes (small water marks, short link thresholds) paired
// with cluster b of one, child processes of the built binary on loopback,
// taken through five phases:
//
//	P0 healthy, writes both ways
//	P1 b killed: a's link to b stalls, sends fail, the backlog passes the
//	   low-water mark and a forecast of the high one appears
//	P2 more writes: a saturated, writes refused (503 saturated)
//	P3 b back, the backlog drained; then one follower of a killed
//	P4 a second node of a killed: no leader in a, b still led
//
// Each phase scrapes /metrics of every live node twice, a few seconds apart,
// and is held for 10 minutes of rule time at 15 s intervals: a gauge keeps
// its second scrape's value, a counter (and a histogram's _bucket, _sum and
// _count) grows at the rate measured between the two scrapes, a timestamp
// gauge (_timestamp_seconds, _time_seconds) keeps its age and moves with
// rule time if it moved between the scrapes, and a node that is down has no
// samples. Every sample is labelled as Prometheus labels a scrape
// (job="replicator", instance="host:port"). At the end of each phase the
// firing alerts (ALERTS, which promtool's unit tests expose to
// promql_expr_test) must be exactly the expected ones; at the end of P0 and
// P3 every panel's query of grafana/replicator.json must answer with a
// number.
//
// The generated test, the scrapes and the nodes' logs are kept when the
// test fails, or when $REPLICATOR_KEEP_RECORDED is set (the path is
// logged).
func TestRecordedSeries(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed (.ci/run installs it: apt-get install prometheus)")
	}
	rulesPath, err := filepath.Abs("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bin := replicatorBinary(t)
	began := time.Now()
	keep, err := os.MkdirTemp("", "replicator-recorded-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("REPLICATOR_KEEP_RECORDED") != "" {
			t.Logf("recordings, the generated promtool test and the nodes' logs are kept in %s", keep)
			return
		}
		os.RemoveAll(keep)
	})

	// The nodes. a's peer b is b's only node; b's peer a is a1's URL (its
	// link follows a's leader by the answers).
	const secret = "recorded-secret"
	data := t.TempDir()
	an := make([]*recNode, 3)
	for i := range an {
		an[i] = newRecNode(t, bin, keep, fmt.Sprintf("a%d", i+1), "a")
	}
	b := newRecNode(t, bin, keep, "b", "b")
	links := []string{"--link-lagging", "1s", "--link-stalled", "3s"}
	for i, n := range an {
		n.args = append(n.args, "--node-id", n.name, "--data", filepath.Join(data, n.name),
			"--raft-listen", n.raft, "--bootstrap-expect", "3", "--gossip-bind", n.gossip, "--gossip-profile", "local",
			"--peer", "b="+b.url(), "--peer-secret", "b="+secret, "--peer-compression", "b=zstd", "--peer-bandwidth", "b=64MiB",
			"--wal-high-water-entries", "300", "--wal-low-water-entries", "150", "--admission-wait", "0s")
		n.args = append(n.args, links...)
		for j, o := range an {
			if j != i {
				n.args = append(n.args, "--join", o.gossip)
			}
		}
	}
	b.args = append(b.args, "--data", filepath.Join(data, "b"), "--peer", "a="+an[0].url(), "--peer-secret", "a="+secret)
	b.args = append(b.args, links...)
	all := append(slices.Clone(an), b)
	for _, n := range all {
		n.start()
	}
	for _, n := range all {
		n.waitHealthy()
	}
	var leader *recNode
	recUntil(t, 30*time.Second, "a leader in a and in b", func() (bool, string) {
		leader = nil
		for _, n := range an {
			if c, err := recLocalCluster(n); err == nil && c.State == "leader" {
				leader = n
			}
		}
		if leader == nil {
			return false, "no node of a leads"
		}
		if c, err := recLocalCluster(b); err != nil || c.State != "leader" {
			return false, fmt.Sprintf("b: %+v %v", c, err)
		}
		return true, ""
	})
	t.Logf("a's leader is %s (%s); started in %s", leader.name, leader.addr, time.Since(began).Round(time.Millisecond))

	wa := startRecWriter(t, "a", leader.url(), 50*time.Millisecond)
	wb := startRecWriter(t, "b", b.url(), 100*time.Millisecond)

	rec := &recording{t: t, dir: keep}

	// P0: healthy, writes flowing both ways. The second scrape is taken
	// once a's leader exports no forecast: with a 300-entry mark and a
	// trend only seconds long, the entry or two in flight on a healthy link
	// reads as a backlog growing toward the mark (a real Prometheus sees it
	// flicker; held for 10 minutes here it would be a false warning).
	recUntil(t, 30*time.Second, "links healthy both ways, entries applied both ways", func() (bool, string) {
		// A leader on 2 loaded cores may step down right after its
		// election (its lease ran out while four nodes started): whoever
		// leads now is a's leader.
		for _, n := range an {
			if c, err := recLocalCluster(n); err == nil && c.State == "leader" && n != leader {
				t.Logf("a's leader is now %s", n.name)
				leader = n
			}
		}
		if s := recLinkOf(leader, "b"); s.State != "healthy" {
			return false, "a's link to b is " + s.State
		}
		if s := recLinkOf(b, "a"); s.State != "healthy" {
			return false, "b's link to a is " + s.State
		}
		sl, sb := recScrapeNode(t, leader), recScrapeNode(t, b)
		if v, _ := sl.value("replicator_apply_outcomes_total", "origin", "b", "outcome", "applied"); v == 0 {
			return false, "a applied nothing from b yet"
		}
		if v, _ := sb.value("replicator_apply_outcomes_total", "origin", "a", "outcome", "applied"); v == 0 {
			return false, "b applied nothing from a yet"
		}
		if v, _ := sl.value("replicator_raft_voters_live"); v != 3 {
			return false, fmt.Sprintf("%g voters live", v)
		}
		for _, n := range []*recNode{leader, b} {
			if _, ok := recScrapeNode(t, n).value("replicator_antientropy_last_pass_timestamp_seconds"); !ok {
				return false, n.name + " completed no comparison yet"
			}
		}
		return true, ""
	})
	// A command through each cluster's Redis door (the dashboard's row).
	for _, n := range []*recNode{leader, b} {
		c, err := net.DialTimeout("tcp", n.resp, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
		if reply, err := bufio.NewReader(c).ReadString('\n'); err != nil || reply != "+PONG\r\n" {
			t.Fatalf("PING at %s's Redis door: %q %v", n.name, reply, err)
		}
		c.Close()
	}
	var followers []*recNode
	for _, n := range an {
		if n != leader {
			followers = append(followers, n)
		}
	}
	rec.phase("P0 healthy", all, 2*time.Second, func(r recRound) (bool, string) {
		sl := r[leader.name]
		if _, ok := sl.value("replicator_backlog_seconds_to_limit", "peer", "b"); ok {
			return false, "a's leader forecasts its link to b reaching a mark"
		}
		if v, _ := sl.value("replicator_raft_leader"); v != 1 {
			return false, leader.name + " no longer leads"
		}
		if v, _ := sl.value("replicator_link_state", "peer", "b", "state", "healthy"); v != 1 {
			return false, "a's link to b is not healthy"
		}
		if v, _ := r["b"].value("replicator_link_state", "peer", "a", "state", "healthy"); v != 1 {
			return false, "b's link to a is not healthy"
		}
		return true, ""
	})

	// P1: b killed. a's leader backs off (100 ms doubling), its link turns
	// lagging then stalled (3 s), and the backlog passes the low-water mark
	// (150 entries at 20 writes/s: 7.5 s) while the forecast says when it
	// reaches the high one. The first scrape is taken at once, so the send
	// failures between the two are the first seconds' (several).
	b.kill()
	rec.phase("P1 b down, saturation coming", an, 2*time.Second, func(r recRound) (bool, string) {
		sl := r[leader.name]
		if v, _ := sl.value("replicator_link_state", "peer", "b", "state", "stalled"); v != 1 {
			return false, "a's link to b is not stalled yet"
		}
		if v, _ := sl.value("replicator_saturation_state"); v != 1 {
			if v == 2 {
				t.Fatal("a saturated before P1's second scrape (the writes came faster than the test assumes)")
			}
			return false, fmt.Sprintf("saturation state %g (backlog under the low-water mark)", v)
		}
		if _, ok := sl.value("replicator_backlog_seconds_to_limit", "peer", "b"); !ok {
			return false, "no forecast of a's link to b"
		}
		if !rec.grew(leader.name, sl, "replicator_peer_send_failures_total", "peer", "b") {
			return false, "no send failure since the first scrape"
		}
		return true, ""
	})

	// P2: writes go on until a saturates and refuses them (the second
	// scrape waits for a refusal). The next send failure comes after a
	// backoff of about 6 s: the second scrape waits for it too, so the rate
	// recorded is the backed-off one.
	rec.phase("P2 saturated", an, 2*time.Second, func(r recRound) (bool, string) {
		sl := r[leader.name]
		if v, _ := sl.value("replicator_saturation_state"); v != 2 {
			return false, fmt.Sprintf("saturation state %g", v)
		}
		if v, _ := sl.value("replicator_link_state", "peer", "b", "state", "stalled"); v != 1 {
			return false, "a's link to b is not stalled"
		}
		if !rec.grew(leader.name, sl, "replicator_peer_send_failures_total", "peer", "b") {
			return false, "no send failure since the first scrape"
		}
		if !rec.grew(leader.name, sl, "replicator_refusals_total", "source", "outbound_backlog") {
			return false, "no write refused since the first scrape"
		}
		return true, ""
	})
	if code, body := recPut(leader.url(), "refused-while-saturated"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"saturated"`) {
		t.Fatalf("a write on saturated a: %d %s (want 503 saturated)", code, body)
	}

	// P3: b back; a's link retries at once on `replicator admin resume b`
	// (its backoff has grown past 10 s) and drains. Then one follower of a
	// is killed: the leader sees it fail its heartbeats.
	b.start()
	b.waitHealthy()
	if code, body := recPost(leader.url() + "/admin/peers/b/resume"); code != http.StatusOK {
		t.Fatalf("resume b: %d %s", code, body)
	}
	recUntil(t, 30*time.Second, "links healed and a drained", func() (bool, string) {
		if s := recLinkOf(leader, "b"); s.State != "healthy" || s.EntriesBehind != 0 {
			return false, fmt.Sprintf("a's link to b: %s, %d behind", s.State, s.EntriesBehind)
		}
		if s := recLinkOf(b, "a"); s.State != "healthy" {
			return false, "b's link to a: " + s.State
		}
		var w api.WALReport
		if err := recGetJSON(leader.url()+"/admin/wal", &w); err != nil || w.Saturation.State != "healthy" {
			return false, fmt.Sprintf("a's saturation: %q %v", w.Saturation.State, err)
		}
		return true, ""
	})
	down := followers[1]
	down.kill()
	recUntil(t, 30*time.Second, "the leader counting 2 voters live", func() (bool, string) {
		v, _ := recScrapeNode(t, leader).value("replicator_raft_voters_live")
		return v == 2, fmt.Sprintf("%g voters live", v)
	})
	p3live := []*recNode{leader, followers[0], b}
	rec.phase("P3 b back, one node of a down", p3live, 2*time.Second, func(r recRound) (bool, string) {
		sl := r[leader.name]
		if _, ok := sl.value("replicator_backlog_seconds_to_limit", "peer", "b"); ok {
			return false, "a's leader forecasts its link to b reaching a mark"
		}
		for _, c := range []struct {
			name  string
			value float64
			label []string
		}{
			{"replicator_raft_voters_live", 2, nil},
			{"replicator_raft_voters", 3, nil},
			{"replicator_raft_leader", 1, nil},
			{"replicator_saturation_state", 0, nil},
			{"replicator_link_state", 1, []string{"peer", "b", "state", "healthy"}},
		} {
			if v, _ := sl.value(c.name, c.label...); v != c.value {
				return false, fmt.Sprintf("%s%v is %g, want %g", c.name, c.label, v, c.value)
			}
		}
		if v, _ := r["b"].value("replicator_link_state", "peer", "a", "state", "healthy"); v != 1 {
			return false, "b's link to a is not healthy"
		}
		return true, ""
	})

	// P4: a second node of a (its leader) killed: the survivor cannot elect
	// one. b still leads its cluster; its link to a, which answers "no
	// leader", turns stalled and its sends fail (a true alert: nothing b
	// writes reaches a).
	wa.stop()
	leader.kill()
	survivor := followers[0]
	rec.phase("P4 no leader in a", []*recNode{survivor, b}, 2*time.Second, func(r recRound) (bool, string) {
		if v, ok := r[survivor.name].value("replicator_raft_leader"); !ok || v != 0 {
			return false, fmt.Sprintf("%s: replicator_raft_leader %g", survivor.name, v)
		}
		if c, err := recLocalCluster(survivor); err != nil || c.State == "leader" || c.Leader != "" {
			return false, fmt.Sprintf("%s: %+v %v", survivor.name, c, err)
		}
		if v, _ := r["b"].value("replicator_raft_leader"); v != 1 {
			return false, "b does not lead"
		}
		if v, _ := r["b"].value("replicator_link_state", "peer", "a", "state", "stalled"); v != 1 {
			return false, "b's link to a is not stalled yet"
		}
		if !rec.grew("b", r["b"], "replicator_peer_send_failures_total", "peer", "a") {
			return false, "no send failure of b since the first scrape"
		}
		return true, ""
	})
	wb.stop()
	for _, n := range []*recNode{survivor, b} {
		n.kill()
	}
	t.Logf("writes: a %d taken, %d refused; b %d taken", wa.ok.Load(), wa.refused.Load(), wb.ok.Load())
	rec.summary(leader, b)
	if wa.refused.Load() == 0 {
		t.Error("no write of a's writer was refused while a was saturated")
	}

	// What fires at the end of each phase, exactly.
	la := map[string]string{"cluster": "a", "instance": leader.addr, "job": "replicator"}
	lb := map[string]string{"cluster": "b", "instance": b.addr, "job": "replicator"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	comingA := recAlert("ReplicatorSaturationComing", with(la, "peer", "b", "severity", "warning"))
	stalledA := recAlert("ReplicatorLinkStalled", with(la, "peer", "b", "state", "stalled", "severity", "critical"))
	failingA := recAlert("ReplicatorSendFailures", with(la, "peer", "b", "severity", "warning"))
	expected := [][]string{
		{},
		{stalledA, failingA, comingA},
		{stalledA, failingA, comingA, recAlert("ReplicatorSaturated", with(la, "severity", "critical"))},
		{recAlert("ReplicatorVoterDown", map[string]string{"cluster": "a", "severity": "critical"})},
		{recAlert("ReplicatorNoLeader", map[string]string{"cluster": "a", "severity": "critical"}),
			recAlert("ReplicatorLinkStalled", with(lb, "peer", "a", "state", "stalled", "severity", "critical")),
			recAlert("ReplicatorSendFailures", with(lb, "peer", "a", "severity", "warning"))},
	}
	var tests []ptExpr
	for p, want := range expected {
		e := ptExpr{Expr: `ALERTS{alertstate="firing"}`, EvalTime: recPhaseEnd(p), ExpSamples: []ptSample{}}
		for _, l := range want {
			e.ExpSamples = append(e.ExpSamples, ptSample{Labels: l, Value: 1})
		}
		tests = append(tests, e)
	}

	// The dashboard: every query answers with a number at the end of the
	// healthy phase and of P3; links not healthy counts a's leader's link
	// to b (followers' links are "follower") and nothing else; the seconds
	// since last contact stay under a minute on healthy links.
	panels := recDashboardQueries(t)
	var notHealthy, contact string
	for _, p := range panels {
		switch {
		case strings.HasPrefix(p.title, "Links not healthy"):
			notHealthy = p.expr
		case strings.HasPrefix(p.title, "Seconds since last contact"):
			contact = p.expr
		}
	}
	if notHealthy == "" || contact == "" {
		t.Fatalf("the dashboard has no \"Links not healthy\" or \"Seconds since last contact\" panel")
	}
	for _, p := range []int{0, 3} {
		for _, q := range panels {
			// NaN (a quantile of no observations) is no answer: x == x
			// drops it. The comment names the panel in promtool's output.
			tests = append(tests, ptExpr{Expr: fmt.Sprintf("# panel %q\nclamp_max(count((%s) == (%s)), 1)", q.title, q.expr, q.expr),
				EvalTime: recPhaseEnd(p), ExpSamples: []ptSample{{Labels: "{}", Value: 1}}})
		}
	}
	// Links not healthy per cluster: none while healthy and once healed
	// (P0, P3; a's followers included); a's leader's link to b while b is
	// down (P1; b exports nothing then).
	for _, c := range []struct {
		phase int
		a, b  float64 // -1: no series
	}{{0, 0, 0}, {1, 1, -1}, {3, 0, 0}} {
		e := ptExpr{Expr: notHealthy, EvalTime: recPhaseEnd(c.phase), ExpSamples: []ptSample{{Labels: `{cluster="a"}`, Value: c.a}}}
		if c.b >= 0 {
			e.ExpSamples = append(e.ExpSamples, ptSample{Labels: `{cluster="b"}`, Value: c.b})
		}
		tests = append(tests, e)
	}
	tests = append(tests, ptExpr{Expr: fmt.Sprintf("(%s) >= 60", contact), EvalTime: recPhaseEnd(0), ExpSamples: []ptSample{}})

	file := ptFile{RuleFiles: []string{rulesPath}, EvaluationInterval: "15s", Tests: []ptGroup{{
		Interval: "15s", InputSeries: rec.series(), PromqlExprTest: tests}}}
	y, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	testFile := filepath.Join(keep, "recorded_test.yaml")
	if err := os.WriteFile(testFile, y, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d input series, %d expression tests, %d KiB", len(file.Tests[0].InputSeries), len(tests), len(y)/1024)
	ran := time.Now()
	out, err := exec.Command(promtool, "test", "rules", testFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", testFile, err, out)
	}
	t.Logf("promtool test rules passed in %s; the test took %s", time.Since(ran).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// Rule time: each phase is 10 minutes of 40 samples, 15 s apart; a
// phase's end is its last sample.
const (
	recSteps    = 40
	recStepSecs = 15
)

func recPhaseEnd(p int) string {
	return fmt.Sprintf("%ds", (p*recSteps+recSteps-1)*recStepSecs)
}

// recAlert is the ALERTS series of a firing alert with these labels.
func recAlert(name string, labels map[string]string) string {
	l := map[string]string{"alertname": name, "alertstate": "firing"}
	for k, v := range labels {
		l[k] = v
	}
	return "ALERTS" + recLabels(l)
}

func recLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	sb.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(k + "=" + strconv.Quote(l[k]))
	}
	sb.WriteByte('}')
	return sb.String()
}

// promtool's unit-test file.
type (
	ptFile struct {
		RuleFiles          []string  `yaml:"rule_files"`
		EvaluationInterval string    `yaml:"evaluation_interval"`
		Tests              []ptGroup `yaml:"tests"`
	}
	ptGroup struct {
		Interval       string     `yaml:"interval"`
		InputSeries    []ptSeries `yaml:"input_series"`
		PromqlExprTest []ptExpr   `yaml:"promql_expr_test"`
	}
	ptSeries struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	ptExpr struct {
		Expr       string     `yaml:"expr"`
		EvalTime   string     `yaml:"eval_time"`
		ExpSamples []ptSample `yaml:"exp_samples"`
	}
	ptSample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
)

type recPanel struct{ title, expr string }

// recDashboardQueries are every panel's target expressions (rows' panels
// included).
func recDashboardQueries(t *testing.T) []recPanel {
	t.Helper()
	b, err := os.ReadFile("grafana/replicator.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []recPanel
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			for _, tg := range p.Targets {
				if tg.Expr != "" {
					// The board's variables at "All" (their allValue).
					expr := strings.NewReplacer(`"$cluster"`, `".*"`, `"$peer"`, `".*"`).Replace(tg.Expr)
					out = append(out, recPanel{p.Title, expr})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

// ---- the nodes

var recPorts = struct {
	sync.Mutex
	handed map[int]bool
}{handed: map[int]bool{}}

// recAddr is a loopback address whose port was free a moment ago and was
// not handed out before by this test binary.
func recAddr(t *testing.T) string {
	t.Helper()
	recPorts.Lock()
	defer recPorts.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !recPorts.handed[port] {
			recPorts.handed[port] = true
			return fmt.Sprintf("127.0.0.1:%d", port)
		}
	}
}

// recNode is one `replicator serve` child process, which can be killed and
// started again with the same arguments.
type recNode struct {
	t                        *testing.T
	bin, name, log           string
	addr, raft, gossip, resp string
	args                     []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func newRecNode(t *testing.T, bin, logDir, name, cluster string) *recNode {
	n := &recNode{t: t, bin: bin, name: name, log: filepath.Join(logDir, name+".log"),
		addr: recAddr(t), raft: recAddr(t), gossip: recAddr(t), resp: recAddr(t)}
	// The Redis door and a comparison every two seconds, so that the
	// dashboard's rows for them have series to show.
	n.args = []string{"serve", "--cluster-id", cluster, "--listen", n.addr, "--log-level", "debug",
		"--resp-listen", n.resp, "--antientropy-interval", "2s"}
	t.Cleanup(n.kill)
	return n
}

func (n *recNode) url() string { return "http://" + n.addr }

func (n *recNode) start() {
	n.t.Helper()
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(n.bin, n.args...)
	cmd.Stdout, cmd.Stderr = f, f
	// The node dies with the test binary, even one killed before its
	// cleanups ran.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
}

// kill sends SIGKILL and waits for the process to be reaped.
func (n *recNode) kill() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

func (n *recNode) waitHealthy() {
	n.t.Helper()
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := recClient.Get(n.url() + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			deadline = time.Time{}
		case <-time.After(50 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(n.log)
	n.t.Fatalf("%s did not become healthy; log:\n%s", n.name, recLastLines(string(b), 30))
}

func recLastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var recClient = &http.Client{Timeout: 3 * time.Second}

func recGetJSON(url string, v any) error {
	resp, err := recClient.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func recLocalCluster(n *recNode) (api.ClusterReport, error) {
	var c api.ClusterReport
	err := recGetJSON(n.url()+"/admin/cluster?local=1", &c)
	return c, err
}

// recLinkOf is n's link to peer, from /admin/peers (the zero link when it
// cannot be read).
func recLinkOf(n *recNode, peer string) (l struct {
	State         string
	EntriesBehind uint64
}) {
	var r api.PeersReport
	if err := recGetJSON(n.url()+"/admin/peers", &r); err != nil {
		l.State = err.Error()
		return l
	}
	for _, s := range r.Links {
		if s.Peer == peer {
			l.State, l.EntriesBehind = s.State, s.EntriesBehind
			return l
		}
	}
	l.State = "missing"
	return l
}

func recPut(base, key string) (int, string) {
	req, _ := http.NewRequest(http.MethodPut, base+"/v1/kv/"+key, strings.NewReader("v"))
	resp, err := recClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func recPost(url string) (int, string) {
	resp, err := recClient.Post(url, "application/json", nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// recUntil polls cond every 100 ms until it holds, or fails the test with
// what it last said.
func recUntil(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	why := ""
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = cond(); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("waiting for %s: not reached in %s: %s", what, d, why)
}

// recWriter puts a key on its cluster every interval until stopped.
type recWriter struct {
	stopped           chan struct{}
	done              chan struct{}
	ok, refused, errs atomic.Int64
}

func startRecWriter(t *testing.T, cluster, url string, every time.Duration) *recWriter {
	w := &recWriter{stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-w.stopped:
				return
			case <-tick.C:
			}
			switch code, body := recPut(url, fmt.Sprintf("%s-%05d", cluster, i)); {
			case code == http.StatusOK:
				w.ok.Add(1)
			case code == http.StatusServiceUnavailable && strings.Contains(body, `"saturated"`):
				w.refused.Add(1)
			default:
				w.errs.Add(1)
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *recWriter) stop() {
	select {
	case <-w.stopped:
	default:
		close(w.stopped)
	}
	<-w.done
}

// ---- scrapes

type recKind byte

const (
	recGauge recKind = iota
	recCounter
	recTimestamp // a gauge holding a Unix time
)

type recSample struct {
	name   string
	labels map[string]string
	value  float64
	kind   recKind
}

type recScrape struct {
	at      time.Time
	text    string
	samples map[string]recSample // by name and labels
}

// value is the sample of name whose labels include kv (pairs).
func (s *recScrape) value(name string, kv ...string) (float64, bool) {
	if s == nil {
		return 0, false
	}
Samples:
	for _, smp := range s.samples {
		if smp.name != name {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if smp.labels[kv[i]] != kv[i+1] {
				continue Samples
			}
		}
		return smp.value, true
	}
	return 0, false
}

func recScrapeNode(t *testing.T, n *recNode) *recScrape {
	t.Helper()
	at := time.Now()
	resp, err := recClient.Get(n.url() + "/metrics")
	if err != nil {
		t.Fatalf("scraping %s: %v", n.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %d %v", n.name, resp.StatusCode, err)
	}
	s, err := recParse(string(b))
	if err != nil {
		t.Fatalf("scraping %s: %v", n.name, err)
	}
	s.at = at
	return s
}

var recTimestampName = regexp.MustCompile(`_(timestamp|time)_seconds$`)

// recParse reads Prometheus's text format as the node writes it
// (no sample timestamps).
func recParse(text string) (*recScrape, error) {
	s := &recScrape{text: text, samples: map[string]recSample{}}
	types := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			if f := strings.Fields(line); len(f) == 4 && f[1] == "TYPE" {
				types[f[2]] = f[3]
			}
			continue
		}
		smp := recSample{labels: map[string]string{}}
		i := strings.IndexAny(line, "{ ")
		if i < 0 {
			return nil, fmt.Errorf("bad line %q", line)
		}
		smp.name, line = line[:i], line[i:]
		if line[0] == '{' {
			line = line[1:]
			for {
				line = strings.TrimLeft(line, ", ")
				if strings.HasPrefix(line, "}") {
					line = line[1:]
					break
				}
				eq := strings.Index(line, "=\"")
				if eq < 0 {
					return nil, fmt.Errorf("bad labels in %q", line)
				}
				key := line[:eq]
				line = line[eq+2:]
				var val strings.Builder
				j := 0
				for ; j < len(line) && line[j] != '"'; j++ {
					if line[j] == '\\' && j+1 < len(line) {
						j++
						if line[j] == 'n' {
							val.WriteByte('\n')
							continue
						}
					}
					val.WriteByte(line[j])
				}
				if j == len(line) {
					return nil, fmt.Errorf("unterminated label value in %q", line)
				}
				smp.labels[key] = val.String()
				line = line[j+1:]
			}
		}
		f := strings.Fields(line)
		if len(f) < 1 {
			return nil, fmt.Errorf("no value for %s", smp.name)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", smp.name, err)
		}
		smp.value = v
		smp.kind = recKindOf(smp.name, types)
		s.samples[smp.name+recLabels(smp.labels)] = smp
	}
	return s, sc.Err()
}

func recKindOf(name string, types map[string]string) recKind {
	if typ, ok := types[name]; ok {
		switch {
		case typ == "counter":
			return recCounter
		case recTimestampName.MatchString(name):
			return recTimestamp
		}
		return recGauge
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if fam, ok := strings.CutSuffix(name, suffix); ok {
			if typ := types[fam]; typ == "histogram" || typ == "summary" {
				return recCounter
			}
		}
	}
	return recGauge
}

// ---- the recording

// recRound is one scrape of every live node, by node name.
type recRound map[string]*recScrape

type recPhase struct {
	name          string
	nodes         map[string]string // node name -> instance
	first, second recRound
}

type recording struct {
	t      *testing.T
	dir    string
	phases []*recPhase
}

func recScrapeAll(t *testing.T, nodes []*recNode) recRound {
	r := recRound{}
	for _, n := range nodes {
		r[n.name] = recScrapeNode(t, n)
	}
	return r
}

// phase scrapes nodes at once, then again at least gap later once ready
// holds of a round of scrapes (polled every 200 ms, for 40 s at most).
func (rec *recording) phase(name string, nodes []*recNode, gap time.Duration, ready func(recRound) (bool, string)) {
	t := rec.t
	t.Helper()
	p := &recPhase{name: name, nodes: map[string]string{}}
	for _, n := range nodes {
		p.nodes[n.name] = n.addr
	}
	rec.phases = append(rec.phases, p)
	p.first = recScrapeAll(t, nodes)
	time.Sleep(gap)
	deadline := time.Now().Add(40 * time.Second)
	why := ""
	for {
		r := recScrapeAll(t, nodes)
		var ok bool
		if ok, why = ready(r); ok {
			p.second = r
			break
		}
		if time.Now().After(deadline) {
			p.second = r // kept for a look
			rec.save()
			t.Fatalf("%s: not reached in 40 s: %s", name, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rec.save()
	t.Logf("%s: scraped %s apart", name, p.second[nodes[0].name].at.Sub(p.first[nodes[0].name].at).Round(time.Millisecond))
}

// grew says whether node's counter in s is above its value in the current
// phase's first scrape.
func (rec *recording) grew(node string, s *recScrape, name string, kv ...string) bool {
	p := rec.phases[len(rec.phases)-1]
	before, _ := p.first[node].value(name, kv...)
	now, ok := s.value(name, kv...)
	return ok && now > before
}

// save writes every scrape so far to the kept directory.
func (rec *recording) save() {
	for i, p := range rec.phases {
		for j, r := range []recRound{p.first, p.second} {
			for node, s := range r {
				os.WriteFile(filepath.Join(rec.dir, fmt.Sprintf("P%d-%s-scrape%d.txt", i, node, j+1)), []byte(s.text), 0o644)
			}
		}
	}
}

// summary logs what each phase recorded of a's leader and of b.
func (rec *recording) summary(leader, b *recNode) {
	for _, p := range rec.phases {
		var parts []string
		for _, n := range []*recNode{leader, b} {
			s1, s2 := p.first[n.name], p.second[n.name]
			if s2 == nil {
				continue
			}
			dt := s2.at.Sub(s1.at).Seconds()
			peer := map[string]string{"a": "b", "b": "a"}[n.name[:1]]
			f1, _ := s1.value("replicator_peer_send_failures_total", "peer", peer)
			f2, _ := s2.value("replicator_peer_send_failures_total", "peer", peer)
			w1, _ := s1.value("replicator_local_writes_total")
			w2, _ := s2.value("replicator_local_writes_total")
			entries, _ := s2.value("replicator_backlog_entries", "peer", peer)
			state := ""
			for _, st := range []string{"healthy", "lagging", "stalled", "follower", "unknown"} {
				if v, _ := s2.value("replicator_link_state", "peer", peer, "state", st); v == 1 {
					state = st
				}
			}
			sat, _ := s2.value("replicator_saturation_state")
			part := fmt.Sprintf("%s: link %s, %g send failures in %.1f s (%.2f/s), %.1f writes/s, backlog %g, saturation %g",
				n.name, state, f2-f1, dt, (f2-f1)/dt, (w2-w1)/dt, entries, sat)
			if v, ok := s2.value("replicator_backlog_seconds_to_limit", "peer", peer); ok {
				part += fmt.Sprintf(", %.1f s to limit", v)
			}
			if v, ok := s2.value("replicator_raft_voters_live"); ok {
				part += fmt.Sprintf(", voters live %g", v)
			}
			parts = append(parts, part)
		}
		rec.t.Logf("%s: %s", p.name, strings.Join(parts, "; "))
	}
}

// series turns the recording into promtool's input series: every sample
// scraped, labelled job="replicator" and instance, over every phase.
func (rec *recording) series() []ptSeries {
	type id struct {
		node, key string
	}
	seen := map[id]recSample{}
	var order []id
	for _, p := range rec.phases {
		for _, r := range []recRound{p.first, p.second} {
			for node, s := range r {
				for key, smp := range s.samples {
					k := id{node, key}
					if _, ok := seen[k]; !ok {
						seen[k] = smp
						order = append(order, k)
					}
				}
			}
		}
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].node != order[j].node {
			return order[i].node < order[j].node
		}
		return order[i].key < order[j].key
	})
	var out []ptSeries
	for _, k := range order {
		smp := seen[k]
		var instance string
		for _, p := range rec.phases {
			if a, ok := p.nodes[k.node]; ok {
				instance = a
			}
		}
		labels := map[string]string{"job": "replicator", "instance": instance}
		for l, v := range smp.labels {
			labels[l] = v
		}
		var vals []string
		var cur float64
		started := false
		for i, p := range rec.phases {
			s1, s2 := p.first[k.node], p.second[k.node]
			var v2 recValue
			if s2 != nil {
				if x, ok := s2.samples[k.key]; ok {
					v2 = recValue{x.value, true}
				}
			}
			if !v2.ok || math.IsNaN(v2.v) || math.IsInf(v2.v, 0) {
				vals = append(vals, fmt.Sprintf("_x%d", recSteps))
				continue
			}
			var v1 recValue
			if x, ok := s1.samples[k.key]; ok {
				v1 = recValue{x.value, true}
			}
			dt := s2.at.Sub(s1.at).Seconds()
			switch smp.kind {
			case recGauge:
				vals = append(vals, fmt.Sprintf("%sx%d", recNum(v2.v), recSteps-1))
			case recTimestamp:
				if v2.v == 0 {
					vals = append(vals, fmt.Sprintf("0x%d", recSteps-1))
					continue
				}
				// Its age at the second scrape, at the phase's start;
				// then it moves with rule time if it moved between the
				// scrapes (contact goes on), or stays (it does not).
				age := float64(s2.at.UnixNano())/1e9 - v2.v
				start := float64(i*recSteps*recStepSecs) - age
				slope := 0.0
				if v1.ok && v2.v > v1.v {
					slope = recStepSecs
				}
				vals = append(vals, fmt.Sprintf("%s+%sx%d", recNum(start), recNum(slope), recSteps-1))
			case recCounter:
				rate := 0.0
				if v1.ok && dt > 0 {
					rate = (v2.v - v1.v) / dt
					if rate < 0 { // a reset between the scrapes
						rate = v2.v / dt
					}
				}
				step := rate * recStepSecs
				first := v1.v
				if !v1.ok {
					first = v2.v
				}
				if started {
					first = cur + step
				}
				started = true
				cur = first + step*(recSteps-1)
				vals = append(vals, fmt.Sprintf("%s+%sx%d", recNum(first), recNum(step), recSteps-1))
			}
		}
		out = append(out, ptSeries{Series: smp.name + recLabels(labels), Values: strings.Join(vals, " ")})
	}
	return out
}

type recValue struct {
	v  float64
	ok bool
}

func recNum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// chromium finds Debian's headless Chromium. .ci/run installs it and sets
// REPLICATOR_REQUIRE_BROWSER=1, so there a missing browser fails the test;
// elsewhere the test says how to install it and skips.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("REPLICATOR_REQUIRE_BROWSER") != "" {
		t.Fatal("no chromium on PATH (apt-get install chromium)")
	}
	t.Skip("no chromium on PATH: apt-get install chromium (CI installs it and runs this test)")
	return ""
}

// dumpDOM loads url in headless Chromium, lets its scripts run for a few
// seconds of virtual time (fetches included), and returns the DOM.
func dumpDOM(t *testing.T, browser, url string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000", "--dump-dom", url)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}

// TestDashboardRendersLiveData: the embedded page, in a real browser, shows
// the peer rows and the node's saturation state from the admin endpoints.
func TestDashboardRendersLiveData(t *testing.T) {
	browser := chromium(t)
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		o.WaterMarks = api.WaterMarks{HighEntries: 20, LowEntries: 5}
		o.AdmissionWait = -1
	}, "a", "b", "c")
	a, b := m.Nodes["a"], m.Nodes["b"]
	// A conflict: a and b write x while cut off from each other.
	m.Cut("a", "b", true)
	m.Cut("b", "a", true)
	b.Put(context.Background(), "x", []byte("from-b"))
	a.Put(context.Background(), "x", []byte("from-a"))
	m.Cut("a", "b", false)
	m.Cut("b", "a", false)
	m.Settle()
	m.Cut("a", "c", true)
	for i := 0; i < 25; i++ {
		a.Put(context.Background(), fmt.Sprint("k", i), []byte("v"))
	}
	m.Settle() // b has everything; c is cut off
	if a.Saturation().State != api.StateSaturated {
		t.Fatalf("state %s", a.Saturation().State)
	}
	dom := dumpDOM(t, browser, a.URL()+"/admin/ui")
	for _, want := range []string{
		`<span id="cluster">a</span>`,
		`<tr data-peer="b">`, `<tr data-peer="c">`,
		`<span id="sat" class="state saturated">saturated</span>`,
		`<span id="cause">(c: backlog of`,
		`<tr data-peer="c"><td>c</td><td><span class="state lagging">lagging</span></td>`,
		`<button data-action="pause" data-peer="c">Pause</button>`,
		`<polyline data-peer="c"`,
		`<tr data-conflict="`, `<td>x</td>`, `<td>from-b</td>`, `<button data-conflict="`,
	} {
		if !strings.Contains(dom, want) {
			t.Fatalf("the rendered dashboard lacks %q:\n%s", want, dom)
		}
	}
}

// TestDashboardHeadersAndHistory: the page cannot be framed by another site
// (its buttons would be clickjacked), and /admin/history answers with the
// node's samples and refuses a malformed ?after.
func TestDashboardHeadersAndHistory(t *testing.T) {
	o := opts(t.TempDir())
	o.HistoryInterval = 10 * time.Millisecond
	o.HistorySpan = time.Second
	n := nodetest.Start(t, o)
	resp, err := http.Get(n.URL() + "/admin/ui")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Frame-Options") != "DENY" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Fatalf("the dashboard may be framed: %v", resp.Header)
	}
	// Scripts and styles of its own only (issue 25), and no sniffing.
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'sha256-", "style-src 'sha256-", "connect-src 'self'"} {
		if !strings.Contains(csp, want) {
			t.Fatalf("the dashboard's CSP lacks %q: %s", want, csp)
		}
	}
	if strings.Contains(csp, "unsafe") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("the dashboard's headers: %v", resp.Header)
	}
	for len(n.History(time.Time{}).Samples) < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	var rep api.HistoryReport
	resp, err = http.Get(n.URL() + "/admin/history")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if err != nil || len(rep.Samples) < 3 || rep.IntervalSeconds != 0.01 || rep.SpanSeconds != 1 {
		t.Fatalf("history: %v %+v", err, rep)
	}
	last := rep.Samples[len(rep.Samples)-1].Time.UnixMilli()
	resp, err = http.Get(n.URL() + fmt.Sprintf("/admin/history?after=%d", last))
	if err != nil {
		t.Fatal(err)
	}
	rep = api.HistoryReport{}
	json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	for _, s := range rep.Samples {
		if s.Time.UnixMilli() <= last {
			t.Fatalf("?after=%d returned a sample at %d", last, s.Time.UnixMilli())
		}
	}
	resp, err = http.Get(n.URL() + "/admin/history?after=yesterday")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("?after=yesterday: %d, want 400", resp.StatusCode)
	}
}

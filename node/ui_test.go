package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
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
	m := newTestMesh(t, nil, func(o *Options) {
		o.WaterMarks = WaterMarks{HighEntries: 20, LowEntries: 5}
		o.AdmissionWait = -1
	}, "a", "b", "c")
	a := m.nodes["a"]
	m.cut("a", "c", true)
	for i := 0; i < 25; i++ {
		a.Put(context.Background(), fmt.Sprint("k", i), []byte("v"))
	}
	m.settle() // b has everything; c is cut off
	if a.Saturation().State != StateSaturated {
		t.Fatalf("state %s", a.Saturation().State)
	}
	dom := dumpDOM(t, browser, a.URL()+"/admin/ui")
	for _, want := range []string{
		`<span id="cluster">a</span>`,
		`<tr data-peer="b">`, `<tr data-peer="c">`,
		`<span id="sat" class="state saturated">saturated</span>`,
		`<span id="cause">(c: backlog of`,
		`<tr data-peer="c"><td>c</td><td><span class="state lagging">lagging</span></td><td class="n">0</td>`,
		"<polyline",
	} {
		if !strings.Contains(dom, want) {
			t.Fatalf("the rendered dashboard lacks %q:\n%s", want, dom)
		}
	}
}

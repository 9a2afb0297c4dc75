package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/client"
	"github.com/replicator/replicator/internal/nodetest"
	"github.com/replicator/replicator/node"
)

// click clicks a button of a table the page rebuilds every second: a node
// replaced between chromedp's query and its click ("Could not find node":
// nothing was clicked) is looked up and clicked again.
func click(ctx context.Context, sel chromedp.CSS) error {
	var err error
	for range 5 {
		if err = chromedp.Do(ctx, chromedp.Click(sel)); err == nil || !strings.Contains(err.Error(), "Could not find node") {
			return err
		}
	}
	return err
}

// browse starts headless Chromium under chromedp and returns a context that
// drives one tab. Dialogs (the re-seed confirmation) are accepted.
func browse(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()), chromedp.Flag("disable-quic", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	// The page waits while a dialog is open; this goroutine accepts it. It
	// ends when the tab's context is cancelled (the iterator stops).
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return ctx
}

// TestDashboardActionsInBrowser drives the dashboard in headless Chromium:
// the chart shows the node's own history the moment the page loads, the
// Pause and Resume buttons change the link (behind the API token, which the
// page takes from its #fragment), Re-seed asks first and then runs, and
// another origin's page cannot do the same.
func TestDashboardActionsInBrowser(t *testing.T) {
	ctx := browse(t)
	const token = "dashboard-token"
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		o.HistoryInterval = 50 * time.Millisecond
		o.HistorySpan = time.Minute
		o.LinkLagging, o.LinkStalled = 300*time.Millisecond, time.Second
		if o.ClusterID == "a" {
			o.APIToken = token
		}
	}, "a", "b")
	a, b := m.Nodes["a"], m.Nodes["b"]
	m.Cut("a", "b", true)
	for i := 0; i < 40; i++ {
		if _, err := a.Put(context.Background(), fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // a rising backlog across samples
	}
	// The node samples whether or not a page is open: wait for history, not
	// for a clock.
	for len(a.History(time.Time{}).Samples) < 15 {
		time.Sleep(20 * time.Millisecond)
	}

	// The history is an admin document: without the token, nothing.
	if resp, err := http.Get(a.URL() + "/admin/history"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/admin/history without the token: %d, want 401", resp.StatusCode)
	}

	row := `#peers tr[data-peer="b"]`
	css := func(s string) chromedp.CSS { return chromedp.CSS(row + " " + s) }
	if err := chromedp.Do(ctx,
		chromedp.Navigate(a.URL()+"/admin/ui#token="+token),
		chromedp.WaitVisible(css(`button[data-action="pause"]`)),
	); err != nil {
		t.Fatal(err)
	}
	// The link cut: stalled, and the page's verdict says so as replicator
	// status does (issue 49: it read green with a peer down).
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#verdict.degraded`))); err != nil {
		t.Fatalf("a stalled link's verdict: %v", err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		why, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("why")))
		return strings.Contains(why, "link to b stalled"), fmt.Sprintf("the verdict says %q", why)
	})
	// The link column says what crosses the link: every key here.
	if linkCell, err := chromedp.Run(ctx, chromedp.Text(css(`td:nth-child(13)`))); err != nil || !strings.Contains(linkCell, "every key") {
		t.Fatalf("the link column of b: %q (%v)", linkCell, err)
	}
	points, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(`polyline[data-peer="b"]`), "points"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(points.Value)); n < 15 {
		t.Fatalf("right after the page loaded, the chart of b has %d points (%q); the node's history holds more", n, points.Value)
	}
	// The legend is built under the page's CSP (no style attributes): b's
	// mark is there, in b's line's colour.
	legend, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#legend`)))
	if err != nil {
		t.Fatal(err)
	}
	color, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#legend span").style.color`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(legend, "■") || !strings.Contains(legend, "b") || color == "" {
		t.Fatalf("the chart's legend: %q, colour %q", legend, color)
	}

	// Pause: the button posts, the link pauses, the row says so.
	if err := click(ctx, css(`button[data-action="pause"]`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(css(`button[data-action="resume"]`)),
		chromedp.WaitVisible(css(`span.state.paused`)),
	); err != nil {
		t.Fatal(err)
	}
	// Read in one evaluation: the page rebuilds the table every second, and
	// a badge looked up before a rebuild reads empty once replaced.
	badge, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('`+row+` span.state').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if !nodetest.Link(t, a, "b").Paused || badge != "paused" {
		t.Fatalf("after Pause: link paused %v, badge %q", nodetest.Link(t, a, "b").Paused, badge)
	}

	// Resume, with the path open again: the link drains and reads healthy.
	m.Cut("a", "b", false)
	if err := click(ctx, css(`button[data-action="resume"]`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(css(`button[data-action="pause"]`)),
		chromedp.WaitVisible(css(`span.state.healthy`)),
	); err != nil {
		t.Fatal(err)
	}
	if l := nodetest.Link(t, a, "b"); l.Paused || l.EntriesBehind != 0 {
		t.Fatalf("after Resume: paused %v, %d behind", l.Paused, l.EntriesBehind)
	}

	// Re-seed: confirmed in the dialog, then it runs to the end.
	before := nodetest.Link(t, a, "b").Reseed.Runs
	if err := click(ctx, css(`button[data-action="reseed"]`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.Search(`//div[@id="action"][contains(., "reseed b: link")]`)),
	); err != nil {
		t.Fatal(err)
	}
	said, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("action")))
	deadline := time.Now().Add(30 * time.Second)
	for l := nodetest.Link(t, a, "b"); l.Reseed.Runs == before || l.Reseed.Running; l = nodetest.Link(t, a, "b") {
		if time.Now().After(deadline) {
			t.Fatalf("the re-seed the dashboard asked for did not run: %+v (page said %q)", l.Reseed, said)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Compare: the two trees agree (the link drained), the page says so,
	// and the agreement column shows the last comparison.
	if err := click(ctx, css(`button[data-action="diff"]`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.Search(`//div[@id="action"][contains(., "compared with b: equal")]`)),
		chromedp.WaitVisible(chromedp.Search(`//tr[@data-peer="b"]/td[14][contains(., "equal")]`)),
	); err != nil {
		said, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("action")))
		t.Fatalf("after Compare: %v (page said %q)", err, said)
	}

	// Another origin's page (here a different port: same site, other
	// origin) submits a form to b's pause action. b has no token; the
	// cross-origin protection alone must refuse it.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form id="f" method="POST" action="%s/admin/peers/a/pause"></form>
<script>document.getElementById("f").submit()</script>`, b.URL())
	}))
	defer evil.Close()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(evil.URL),
		chromedp.WaitVisible(chromedp.Search(`//body[contains(., "cross_origin")]`)),
	); err != nil {
		t.Fatal(err)
	}
	body, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
	if nodetest.Link(t, b, "a").Paused {
		t.Fatalf("a cross-origin form paused b's link (the node answered %q)", body)
	}
}

// TestDashboardShowsTheNodes: the dashboard of a follower of a cluster of
// three lists the three nodes, which one leads, and each one's applied
// index.
func TestDashboardShowsTheNodes(t *testing.T) {
	ctx := browse(t)
	c := nodetest.NewCluster(t, "a", 3, nil)
	leader := c.Leader()
	f := c.Follower()
	if _, err := c.Client(f).Put(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(c.Nodes[f].URL()+"/admin/ui"),
		chromedp.WaitVisible(chromedp.CSS(`#nodes tr[data-node="`+leader+`"] span.state`)),
	); err != nil {
		t.Fatal(err)
	}
	// The page refreshes itself; on a loaded machine an election may move
	// the lead meanwhile (300 ms timeouts): what it shows must agree with
	// the cluster within a few refreshes.
	nodetest.WaitFor(t, 15*time.Second, func() (bool, string) {
		leader = c.Leader()
		for _, name := range c.Names {
			state, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#nodes tr[data-node="`+name+`"] span.state`)))
			if err != nil {
				return false, fmt.Sprintf("node %s not shown: %v", name, err)
			}
			want := "follower"
			if name == leader {
				want = "leader"
			}
			if state != want {
				return false, fmt.Sprintf("node %s shown as %q, want %q", name, state, want)
			}
		}
		mode, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("mode")))
		return strings.Contains(mode, "leader "+leader), fmt.Sprintf("the cluster line says %q", mode)
	})
	// A follower of a cluster with no peers (the README's recipe) has no
	// links: the page shows none, and no error.
	var peers struct {
		Links []any `json:"links"`
	}
	raw, err := httpGetJSON(c.Nodes[f].URL()+"/admin/peers", &peers)
	if err != nil || !strings.Contains(raw, `"links":[]`) {
		t.Fatalf("a follower's links: %s %v (want [])", raw, err)
	}
	time.Sleep(1500 * time.Millisecond) // the page refreshes every second
	if msg, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("error"))); msg != "" {
		t.Fatalf("the follower's dashboard says %q", msg)
	}
	// Every voter answering, no links: the verdict reads healthy.
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#verdict.healthy`))); err != nil {
		t.Fatalf("a healthy cluster's verdict: %v", err)
	}
	// The third node stops: it shows unreachable, with its applied index
	// and lag unknown ("-"), not #0 and 0.
	var other string
	for _, name := range c.Names {
		if name != leader && name != f {
			other = name
		}
	}
	c.Stop(other)
	row := `#nodes tr[data-node="` + other + `"]`
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(row+` span.state.unreachable`))); err != nil {
		t.Fatalf("a stopped node is not shown unreachable: %v", err)
	}
	// A voter missing: degraded, saying so, as replicator status does.
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#verdict.degraded`))); err != nil {
		t.Fatalf("a missing voter's verdict: %v", err)
	}
	if why, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("why"))); !strings.Contains(why, "2 of 3 voters answering") {
		t.Fatalf("a missing voter's verdict says %q", why)
	}
	applied, err1 := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(row+` td:nth-child(7)`)))
	lag, err2 := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(row+` td:nth-child(8)`)))
	if applied != "-" || lag != "-" {
		t.Fatalf("the stopped node's applied %q and lag %q, want - and - (%v %v)", applied, lag, err1, err2)
	}
}

// httpGetJSON decodes the JSON document at url into v and returns it raw.
func httpGetJSON(url string, v any) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	return string(b), json.Unmarshal(b, v)
}

// TestDashboardSaturation: a saturated node's dashboard says what the state
// means, counts the refused writes, shows the limits and draws the
// high-water mark on the chart; its Detach button, confirmed, lets writes
// in again.
func TestDashboardSaturation(t *testing.T) {
	ctx := browse(t)
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		o.HistoryInterval = 50 * time.Millisecond
		o.HistorySpan = time.Minute
		if o.ClusterID == "a" {
			o.WaterMarks = api.WaterMarks{HighEntries: 20, LowEntries: 10}
			o.AdmissionWait = -1
		}
	}, "a", "b")
	a := m.Nodes["a"]
	m.Cut("a", "b", true)
	refused := 0
	for i := 0; i < 60 && refused < 3; i++ {
		if _, err := a.Put(context.Background(), fmt.Sprint("k", i), []byte("v")); err != nil {
			refused++
		}
		time.Sleep(5 * time.Millisecond)
	}
	if refused < 3 {
		t.Fatal("a node whose peer is cut took 60 writes over a high-water mark of 20")
	}
	for len(a.History(time.Time{}).Samples) < 5 {
		time.Sleep(20 * time.Millisecond)
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(a.URL()+"/admin/ui"),
		chromedp.WaitVisible(chromedp.CSS(`#sat.saturated`)),
		chromedp.WaitVisible(chromedp.CSS(`#limit`)),
	); err != nil {
		t.Fatal(err)
	}
	// The page opens with the verdict replicator status prints.
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#verdict.degraded`))); err != nil {
		t.Fatal(err)
	}
	// The link to b turns lagging on its own clock: the page, refreshed
	// every second, says so once it did.
	nodetest.WaitFor(t, 20*time.Second, func() (bool, string) {
		why, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("why")))
		return strings.Contains(why, "saturation saturated") && strings.Contains(why, "link to b"), fmt.Sprintf("a saturated node's verdict says %q", why)
	})
	note, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("satnote")))
	refusals, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("refusals")))
	limits, _ := chromedp.Run(ctx, chromedp.Text(chromedp.ID("limits")))
	if !strings.Contains(note, "refused") || !strings.Contains(refusals, fmt.Sprintf("%d (outbound backlog)", refused)) || !strings.HasPrefix(limits, "20/10 writes") {
		t.Fatalf("a saturated node's page: note %q, refusals %q (want %d), limits %q", note, refusals, refused, limits)
	}
	// Detach, confirmed in the dialog: the link stops holding the WAL, the
	// node is healthy and takes writes again.
	row := `#peers tr[data-peer="b"]`
	if err := click(ctx, chromedp.CSS(row+` button[data-action="detach"]`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#sat.healthy`))); err != nil {
		t.Fatal(err)
	}
	if l := nodetest.Link(t, a, "b"); !l.Detached {
		t.Fatalf("after Detach: %+v", l)
	}
	if _, err := a.Put(context.Background(), "after-detach", []byte("v")); err != nil {
		t.Fatalf("a write after Detach: %v", err)
	}
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#peers button[data-action=detach]").length`)); n != 0 {
		t.Fatalf("a detached link still offers Detach (%d buttons)", n)
	}
	// A detached link is not watched: no forecast, in the report or in
	// /metrics (a stale "reached" would keep ReplicatorSaturationComing
	// firing for as long as the peer stays away).
	time.Sleep(300 * time.Millisecond) // a few saturation rounds
	for _, p := range a.WALReport().Peers {
		if p.SecondsToLimit != nil {
			t.Fatalf("the detached link's forecast: %+v", p.Forecast)
		}
	}
	resp, err := http.Get(a.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "replicator_backlog_seconds_to_limit{") {
		t.Fatalf("/metrics holds a forecast for a detached link:\n%s", body)
	}
}

// TestDashboardAddsAndRemovesAPeer (issue 49): the dashboard adds a peer
// cluster at run time (the form posts to /admin/peers with the page's
// token: the log records it, its secret sealed) and removes it (its row's
// Remove button, after a confirmation): the link appears, then goes.
func TestDashboardAddsAndRemovesAPeer(t *testing.T) {
	ctx := browse(t)
	const token = "dashboard-token"
	key := make([]byte, 32)
	m := nodetest.NewMesh(t, nil, func(o *node.Options) {
		o.SecretsKey = key
		if o.ClusterID == "a" {
			o.APIToken = token
		}
	}, "a", "b")
	a := m.Nodes["a"]
	if err := chromedp.Do(ctx,
		chromedp.Navigate(a.URL()+"/admin/ui#token="+token),
		chromedp.WaitVisible(chromedp.CSS(`#peers tr[data-peer="b"]`)),
		chromedp.SendKeys(chromedp.ID("addname"), "c"),
		chromedp.SendKeys(chromedp.ID("addurl"), "http://127.0.0.1:9"),
		chromedp.SendKeys(chromedp.ID("addsecret"), "dashboard-added-secret-0123"),
	); err != nil {
		t.Fatal(err)
	}
	if err := click(ctx, chromedp.CSS(`#addpeer`)); err != nil {
		t.Fatal(err)
	}
	row := `#peers tr[data-peer="c"]`
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(row+` button[data-action="remove"]`))); err != nil {
		t.Fatalf("the added peer's row: %v", err)
	}
	var raw []byte
	if _, err := client.New(a.URL(), &client.Options{Token: token}).Do(context.Background(), http.MethodGet, "/admin/peers/c", nil, nil, &raw); err != nil ||
		!strings.Contains(string(raw), `"secret":true`) || strings.Contains(string(raw), "dashboard-added-secret") {
		t.Fatalf("the log's peer c: %s %v", raw, err)
	}
	if err := click(ctx, chromedp.CSS(row+` button[data-action="remove"]`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitNotPresent(chromedp.CSS(row))); err != nil {
		t.Fatalf("the removed peer's row stays: %v", err)
	}
	nodetest.WaitFor(t, 10*time.Second, func() (bool, string) {
		for _, l := range a.PeerStatus() {
			if l.Peer == "c" {
				return false, "a still links to c"
			}
		}
		return true, ""
	})
}

// Package deploy_test checks the packaging under deploy/: the alert rules and
// the Grafana dashboard name only metrics a real node exports, the systemd
// unit verifies and its user is created, the Kubernetes manifests decode
// strictly into the API's own types and the node takes their arguments, and
// the Dockerfile builds a minimal non-root image.
package deploy_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/replicator/replicator/client"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/replicator/replicator/node"
)

// required says whether a check whose tool is missing fails (CI installs the
// tools and sets it) or is reported and skipped (a developer's machine).
func required(t *testing.T, tool string) {
	t.Helper()
	if os.Getenv("REPLICATOR_REQUIRE_TOOLS") != "" {
		t.Fatalf("%s is not installed, and REPLICATOR_REQUIRE_TOOLS is set", tool)
	}
	t.Skipf("%s is not installed here (CI installs it)", tool)
}

// scrape runs two real nodes replicating to each other (and one link to a
// peer that never answers), and returns the /metrics text of the first.
func scrape(t *testing.T) string {
	t.Helper()
	quiet := func() *node.Options { return &node.Options{Listen: "127.0.0.1:0"} }
	lns := map[string]net.Listener{}
	for _, n := range []string{"a", "b", "ghost"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[n] = ln
	}
	ghost := "http://" + lns["ghost"].Addr().String()
	lns["ghost"].Close()
	var nodes []*node.Node
	for _, name := range []string{"a", "b"} {
		o := quiet()
		o.ClusterID, o.DataDir, o.Listener = name, t.TempDir(), lns[name]
		other := map[string]string{"a": "b", "b": "a"}[name]
		o.Peers = []node.Peer{{Name: other, URL: "http://" + lns[other].Addr().String(), Secret: "s"}}
		if name == "a" {
			o.Peers = append(o.Peers, node.Peer{Name: "ghost", URL: ghost, Secret: "s"})
		}
		o.Logger = discard()
		n, err := node.Open(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if _, err := b.Put(ctx, fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Increment(ctx, "c", 1); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if d, _ := a.Digest(); d.Keys >= 20 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A comparison with b fills the anti-entropy series (the leader exports
	// them once it compared); asked as an operator does, over the API.
	if _, err := client.New(a.URL(), nil).Diff(ctx, "b", false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a saturation round fills the gauges
	resp, err := http.Get(a.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// The replicator binary, built once for the tests that run it, in a
// directory any user may enter (TestUnreadableSecretFile runs it as another).
var binary struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// replicatorBinary builds ./cmd/replicator as the image builds it (static):
// in the product's module (the repository root), since deploy/ is a module
// of its own whose go.sum lists only what its tests import.
func replicatorBinary(t *testing.T) string {
	t.Helper()
	binary.once.Do(func() {
		if binary.dir, binary.err = os.MkdirTemp("", "replicator-deploy-"); binary.err != nil {
			return
		}
		if binary.err = os.Chmod(binary.dir, 0o755); binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "replicator")
		build := exec.Command("go", "build", "-o", binary.path, "./cmd/replicator")
		build.Dir = ".."
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			binary.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatal(binary.err)
	}
	return binary.path
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var metricName = regexp.MustCompile(`\breplicator_[a-z0-9_]+`)

// recordedOnly are metrics a node exports only in some states (a backlog
// growing toward a high-water mark), which the two-node scrape below cannot
// show: TestRecordedSeries (recorded_test.go) records them from real nodes
// and tests the rules and queries that name them.
var recordedOnly = map[string]bool{"replicator_backlog_seconds_to_limit": true,
	// exported with TLS only: e2e TestMutualTLSLinks reads it from a live node
	"replicator_tls_certificate_expiry_timestamp_seconds": true,
	// the Redis door's, exported when it is on (the recorded nodes run it)
	"replicator_resp_connections": true, "replicator_resp_commands_total": true}

// checkNames fails for every replicator_* metric named in exprs that the
// node does not export (histograms by their series names).
func checkNames(t *testing.T, what string, exprs []string, metrics string) {
	t.Helper()
	if len(exprs) == 0 {
		t.Fatalf("%s: no expressions found", what)
	}
	n := 0
	for _, e := range exprs {
		for _, name := range metricName.FindAllString(e, -1) {
			n++
			if recordedOnly[name] { // checked by TestRecordedSeries
				continue
			}
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `[{ ]`).MatchString(metrics) {
				t.Errorf("%s names %s, which a real node does not export", what, name)
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s names no replicator metric", what)
	}
}

func TestAlertRules(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(ops), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[githubAnchor(h)] = true
		}
	}
	var exprs []string
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			alerts[r.Alert] = true
			// Alertmanager routes match these two; each rule links its
			// section of the runbook.
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, sev)
			}
			const runbook = "https://github.com/replicator/replicator/blob/main/docs/OPERATIONS.md#"
			url := r.Annotations["runbook_url"]
			if a, ok := strings.CutPrefix(url, runbook); !ok || !anchors[a] {
				t.Errorf("%s: runbook_url %q is no section of docs/OPERATIONS.md", r.Alert, url)
			}
		}
	}
	for _, want := range []string{"ReplicatorLinkStalled", "ReplicatorBacklogOld", "ReplicatorSaturated", "ReplicatorPeerDetached",
		"ReplicatorDeadLetters", "ReplicatorClockSkew", "ReplicatorNoLeader", "ReplicatorVoterDown", "ReplicatorSendFailures",
		"ReplicatorDivergentKeys", "ReplicatorAntiEntropyStale"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}
	checkNames(t, "alerts.yaml", exprs, scrape(t))
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		required(t, "promtool")
	}
	if out, err := exec.Command(promtool, "check", "rules", "prometheus/alerts.yaml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	// What each rule does: it fires when it should and stays quiet
	// otherwise (prometheus/alerts_test.yaml).
	test := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	test.Dir = "prometheus"
	if out, err := test.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/replicator.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["cluster"] || !vars["peer"] {
		t.Errorf("the board's variables are %v: want cluster and peer", vars)
	}
	var exprs []string
	rows := map[string]bool{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			rows[p.Title] = true
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
			// Every query keeps to the clusters chosen.
			if !strings.Contains(tg.Expr, `cluster=~"$cluster"`) {
				t.Errorf("panel %q: %s does not keep to $cluster", p.Title, tg.Expr)
			}
		}
	}
	for _, want := range []string{"Links: bandwidth and throttling", "Compression", "Anti-entropy", "Redis door (RESP)"} {
		if !rows[want] {
			t.Errorf("no row %q", want)
		}
	}
	checkNames(t, "replicator.json", exprs, scrape(t))
}

// unitValue is the last value a unit file assigns to key ("" if none).
func unitValue(unit []byte, key string) string {
	v := ""
	for _, line := range strings.Split(string(unit), "\n") {
		if val, ok := strings.CutPrefix(strings.TrimSpace(line), key+"="); ok {
			v = val
		}
	}
	return v
}

var sysusersUser = regexp.MustCompile(`(?m)^u\s+(\S+)\s+(\S+)\s+"([^"]*)"\s+(\S+)`)

func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("systemd/replicator.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NoNewPrivileges=yes", "ProtectSystem=strict", "StateDirectory=replicator", "User=replicator"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	// The node bounds its own stop at --shutdown-timeout (30 s); systemd
	// waits that plus 15 s before it kills.
	if v := unitValue(unit, "TimeoutStopSec"); v != "45" {
		t.Errorf("TimeoutStopSec=%q, want 45 (--shutdown-timeout's 30 s and a 15 s margin)", v)
	}
	// The user the unit names exists once the sysusers.d file shipped
	// beside it is installed (or the unit makes its own with DynamicUser).
	user, group := unitValue(unit, "User"), unitValue(unit, "Group")
	if group == "" {
		group = user
	}
	if unitValue(unit, "DynamicUser") != "yes" {
		users, err := os.ReadFile("systemd/replicator.sysusers")
		if err != nil {
			t.Fatalf("the unit runs as %q: it needs DynamicUser=yes or a sysusers.d file that creates the user: %v", user, err)
		}
		m := sysusersUser.FindSubmatch(users)
		if m == nil || string(m[1]) != user || group != user {
			t.Fatalf("replicator.sysusers does not create user %q and group %q (a u line makes a group of the user's name): %s", user, group, users)
		}
		if home := "/var/lib/" + unitValue(unit, "StateDirectory"); string(m[4]) != home {
			t.Errorf("the user's home is %s, want the unit's state directory %s", m[4], home)
		}
		if !bytes.Contains(unit, []byte("systemd-sysusers")) {
			t.Error("the unit's comments do not say how to install the sysusers.d file")
		}
		if sysusers, err := exec.LookPath("systemd-sysusers"); err != nil {
			required(t, "systemd-sysusers")
		} else {
			root := t.TempDir()
			os.Mkdir(filepath.Join(root, "etc"), 0o755)
			cmd := exec.Command(sysusers, "--root", root, "-")
			cmd.Stdin = bytes.NewReader(users)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("systemd-sysusers: %v\n%s", err, out)
			}
			passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
			groups, _ := os.ReadFile(filepath.Join(root, "etc/group"))
			if !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(user)+`:x:\d+:\d+:[^:]*:/var/lib/`).Match(passwd) ||
				!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(group)+`:x:\d+:`).Match(groups) {
				t.Errorf("systemd-sysusers made no user %q and group %q:\n%s%s", user, group, passwd, groups)
			}
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		required(t, "systemd-analyze")
	}
	bin := replicatorBinary(t)
	dir := t.TempDir()
	local := filepath.Join(dir, "replicator.service")
	os.WriteFile(local, bytes.ReplaceAll(unit, []byte("/usr/local/bin/replicator"), []byte(bin)), 0o644)
	if out, err := exec.Command(analyze, "verify", local).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func TestKubernetesManifests(t *testing.T) {
	b, err := os.ReadFile("kubernetes/replicator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	var sts appsv1.StatefulSet
	var netpol networkingv1.NetworkPolicy
	var pdb policyv1.PodDisruptionBudget
	var secret corev1.Secret
	var cert certificate
	var monitorTLS struct{ scheme, caSecret, caKey, serverName string }
	services := map[string]corev1.Service{}
	for i, doc := range strings.Split(string(b), "\n---\n") {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		kinds[head.Kind]++
		// Strictly into the API's own types: an unknown or misspelt field
		// fails, as the API server's schema would.
		switch head.Kind {
		case "StatefulSet":
			err = sigsyaml.UnmarshalStrict([]byte(doc), &sts)
		case "Service":
			var s corev1.Service
			err = sigsyaml.UnmarshalStrict([]byte(doc), &s)
			services[s.Name] = s
		case "Secret":
			err = sigsyaml.UnmarshalStrict([]byte(doc), &secret)
		case "Certificate":
			err = sigsyaml.UnmarshalStrict([]byte(doc), &cert)
		case "PodDisruptionBudget":
			err = sigsyaml.UnmarshalStrict([]byte(doc), &pdb)
		case "ServiceMonitor":
			var m struct {
				APIVersion string     `json:"apiVersion"`
				Kind       string     `json:"kind"`
				Metadata   objectMeta `json:"metadata"`
				Spec       struct {
					Selector struct {
						MatchLabels map[string]string `json:"matchLabels"`
					} `json:"selector"`
					Endpoints []struct {
						Port      string `json:"port"`
						Path      string `json:"path"`
						Interval  string `json:"interval"`
						Scheme    string `json:"scheme"`
						TLSConfig struct {
							CA struct {
								Secret struct {
									Name string `json:"name"`
									Key  string `json:"key"`
								} `json:"secret"`
							} `json:"ca"`
							ServerName string `json:"serverName"`
						} `json:"tlsConfig"`
						BearerTokenSecret struct {
							Name string `json:"name"`
							Key  string `json:"key"`
						} `json:"bearerTokenSecret"`
					} `json:"endpoints"`
				} `json:"spec"`
			}
			err = sigsyaml.UnmarshalStrict([]byte(doc), &m)
			if err == nil && (len(m.Spec.Endpoints) != 1 || m.Spec.Endpoints[0].Path != "/metrics") {
				err = fmt.Errorf("ServiceMonitor does not scrape /metrics: %+v", m.Spec)
			}
			if err == nil && m.Spec.Endpoints[0].BearerTokenSecret.Key != "api.token" {
				err = fmt.Errorf("ServiceMonitor scrapes without the API token: %+v", m.Spec.Endpoints[0])
			}
			if err == nil {
				e := m.Spec.Endpoints[0]
				monitorTLS.scheme, monitorTLS.serverName = e.Scheme, e.TLSConfig.ServerName
				monitorTLS.caSecret, monitorTLS.caKey = e.TLSConfig.CA.Secret.Name, e.TLSConfig.CA.Secret.Key
			}
		case "NetworkPolicy":
			err = sigsyaml.UnmarshalStrict([]byte(doc), &netpol)
		default:
			err = fmt.Errorf("unexpected kind %q", head.Kind)
		}
		if err != nil {
			t.Fatalf("document %d (%s): %v", i, head.Kind, err)
		}
	}
	for _, k := range []string{"StatefulSet", "Secret", "ServiceMonitor", "NetworkPolicy", "PodDisruptionBudget", "Certificate"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s, want 1", kinds[k], k)
		}
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Fatal("liveness must ask /healthz (a saturated node is alive) and readiness /readyz")
	}
	if peer, ok := services["replicator-peer"]; !ok || !peer.Spec.PublishNotReadyAddresses {
		t.Error("the peer Service must publish not-ready addresses: a saturated node still takes replication")
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Error("a cluster of three nodes survives the loss of one")
	}
	if sc := sts.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the pod must run as non-root")
	}
	// Issue 25, finding 6: any pod could write and join or remove nodes;
	// no seccomp profile; the service-account token was mounted.
	ps := sts.Spec.Template.Spec
	if ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the pod must run with the runtime's seccomp profile")
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("the pod must not mount a service-account token (replicator never calls the Kubernetes API)")
	}
	// The NetworkPolicy: raft and gossip from the set's pods only; the API
	// and the peer listener open (with their credentials).
	from := map[int32]bool{} // port -> open to any source
	for _, rule := range netpol.Spec.Ingress {
		sameSet := len(rule.From) == 1 && rule.From[0].PodSelector != nil &&
			rule.From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] == "replicator" && rule.From[0].NamespaceSelector == nil
		if len(rule.From) > 0 && !sameSet {
			t.Errorf("an ingress rule from other sources: %+v", rule.From)
		}
		for _, p := range rule.Ports {
			from[p.Port.IntVal] = from[p.Port.IntVal] || len(rule.From) == 0
		}
	}
	if netpol.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "replicator" {
		t.Error("the NetworkPolicy must select the set's pods")
	}
	for port, open := range map[int32]bool{7400: true, 7401: true, 7500: false, 7600: false} {
		if got, ok := from[port]; !ok || got != open {
			t.Errorf("port %d: listed %v, open to any source %v; want open=%v", port, ok, got, open)
		}
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--peer-secret-file", "--data=/data", "--peer-listen", "--node-id=$(POD_NAME)", "--raft-listen",
		"--bootstrap-expect=3", "--gossip-key-file", "--advertise-api", "--raft-advertise", "--api-token-file", "--admin-token-file", "--raft-key-file",
		"--tls-cert=", "--tls-key=", "--tls-client-ca="} {
		if !strings.Contains(args, want) {
			t.Errorf("the node's arguments lack %s: %s", want, args)
		}
	}
	selects := func(what string, sel map[string]string) {
		t.Helper()
		if len(sel) == 0 {
			t.Errorf("%s selects nothing", what)
		}
		for k, v := range sel {
			if sts.Spec.Template.Labels[k] != v {
				t.Errorf("%s selects %s=%s, which the set's pods do not carry (%v)", what, k, v, sts.Spec.Template.Labels)
			}
		}
	}

	// One node down at a time: a raft group of three keeps its quorum
	// with one down.
	if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.String() != "1" || pdb.Spec.MinAvailable != nil {
		t.Errorf("the PodDisruptionBudget must allow exactly one pod down (maxUnavailable: 1): %+v", pdb.Spec)
	}
	if pdb.Spec.Selector == nil || len(pdb.Spec.Selector.MatchExpressions) > 0 {
		t.Errorf("the PodDisruptionBudget's selector: %+v", pdb.Spec.Selector)
	} else {
		selects("the PodDisruptionBudget", pdb.Spec.Selector.MatchLabels)
	}

	// One node per machine: two on one host lose the quorum with it.
	var anti []corev1.PodAffinityTerm
	if a := ps.Affinity; a != nil && a.PodAntiAffinity != nil {
		anti = append(anti, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			anti = append(anti, w.PodAffinityTerm)
		}
	}
	onHost := false
	for _, term := range anti {
		if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil {
			onHost = true
			selects("the pod anti-affinity", term.LabelSelector.MatchLabels)
		}
	}
	if !onHost {
		t.Errorf("no pod anti-affinity on kubernetes.io/hostname: %+v", ps.Affinity)
	}

	// The node bounds its own stop at --shutdown-timeout (30 s); the
	// kubelet waits that plus 15 s, as systemd does.
	if g := ps.TerminationGracePeriodSeconds; g == nil || *g != 45 {
		got := "unset"
		if g != nil {
			got = fmt.Sprint(*g)
		}
		t.Errorf("terminationGracePeriodSeconds %s, want 45 (--shutdown-timeout's 30 s and a 15 s margin)", got)
	}

	// A version tag (or a digest), never latest, never none.
	if !pinnedImage(c.Image) {
		t.Errorf("image %q: pin a version tag (not latest) or a digest", c.Image)
	}

	// Peer traffic over TLS: https URLs, the certificate's files on a
	// mount of the Certificate's secret, probes and the scrape over HTTPS
	// (--tls-cert serves every listener).
	flags := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(a, "="); ok {
			flags[k] = v
		}
	}
	for _, f := range []string{"--peer", "--advertise-replicate", "--advertise-api"} {
		u := flags[f]
		if f == "--peer" {
			_, u, _ = strings.Cut(u, "=")
		}
		if !strings.HasPrefix(u, "https://") {
			t.Errorf("%s=%s: peer traffic must be https", f, flags[f])
		}
	}
	mounts := map[string]string{} // mount path -> secret
	volumes := map[string]string{}
	for _, v := range ps.Volumes {
		if v.Secret != nil {
			volumes[v.Name] = v.Secret.SecretName
		}
	}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = volumes[m.Name]
	}
	if cert.Spec.SecretName == "" {
		t.Fatal("the Certificate names no secret")
	}
	for f, file := range map[string]string{"--tls-cert": "tls.crt", "--tls-key": "tls.key", "--tls-client-ca": "ca.crt"} {
		if p := flags[f]; filepath.Base(p) != file || mounts[filepath.Dir(p)] != cert.Spec.SecretName {
			t.Errorf("%s=%s: want %s of a mount of the Certificate's secret %s (mounts: %v)", f, p, file, cert.Spec.SecretName, mounts)
		}
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("a probe of %s over %q: the API serves TLS", p.HTTPGet.Path, p.HTTPGet.Scheme)
		}
	}
	if monitorTLS.scheme != "https" || monitorTLS.caSecret != cert.Spec.SecretName || monitorTLS.caKey != "ca.crt" {
		t.Errorf("the ServiceMonitor must scrape over https, checked against the Certificate's ca.crt: %+v", monitorTLS)
	}
	// The certificate names the cluster as peers read it, serves and
	// dials (both usages), and covers every name it is reached at.
	clusterID := flags["--cluster-id"]
	if !slices.Contains(cert.Spec.URIs, "replicator://cluster/"+clusterID) {
		t.Errorf("the Certificate's URIs %v do not name cluster %s (--peer-san-mode uri)", cert.Spec.URIs, clusterID)
	}
	for _, u := range []string{"server auth", "client auth"} {
		if !slices.Contains(cert.Spec.Usages, u) {
			t.Errorf("the Certificate's usages %v lack %s", cert.Spec.Usages, u)
		}
	}
	if cert.Spec.IssuerRef.Name == "" {
		t.Error("the Certificate names no issuer")
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = map[string]string{"metadata.name": sts.Name + "-0", "status.podIP": "10.0.0.7",
				"metadata.namespace": clusterID}[e.ValueFrom.FieldRef.FieldPath]
		}
	}
	expand := func(s string) string {
		for k, v := range env {
			s = strings.ReplaceAll(s, "$("+k+")", v)
		}
		return s
	}
	for _, host := range []string{urlHost(expand(flags["--advertise-api"])), urlHost(expand(flags["--advertise-replicate"])),
		services["replicator-peer"].Name + "." + clusterID + ".svc.cluster.local", monitorTLS.serverName} {
		if !certCovers(cert.Spec.DNSNames, host) {
			t.Errorf("the Certificate's names %v do not cover %s", cert.Spec.DNSNames, host)
		}
	}

	// The node takes these arguments: `serve --print-config` runs them
	// through the same checks as a start, with the mounts as directories
	// and the pod's fields filled in.
	root := t.TempDir()
	var nodeArgs []string
	for _, a := range c.Args {
		a = expand(a)
		for _, m := range c.VolumeMounts {
			local := filepath.Join(root, m.Name)
			os.MkdirAll(local, 0o700)
			a = strings.ReplaceAll(a, "="+m.MountPath, "="+local)
		}
		if strings.Contains(a, "$(") {
			t.Fatalf("argument %s names a variable the pod does not set", a)
		}
		nodeArgs = append(nodeArgs, a)
	}
	for name, v := range secret.StringData {
		if strings.HasSuffix(name, ".key") {
			v = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)) // the placeholder is no key
		}
		os.WriteFile(filepath.Join(root, "peers", name), []byte(v+"\n"), 0o600)
	}
	cmd := exec.Command(replicatorBinary(t), append(nodeArgs, "--print-config")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no REPLICATOR_* of this machine's
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("replicator %s --print-config: %v\n%s", strings.Join(nodeArgs, " "), err, out)
	}
}

// objectMeta is the metadata the manifest's custom resources carry.
type objectMeta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

// certificate is cert-manager's Certificate, in the fields the manifest
// uses (strict decoding refuses any other).
type certificate struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		SecretName string `json:"secretName"`
		IssuerRef  struct {
			Kind  string `json:"kind"`
			Name  string `json:"name"`
			Group string `json:"group"`
		} `json:"issuerRef"`
		Duration    string `json:"duration"`
		RenewBefore string `json:"renewBefore"`
		PrivateKey  struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		Usages   []string `json:"usages"`
		URIs     []string `json:"uris"`
		DNSNames []string `json:"dnsNames"`
	} `json:"spec"`
}

// pinnedImage reports an image reference with a version tag other than
// latest, or a digest.
func pinnedImage(ref string) bool {
	if strings.Contains(ref, "@sha256:") {
		return true
	}
	name := ref[strings.LastIndex(ref, "/")+1:]
	_, tag, ok := strings.Cut(name, ":")
	return ok && tag != "" && tag != "latest"
}

func urlHost(u string) string {
	h := strings.TrimPrefix(strings.TrimPrefix(u, "https://"), "http://")
	h, _, _ = strings.Cut(h, "/")
	if i := strings.LastIndex(h, ":"); i >= 0 {
		h = h[:i]
	}
	return h
}

// certCovers reports whether a certificate's DNS names cover host (a
// wildcard stands for one label).
func certCovers(names []string, host string) bool {
	for _, n := range names {
		if n == host {
			return true
		}
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			if _, tail, ok := strings.Cut(host, "."); ok && tail == rest {
				return true
			}
		}
	}
	return false
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// spaces to dashes, punctuation but dashes and underscores dropped.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Package deploy_test checks the packaging under deploy/: the alert rules and
// the Grafana dashboard name only metrics a real node exports, the systemd
// unit verifies, the Kubernetes manifests decode strictly into the API's own
// types, and the Dockerfile builds a minimal non-root image.
package deploy_test

import (
	"bytes"
	"context"
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
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
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
	time.Sleep(300 * time.Millisecond) // a saturation round fills the gauges
	resp, err := http.Get(a.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var metricName = regexp.MustCompile(`\breplicator_[a-z0-9_]+`)

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
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			alerts[r.Alert] = true
		}
	}
	for _, want := range []string{"ReplicatorLinkStalled", "ReplicatorBacklogOld", "ReplicatorSaturated", "ReplicatorPeerDetached",
		"ReplicatorDeadLetters", "ReplicatorClockSkew", "ReplicatorNoLeader", "ReplicatorVoterDown", "ReplicatorSendFailures"} {
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
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	checkNames(t, "replicator.json", exprs, scrape(t))
}

func TestSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		required(t, "systemd-analyze")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "replicator")
	// Built in the product's module (the repository root): deploy/ is a
	// module of its own, whose go.sum lists only what its tests import.
	build := exec.Command("go", "build", "-o", bin, "./cmd/replicator")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as the image builds it: one compile for both tests
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	unit, err := os.ReadFile("systemd/replicator.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NoNewPrivileges=yes", "ProtectSystem=strict", "StateDirectory=replicator", "User=replicator"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("the unit lacks %s", want)
		}
	}
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
			var s corev1.Secret
			err = sigsyaml.UnmarshalStrict([]byte(doc), &s)
		case "ServiceMonitor":
			var m struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name   string            `json:"name"`
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec struct {
					Selector struct {
						MatchLabels map[string]string `json:"matchLabels"`
					} `json:"selector"`
					Endpoints []struct {
						Port              string `json:"port"`
						Path              string `json:"path"`
						Interval          string `json:"interval"`
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
		case "NetworkPolicy":
			err = sigsyaml.UnmarshalStrict([]byte(doc), &netpol)
		default:
			err = fmt.Errorf("unexpected kind %q", head.Kind)
		}
		if err != nil {
			t.Fatalf("document %d (%s): %v", i, head.Kind, err)
		}
	}
	for _, k := range []string{"StatefulSet", "Secret", "ServiceMonitor", "NetworkPolicy"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s, want 1", kinds[k], k)
		}
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("liveness must ask /healthz (a saturated node is alive) and readiness /readyz")
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
		"--bootstrap-expect=3", "--gossip-key-file", "--advertise-api", "--raft-advertise", "--api-token-file", "--admin-token-file", "--raft-key-file"} {
		if !strings.Contains(args, want) {
			t.Errorf("the node's arguments lack %s: %s", want, args)
		}
	}
}

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// cli runs the built binary with args (and env added); it returns stdout,
// stderr and the exit code.
func cli(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), env...)
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

// TestCLIHabits: every sub-command takes its flags after its arguments, -h
// exits 0 with the flags and their defaults (test flags hidden), completion
// scripts generate, -o json prints a document on every read command, a typo
// prints one line with a suggestion, $REPLICATOR_ADDR is honoured and an
// error names its command once.
func TestCLIHabits(t *testing.T) {
	p := newProc(t, "a", "a", "--peer", "b=http://127.0.0.1:1", "--peer-secret", "b=secret-b")
	p.startReady()
	dir := t.TempDir()
	batch := filepath.Join(dir, "batch.json")
	os.WriteFile(batch, []byte(`{"ops":[{"op":"set","key":"b1","value":"x"},{"op":"set","key":"b2","value":"y"}]}`), 0o644)
	load := filepath.Join(dir, "load.ndjson")
	os.WriteFile(load, []byte("{\"key\":\"l1\",\"value\":\"1\"}\n{\"key\":\"l2\",\"value\":\"2\"}\n"), 0o644)

	addr := []string{"--addr", p.url}
	// Each command with its flags after the arguments; json is what -o json
	// must decode to (nil: the command prints no document).
	steps := []struct {
		args []string
		json []string // fields the JSON document must hold
	}{
		{[]string{"put", "k1", "v1"}, []string{"key", "version", "origin", "replayed"}},
		{[]string{"put", "k2", "v2", "--idempotency-key", "idem-1"}, []string{"key", "version"}},
		{[]string{"get", "k1"}, []string{"key", "value", "version", "origin"}},
		{[]string{"scan", "--prefix", "k"}, []string{"items"}},
		{[]string{"status", "--idempotency-key", "idem-1"}, []string{"key", "found", "status"}}, // the first name of outcome
		{[]string{"outcome", "--idempotency-key", "idem-1"}, []string{"key", "found", "status"}},
		{[]string{"status"}, []string{"verdict", "ready", "cluster", "links", "saturation", "voters_live"}},
		{[]string{"incr", "c", "5"}, []string{"key", "value", "version"}},
		{[]string{"counter", "c"}, []string{"key", "value", "totals"}},
		{[]string{"batch", batch}, []string{"version", "ops"}},
		{[]string{"load", load}, []string{"loaded", "bytes", "seconds"}},
		{[]string{"del", "k2"}, []string{"key", "version"}},
		{[]string{"del-range", "--prefix", "l"}, []string{"version"}},
		{[]string{"peers"}, []string{"cluster", "links"}},
		{[]string{"digest"}, []string{"digest", "keys"}},
		{[]string{"admin", "wal"}, []string{"stream", "bytes", "peers", "saturation"}},
		{[]string{"admin", "origin"}, []string{"cluster", "version"}},
		{[]string{"admin", "pause", "b"}, []string{"peer", "state", "paused"}},
		{[]string{"admin", "resume", "b"}, []string{"peer", "state"}},
		{[]string{"version"}, []string{"version", "go_version"}},
		{[]string{"healthcheck"}, nil},
	}
	for _, s := range steps {
		args := append(append([]string(nil), s.args...), addr...)
		if s.args[0] == "version" {
			args = s.args
		}
		out, errOut, code := cli(t, nil, args...)
		// status exits 6 once it finds the link to b (nobody at :1)
		// degraded; that is checked below.
		if code != 0 && !(s.args[0] == "status" && len(s.args) == 1 && code == 6) {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		if s.json == nil {
			continue
		}
		// again, for scripts, with -o json after the arguments
		if s.args[0] == "put" || s.args[0] == "incr" || s.args[0] == "batch" || s.args[0] == "load" || strings.HasPrefix(s.args[0], "del") {
			continue // a write is not repeated; its JSON is checked below
		}
		out, errOut, code = cli(t, nil, append(args, "-o", "json")...)
		if s.args[0] == "status" && len(s.args) == 1 && code == 6 {
			code = 0 // degraded (b is down): still one status document
		}
		checkJSON(t, args, out, errOut, code, s.json)
	}
	// With its one peer unreachable, status says so first and exits 6
	// (issue 49: it read HEALTHY, ready yes, exit 0).
	eventually(t, 30*time.Second, func() (bool, string) {
		out, errOut, code := cli(t, nil, append([]string{"status"}, addr...)...)
		return code == 6 && strings.HasPrefix(out, "DEGRADED: ") && strings.Contains(out, "link to b"), fmt.Sprintf("exit %d\n%s%s", code, out, errOut)
	})
	// writes print their answer as JSON too
	for _, w := range []struct {
		args []string
		json []string
	}{
		{[]string{"put", "j1", "v", "-o", "json"}, []string{"key", "version", "origin", "replayed"}},
		{[]string{"incr", "c", "2", "--output", "json"}, []string{"key", "value"}},
		{[]string{"batch", batch, "--json"}, []string{"version", "ops"}},
		{[]string{"del", "j1", "-o", "json"}, []string{"key", "version"}},
		{[]string{"load", load, "-o", "json"}, []string{"loaded", "keys_per_second"}},
	} {
		out, errOut, code := cli(t, nil, append(w.args, addr...)...)
		checkJSON(t, w.args, out, errOut, code, w.json)
	}
	// the values landed: the counter is exactly 5 + 2
	out, _, _ := cli(t, nil, "counter", "c", "-o", "json", "--addr", p.url)
	var c struct{ Value int64 }
	if json.Unmarshal([]byte(out), &c); c.Value != 7 {
		t.Fatalf("counter after incr 5 and 2: %s", out)
	}
	// flags before the admin sub-command, -o with a separate value
	if out, errOut, code := cli(t, nil, "admin", "-o", "json", "--addr", p.url, "digest"); code != 0 || !json.Valid([]byte(out)) {
		t.Fatalf("admin -o json --addr URL digest: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := cli(t, nil, "digest", "-o", "yaml", "--addr", p.url); code == 0 || !strings.Contains(errOut, "want table or json") {
		t.Fatalf("-o yaml: exit %d %s", code, errOut)
	}

	// $REPLICATOR_ADDR stands in for --addr.
	if out, errOut, code := cli(t, []string{"REPLICATOR_ADDR=" + p.url}, "get", "k1"); code != 0 || strings.TrimSpace(out) != "v1" {
		t.Fatalf("get with $REPLICATOR_ADDR: %d %q %s", code, out, errOut)
	}
	// An error names its command once; not found is exit 3.
	_, errOut, code := cli(t, nil, "get", "missing", "--addr", p.url)
	if code != 3 || !strings.HasPrefix(errOut, "replicator get: ") || strings.Count(errOut, "replicator") != 1 {
		t.Fatalf("get missing: exit %d %q", code, errOut)
	}
	// A typo: one line and a suggestion, exit 2.
	_, errOut, code = cli(t, nil, "pu", "k", "v")
	if code != 2 || !strings.Contains(errOut, "Did you mean") || !strings.Contains(errOut, "put") || strings.Count(errOut, "\n") > 6 {
		t.Fatalf("typo: exit %d %q", code, errOut)
	}

	// -h exits 0 everywhere, to stdout, with defaults; no test flags.
	for _, sub := range []string{"serve", "demo", "bench", "put", "get", "del", "scan", "status", "outcome", "del-range", "incr",
		"counter", "batch", "load", "peers", "digest", "admin", "healthcheck", "version"} {
		out, errOut, code := cli(t, nil, sub, "-h")
		if code != 0 || out == "" {
			t.Fatalf("%s -h: exit %d\n%s%s", sub, code, out, errOut)
		}
		if strings.Contains(out, "--test-") {
			t.Fatalf("%s -h lists test flags:\n%s", sub, out)
		}
		if sub == "serve" && !strings.Contains(out, "(default 127.0.0.1:7400)") {
			t.Fatalf("serve -h shows no defaults:\n%s", out)
		}
	}
	// Completion completes flags too, each command its own.
	for args, want := range map[string]string{"put k --idem": "--idempotency-key", "admin reseed --w": "--wait", "serve --peer-sec": "--peer-secret-file",
		"status -": "--timeout"} {
		out, errOut, code := cli(t, nil, append([]string{"__complete"}, strings.Fields(args)...)...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("__complete %s: exit %d, want %s in\n%s%s", args, code, want, out, errOut)
		}
	}
	if out, _, _ := cli(t, nil, "__complete", "get", "k", "--w"); strings.Contains(out, "--wait") {
		t.Fatalf("get completes reseed's --wait:\n%s", out)
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, errOut, code := cli(t, nil, "completion", sh)
		if code != 0 || !strings.Contains(out, "replicator") || len(out) < 500 {
			t.Fatalf("completion %s: exit %d, %d bytes %s", sh, code, len(out), errOut)
		}
	}
}

func checkJSON(t *testing.T, args []string, out, errOut string, code int, fields []string) {
	t.Helper()
	if code != 0 {
		t.Fatalf("%v -o json: exit %d\n%s%s", args, code, out, errOut)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v -o json is not a JSON document: %v\n%s", args, err, out)
	}
	for _, f := range fields {
		if _, ok := doc[f]; !ok {
			t.Fatalf("%v -o json lacks %q:\n%s", args, f, out)
		}
	}
}

// TestServeConfigLayers: the YAML file sets, $REPLICATOR_* overrides it, a
// flag overrides both; --print-config shows the result with the defaults
// and derived marks filled in and secrets redacted, and what it prints is a
// config serve takes back (the redacted secret excepted, refused by name).
func TestServeConfigLayers(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "c.yaml")
	os.WriteFile(conf, []byte(`cluster_id: east
data: `+filepath.Join(dir, "data")+`
listen: 127.0.0.1:7001
max_key_bytes: 111
max_value_bytes: 2222
wal_high_water_entries: 1000
peers:
  west:
    url: http://127.0.0.1:7002
    secret: hunter2
`), 0o644)
	env := []string{"REPLICATOR_LISTEN=127.0.0.1:7003", "REPLICATOR_MAX_KEY_BYTES=333",
		"REPLICATOR_PEER=south=http://127.0.0.1:7004", "REPLICATOR_PEER_SECRET=south=s0uth-secret"}
	out, errOut, code := cli(t, env, "serve", "--config", conf, "--print-config", "--max-key-bytes", "444")
	if code != 0 {
		t.Fatalf("--print-config: exit %d %s", code, errOut)
	}
	var got map[string]any
	if err := yaml.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--print-config is not YAML: %v\n%s", err, out)
	}
	for k, want := range map[string]any{
		"cluster_id":            "east",
		"listen":                "127.0.0.1:7003", // env over file
		"max_key_bytes":         444,              // flag over env over file
		"max_value_bytes":       2222,             // file over default
		"tombstone_retention":   "24h",            // default shown
		"wal_low_water_entries": 500,              // derived: half the high mark
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	if strings.Contains(out, "hunter2") || strings.Contains(out, "s0uth-secret") || strings.Count(out, "<redacted>") != 2 {
		t.Fatalf("secrets not redacted:\n%s", out)
	}
	if _, ok := got["test_clock_offset"]; ok {
		t.Errorf("test settings printed:\n%s", out)
	}
	// Fed back: every key is one --config knows; the placeholder secret is
	// refused by name rather than used.
	printed := filepath.Join(dir, "printed.yaml")
	os.WriteFile(printed, []byte(out), 0o644)
	_, errOut, code = cli(t, nil, "serve", "--config", printed, "--print-config")
	if code == 0 || !strings.Contains(errOut, "placeholder") || strings.Contains(errOut, "field") {
		t.Fatalf("printed config fed back: exit %d %s", code, errOut)
	}
	noSecrets := strings.ReplaceAll(out, "secret: <redacted>", "secret_file: "+filepath.Join(dir, "secret"))
	os.WriteFile(filepath.Join(dir, "secret"), []byte("x\n"), 0o600)
	os.WriteFile(printed, []byte(noSecrets), 0o644)
	if _, errOut, code = cli(t, nil, "serve", "--config", printed, "--print-config"); code != 0 {
		t.Fatalf("printed config with secret files: exit %d %s", code, errOut)
	}
	// A bad environment value is named; an unknown REPLICATOR_ variable is
	// warned about.
	_, errOut, code = cli(t, []string{"REPLICATOR_MAX_KEY_BYTES=lots"}, "serve", "--config", conf, "--print-config")
	if code == 0 || !strings.Contains(errOut, "$REPLICATOR_MAX_KEY_BYTES") {
		t.Fatalf("bad env value: exit %d %s", code, errOut)
	}
	_, errOut, _ = cli(t, []string{"REPLICATOR_LISTNE=x"}, "serve", "--config", conf, "--print-config")
	if !strings.Contains(errOut, "REPLICATOR_LISTNE") {
		t.Fatalf("unknown env not warned about: %s", errOut)
	}
}

// TestFaultHooksReachNoOperator: the faults the robustness suites inject
// (a full disk, a partition, a skewed clock) are neither flags nor
// configuration keys: only REPLICATOR_TESTING_* variables reach them, so an
// operator's configuration cannot turn one on.
func TestFaultHooksReachNoOperator(t *testing.T) {
	dir := t.TempDir()
	for _, flag := range []string{"--test-disk-full-file", "--test-raft-block-file", "--test-clock-offset"} {
		_, errOut, code := cli(t, nil, "serve", "--cluster-id", "a", "--data", dir, flag, "x", "--print-config")
		if code == 0 || !strings.Contains(errOut, "not defined") {
			t.Errorf("serve %s: exit %d, %s", flag, code, errOut)
		}
	}
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte("cluster_id: a\ntest_disk_full_file: /tmp/x\n"), 0o644)
	if _, errOut, code := cli(t, nil, "serve", "--config", cfg, "--data", dir, "--print-config"); code == 0 {
		t.Errorf("a configuration with a fault key was taken: %s", errOut)
	}
	out, errOut, code := cli(t, []string{"REPLICATOR_TESTING_CLOCK_OFFSET=1s"}, "serve", "--cluster-id", "a", "--data", dir, "--print-config")
	if code != 0 || strings.Contains(errOut, "REPLICATOR_TESTING") || strings.Contains(out, "offset: 1s") {
		t.Errorf("a testing variable: exit %d, warned or printed:\n%s\n%s", code, errOut, out)
	}
}

// TestCLIWriteOutcomes: the CLI says what the server and the connection
// say of a failed write. A write to a port where nothing listens, and one a
// saturated node refuses, were not written; the CLI never says "may or may
// not have happened" of them.
func TestCLIWriteOutcomes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	_, errOut, code := cli(t, nil, "put", "k", "v", "--addr", closed)
	if code == 0 || !strings.Contains(errOut, "nothing was written") || strings.Contains(errOut, "may or may not") {
		t.Fatalf("put to a closed port: exit %d\n%s", code, errOut)
	}

	// A node saturated at once: its peer is down and one entry is over
	// the high-water mark.
	p := newProc(t, "a", "a", "--peer", "b=http://127.0.0.1:1", "--peer-secret", "b=secret-b",
		"--wal-high-water-entries", "1", "--wal-low-water-entries", "1", "--admission-wait", "0s")
	p.startReady()
	refused := false
	for i := 0; i < 50 && !refused; i++ {
		_, errOut, code = cli(t, nil, "put", fmt.Sprint("s", i), "v", "--addr", p.url)
		if code == 0 {
			continue
		}
		refused = true
		if !strings.Contains(errOut, "saturated") || !strings.Contains(errOut, "nothing was written") || strings.Contains(errOut, "may or may not") {
			t.Fatalf("a saturated refusal: exit %d\n%s", code, errOut)
		}
	}
	if !refused {
		t.Fatal("50 writes taken by a node whose peer is down, over a high-water mark of 1")
	}

	// --addr takes host:port without a scheme, as etcdctl and
	// CONSUL_HTTP_ADDR do.
	hostport := strings.TrimPrefix(p.url, "http://")
	if out, errOut, code := cli(t, nil, "admin", "wal", "--addr", hostport); code != 0 || !strings.Contains(out, "SATURATED") ||
		!strings.Contains(out, "refused until") || !strings.Contains(out, "reached (entries)") {
		t.Fatalf("--addr %s: exit %d\n%s%s", hostport, code, out, errOut)
	}
	if _, errOut, code := cli(t, nil, "get", "k", "--addr", "ftp://"+hostport); code == 0 || !strings.Contains(errOut, "want host:port") {
		t.Fatalf("--addr ftp://...: exit %d\n%s", code, errOut)
	}
}

// TestCLIExitCodes: a script tells the classes of failure apart by exit
// code (docs/OPERATIONS.md, "Errors and exit codes"), and with -o json reads
// the error as a document on stdout.
func TestCLIExitCodes(t *testing.T) {
	p := newProc(t, "a", "a", "--peer", "b=http://127.0.0.1:1", "--peer-secret", "b=secret-b")
	p.startReady()
	// A port that accepts and never answers: a write sent there may have
	// happened (exit 5); a read there got no answer (exit 4).
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mute.Close() })
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	for _, c := range []struct {
		args       []string
		exit       int
		code       string
		mayWritten bool
	}{
		{[]string{"get", "nothing-here", "--addr", p.url}, 3, "not_found", false},
		{[]string{"put", "k\xff", "v", "--addr", p.url}, 1, "bad_key", false},
		{[]string{"get", "k", "--bogus"}, 2, "usage", false},
		{[]string{"put", "k"}, 2, "usage", false},
		{[]string{"get", "k", "--addr", closedAddr}, 4, "unreachable", false},
		{[]string{"put", "k", "v", "--addr", closedAddr}, 4, "unreachable", false},
		{[]string{"get", "k", "--addr", mute.Addr().String(), "--timeout", "300ms"}, 4, "no_answer", false},
		{[]string{"put", "k", "v", "--addr", mute.Addr().String(), "--timeout", "300ms"}, 5, "no_answer", true},
		{[]string{"admin", "pause", "nobody", "--addr", p.url}, 3, "not_found", false},
	} {
		_, errOut, code := cli(t, nil, c.args...)
		if code != c.exit || errOut == "" {
			t.Fatalf("%v: exit %d, want %d\n%s", c.args, code, c.exit, errOut)
		}
		out, errOut, code := cli(t, nil, append(c.args, "-o", "json")...)
		var doc struct {
			Error struct {
				Code           string `json:"code"`
				Message        string `json:"message"`
				MayHaveWritten bool   `json:"may_have_written"`
				ExitCode       int    `json:"exit_code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil || code != c.exit || errOut != "" {
			t.Fatalf("%v -o json: exit %d, stdout %q, stderr %q: %v", c.args, code, out, errOut, err)
		}
		if e := doc.Error; e.Code != c.code || e.ExitCode != c.exit || e.MayHaveWritten != c.mayWritten || e.Message == "" {
			t.Fatalf("%v -o json: %+v, want code %s exit %d may_have_written %v", c.args, e, c.code, c.exit, c.mayWritten)
		}
	}
}

// TestCLIFlagHelp: an unknown flag is said once, without the flag list;
// each command lists its own flags only, one-letter ones as typed (-o);
// help admin names the cluster commands.
func TestCLIFlagHelp(t *testing.T) {
	out, errOut, code := cli(t, nil, "get", "k", "--bogus")
	if code == 0 || strings.Count(errOut, "bogus") != 1 || strings.Contains(out+errOut, "--timeout") || !strings.Contains(errOut, "get -h") {
		t.Fatalf("an unknown flag: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	for _, cmd := range [][]string{{"peers", "-h"}, {"digest", "-h"}, {"admin", "wal", "-h"}} {
		out, errOut, _ := cli(t, nil, cmd...)
		if strings.Contains(out+errOut, "--wait") || strings.Contains(out+errOut, "--force") {
			t.Fatalf("%v lists another command's flags:\n%s%s", cmd, out, errOut)
		}
	}
	if out, errOut, _ := cli(t, nil, "admin", "reseed", "-h"); !strings.Contains(out+errOut, "--wait") {
		t.Fatalf("admin reseed -h lacks --wait:\n%s%s", out, errOut)
	}
	if out, errOut, _ := cli(t, nil, "get", "-h"); !strings.Contains(out+errOut, "\n  -o string") || strings.Contains(out+errOut, "--o ") {
		t.Fatalf("get -h lists -o as:\n%s%s", out, errOut)
	}
	if out, errOut, _ := cli(t, nil, "help", "admin"); !strings.Contains(out+errOut, "cluster join") {
		t.Fatalf("help admin omits the cluster commands:\n%s%s", out, errOut)
	}
	// `help X` is `X -h` (issue 49: it printed cobra's usage, without the
	// flags).
	for _, c := range []string{"diff", "put", "filter", "serve"} {
		hOut, hErr, hCode := cli(t, nil, "help", c)
		fOut, fErr, fCode := cli(t, nil, c, "-h")
		if hOut+hErr != fOut+fErr || hCode != 0 || fCode != 0 {
			t.Fatalf("help %s (exit %d):\n%s%s\ndiffers from %s -h (exit %d):\n%s%s", c, hCode, hOut, hErr, c, fCode, fOut, fErr)
		}
	}
}

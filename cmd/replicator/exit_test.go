package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/replicator/replicator/client"
)

// tableRow is one row of the error table in docs/OPERATIONS.md.
type tableRow struct {
	code, outcome       string
	status              int // 0: the CLI's own
	retryable, may      bool
	exitRead, exitWrite int
}

func errorTable(t *testing.T) []tableRow {
	t.Helper()
	b, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, "<!-- errors:begin -->"), strings.Index(s, "<!-- errors:end -->")
	if i < 0 || j < i {
		t.Fatal("docs/OPERATIONS.md: no errors:begin/errors:end table")
	}
	yes := func(c string) bool { return strings.HasPrefix(c, "yes") }
	var rows []tableRow
	for _, line := range strings.Split(s[i:j], "\n") {
		c := strings.Split(line, "|")
		if len(c) != 10 || strings.HasPrefix(c[1], "---") || strings.TrimSpace(c[1]) == "code" {
			continue
		}
		for k := range c {
			c[k] = strings.Trim(strings.TrimSpace(c[k]), "`")
		}
		r := tableRow{code: c[1], retryable: yes(c[3]), may: yes(c[5])}
		if c[4] != "-" {
			r.outcome = c[4]
		}
		if c[2] != "-" {
			r.status, _ = strconv.Atoi(c[2])
		}
		r.exitRead, _ = strconv.Atoi(c[6])
		r.exitWrite, _ = strconv.Atoi(c[7])
		rows = append(rows, r)
	}
	if len(rows) < 20 {
		t.Fatalf("the error table has %d rows", len(rows))
	}
	return rows
}

// TestErrorTable holds the CLI to the table of errors in docs/OPERATIONS.md:
// every API answer in it, met by a read and by a write, gives the exit
// code, retryable and may_have_written the table says; every error code the
// node's HTTP surface can answer is in it; the CLI's own codes come from
// the failures they name.
func TestErrorTable(t *testing.T) {
	rows := errorTable(t)
	codes := map[string]bool{}
	for _, r := range rows {
		codes[r.code] = true
		if r.status == 0 {
			continue
		}
		ce := &client.Error{Status: r.status, Code: r.code, CanRetry: r.retryable, Outcome: r.outcome, Message: "m"}
		read := classify(ce)
		write := classify(&client.WriteError{Err: ce, MayHaveWritten: client.MayHaveWritten(ce)})
		if read.ExitCode != r.exitRead || write.ExitCode != r.exitWrite {
			t.Errorf("%s %d: exit read %d write %d, the table says %d and %d", r.code, r.status, read.ExitCode, write.ExitCode, r.exitRead, r.exitWrite)
		}
		if write.MayHaveWritten != r.may || read.MayHaveWritten {
			t.Errorf("%s %d: may_have_written %v (read %v), the table says %v", r.code, r.status, write.MayHaveWritten, read.MayHaveWritten, r.may)
		}
		if write.Retryable != r.retryable || write.Code != r.code || write.Status != r.status {
			t.Errorf("%s %d: classified as %+v", r.code, r.status, write)
		}
	}

	// The CLI's own: each from the failure it names.
	dial := &url.Error{Op: "Get", URL: "http://127.0.0.1:1", Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}}
	reset := &url.Error{Op: "Put", URL: "http://127.0.0.1:1", Err: &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}}
	own := map[string]struct {
		read, write error
	}{
		"usage":       {usagef("want 1 argument(s), got 0"), usagef("want 2 argument(s), got 0")},
		"unreachable": {dial, &client.WriteError{Err: dial, MayHaveWritten: client.MayHaveWritten(dial)}},
		"no_answer":   {reset, &client.WriteError{Err: reset, MayHaveWritten: client.MayHaveWritten(reset)}},
		"failed":      {fmt.Errorf("--token-file: %w", os.ErrNotExist), fmt.Errorf("batch.json: %w", os.ErrNotExist)},
	}
	for _, r := range rows {
		if r.status != 0 {
			continue
		}
		e, ok := own[r.code]
		if !ok {
			t.Errorf("the table names a CLI error %q that this test does not make", r.code)
			continue
		}
		delete(own, r.code)
		read, write := classify(e.read), classify(e.write)
		if write.Code != r.code || read.ExitCode != r.exitRead || write.ExitCode != r.exitWrite || write.MayHaveWritten != r.may {
			t.Errorf("%s: read %+v, write %+v; the table says exit %d/%d, may %v", r.code, read, write, r.exitRead, r.exitWrite, r.may)
		}
	}
	for code := range own {
		t.Errorf("the CLI's error %q is not in the table", code)
	}

	// Every code the node's HTTP surface answers is in the table.
	lit := regexp.MustCompile(`Code: +"([a-z_]+)"`)
	files, _ := filepath.Glob("../../node/httpapi/*.go")
	files = append(files, "../../node/security.go")
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
			seen++
			if !codes[m[1]] {
				t.Errorf("%s answers %q, which the error table does not list", f, m[1])
			}
		}
	}
	if seen < 20 {
		t.Fatalf("found %d error codes in the node's HTTP surface: the pattern no longer matches", seen)
	}
}

// TestWriteOutcomeOverAttempts: a write's class follows every attempt and
// what the answer says was loaded, not only the last status.
func TestWriteOutcomeOverAttempts(t *testing.T) {
	loaded := func(n int64) *int64 { return &n }
	for _, c := range []struct {
		name string
		err  error
		exit int
	}{
		{"a load whose bad line came after lines it loaded", &client.WriteError{Err: &client.Error{Status: 400, Code: "bulk_failed", Loaded: loaded(2)}, MayHaveWritten: true}, exitUnknown},
		{"a keyed write answered 404 after an attempt that timed out", &client.WriteError{Err: &client.Error{Status: 404, Code: "not_found"}, MayHaveWritten: true}, exitUnknown},
		{"a membership change answered unknown_outcome", asWrite(&client.Error{Status: 503, Code: "unknown_outcome", Outcome: "unknown", CanRetry: true}), exitUnknown},
		{"a link action on a peer that is not there", asWrite(&client.Error{Status: 404, Code: "not_found"}), exitNotFound},
		{"a membership change refused for quorum", asWrite(&client.Error{Status: 409, Code: "quorum"}), exitFailed},
	} {
		if e := classify(c.err); e.ExitCode != c.exit || e.MayHaveWritten != (c.exit == exitUnknown) {
			t.Errorf("%s: exit %d may_have_written %v, want exit %d", c.name, e.ExitCode, e.MayHaveWritten, c.exit)
		}
	}
}

// TestErrorJSON: with -o json a failure is the API's error document on
// stdout, with the exit code in it.
func TestErrorJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	ce := &client.Error{Status: 503, Code: "unknown_outcome", CanRetry: true, Outcome: "unknown", Message: "m"}
	code := report(&out, &errOut, "replicator put", &client.WriteError{Err: ce, MayHaveWritten: true}, true)
	var doc struct {
		Error cliError `json:"error"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil || errOut.Len() != 0 {
		t.Fatalf("stdout %q stderr %q: %v", out.String(), errOut.String(), err)
	}
	if code != exitUnknown || doc.Error.ExitCode != exitUnknown || !doc.Error.MayHaveWritten || doc.Error.Code != "unknown_outcome" || doc.Error.Outcome != "unknown" {
		t.Fatalf("exit %d, %+v", code, doc.Error)
	}
	for args, want := range map[string]bool{"get k -o json": true, "get k --output=json": true, "get --json k": true, "get k -o table": false,
		"put k -- -o json": false, "get k": false} {
		if got := wantsJSON(strings.Fields(args)); got != want {
			t.Errorf("wantsJSON(%q) = %v", args, got)
		}
	}
}

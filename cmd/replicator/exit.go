package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/replicator/replicator/client"
)

// Exit codes: what a script branches on without reading the message. The
// table of every error with its code is in docs/OPERATIONS.md ("Errors and
// exit codes"); TestErrorTable holds this file to it.
const (
	exitOK = 0
	// exitFailed: the node answered with an error, or a local step failed
	// (a file to read): a write did not happen.
	exitFailed = 1
	// exitUsage: the command line is wrong; nothing was sent.
	exitUsage = 2
	// exitNotFound: the key, peer or record asked for is not there.
	exitNotFound = 3
	// exitUnreachable: no answer from the node (refused, no route, TLS
	// refused, deadline before an answer on a read). A write ends here only
	// when it certainly never reached the node.
	exitUnreachable = 4
	// exitUnknown: a write that may have happened (sent, and no answer says
	// it did not): read it back, or ask with `replicator outcome`.
	exitUnknown = 5
	// exitUnhealthy: `replicator status` found the cluster degraded or
	// down (its verdict line says why); the status was printed whole.
	exitUnhealthy = 6
)

// usageError is a command line that cannot run: exit 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usagef is a usageError with a formatted message.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// cliError is a failed command as a script reads it: the API's error shape
// ({"error": {...}}) with what the CLI adds (the exit code, and whether a
// write may have happened over every attempt).
type cliError struct {
	Code           string `json:"code"`
	Message        string `json:"message"`
	Status         int    `json:"status,omitempty"`
	Retryable      bool   `json:"retryable"`
	Outcome        string `json:"outcome,omitempty"`
	MayHaveWritten bool   `json:"may_have_written"`
	ExitCode       int    `json:"exit_code"`
}

// classify maps an error of a command to what it tells the caller.
func classify(err error) cliError {
	msg := strings.TrimPrefix(err.Error(), "replicator: ")
	var ue usageError
	var uh unhealthyError
	var ce *client.Error
	var we *client.WriteError
	isWrite := errors.As(err, &we)
	switch {
	case errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag"):
		return cliError{Code: "usage", Message: msg, ExitCode: exitUsage}
	case errors.As(err, &uh):
		return cliError{Code: uh.verdict, Message: msg, ExitCode: exitUnhealthy}
	case errors.As(err, &ce):
		e := cliError{Code: ce.Code, Message: msg, Status: ce.Status, Retryable: ce.CanRetry, Outcome: ce.Outcome, ExitCode: exitFailed}
		if e.Code == "" {
			e.Code = "http_" + fmt.Sprint(ce.Status) // an answer that is not ours (a proxy's)
		}
		switch {
		case isWrite && we.MayHaveWritten:
			// Over every attempt: an earlier one may have written,
			// whatever the last one was answered.
			e.MayHaveWritten, e.ExitCode = true, exitUnknown
		case ce.Status == 404:
			e.ExitCode = exitNotFound
		}
		return e
	case isWrite && we.MayHaveWritten:
		// Sent, and no answer came back: it may have been applied.
		return cliError{Code: "no_answer", Message: msg, Retryable: true, MayHaveWritten: true, ExitCode: exitUnknown}
	case transportError(err):
		code := "no_answer" // connected, and no answer came: a read learned nothing
		if client.NotSent(err) {
			code = "unreachable"
		}
		return cliError{Code: code, Message: msg, Retryable: true, ExitCode: exitUnreachable}
	}
	return cliError{Code: "failed", Message: msg, ExitCode: exitFailed}
}

// transportError: the request got no HTTP answer (a dial, TLS or read
// failure, or the deadline passed first).
func transportError(err error) bool {
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
}

// report prints a failed command: one line on stderr, or with -o json the
// error document on stdout (where a script reads the answer); it returns
// the exit code.
func report(w, stderr io.Writer, name string, err error, asJSON bool) int {
	e := classify(err)
	if uh := (unhealthyError{}); errors.As(err, &uh) && asJSON {
		// The status document already says its verdict: one document.
		return e.ExitCode
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]cliError{"error": e})
		return e.ExitCode
	}
	fmt.Fprintf(stderr, "%s: %s\n", name, e.Message)
	return e.ExitCode
}

// wantsJSON reports whether the command line asks for JSON output (-o json,
// --output json, --json), read from the arguments so that an error found
// before the flags are parsed is printed as JSON too.
func wantsJSON(args []string) bool {
	for i, a := range args {
		if a == "--" {
			break
		}
		a = "-" + strings.TrimLeft(a, "-")
		switch a {
		case "-json", "-json=true", "-o=json", "-output=json":
			return true
		case "-o", "-output":
			if i+1 < len(args) && args[i+1] == "json" {
				return true
			}
		}
	}
	return false
}

// exit ends the process with err's code.
func exit(err error, name string, args []string) {
	os.Exit(report(os.Stdout, os.Stderr, name, err, wantsJSON(args)))
}

// Package origin resolves which cluster this node belongs to and pins that
// identity to the data directory.
//
// Origin is infrastructure-resolved provenance: it decides loop suppression,
// LWW tie-breaks and audit. It comes from the operator's configuration (a
// flag, the environment, a file the platform writes), never from a caller or
// a peer, and once a data directory has held a cluster's data it may not
// silently start serving as another cluster.
package origin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/replicator/replicator/entry"
	"github.com/replicator/replicator/internal/atomicfile"
)

// ErrInvalidID is the class of errors for a cluster ID that does not match
// IDPattern.
var ErrInvalidID = errors.New("origin: invalid cluster id")

// ErrMismatch is the class of errors for a data directory pinned to another
// cluster ID than the one resolved.
var ErrMismatch = errors.New("origin: data directory belongs to another cluster")

// IDPattern is the syntax of a cluster ID.
const IDPattern = entry.ClusterIDPattern

// Validate reports whether id is a well-formed cluster ID, with an error that
// quotes the offending input.
func Validate(id string) error {
	if !entry.ValidClusterID(id) {
		return fmt.Errorf("%w %q: want %s (lower-case letters, digits and '-', 1 to 63 characters, not starting with '-')",
			ErrInvalidID, id, IDPattern)
	}
	return nil
}

// Resolver tells a node which cluster it belongs to. Custom resolvers plug in
// through node.Options.Origin.
type Resolver interface {
	// Resolve returns the cluster ID. It need not validate it; the caller
	// does, and names the resolver in the error.
	Resolve(ctx context.Context) (string, error)
	// String names the resolver and its input, e.g. "env:REPL_CLUSTER", for
	// errors and /admin/origin.
	String() string
}

// Static is a fixed cluster ID (--cluster-id, --origin static:ID).
type Static string

// Resolve implements Resolver.
func (s Static) Resolve(context.Context) (string, error) { return string(s), nil }

func (s Static) String() string { return "static:" + string(s) }

// Env reads the cluster ID from an environment variable (--origin env:VAR).
type Env struct {
	Var string
	// Lookup replaces os.LookupEnv in tests.
	Lookup func(string) (string, bool)
}

// Resolve implements Resolver.
func (e Env) Resolve(context.Context) (string, error) {
	look := e.Lookup
	if look == nil {
		look = os.LookupEnv
	}
	v, ok := look(e.Var)
	if !ok {
		return "", fmt.Errorf("environment variable %s is not set", e.Var)
	}
	return strings.TrimSpace(v), nil
}

func (e Env) String() string { return "env:" + e.Var }

// File reads the cluster ID from a file, such as a Kubernetes downward-API
// volume (--origin file:PATH). It is read once at start; a change needs a
// restart.
type File struct{ Path string }

// Resolve implements Resolver.
func (f File) Resolve(context.Context) (string, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func (f File) String() string { return "file:" + f.Path }

// Hostname extracts the cluster ID from the host name with a regular
// expression holding a named group "cluster" (--origin hostname:REGEX), e.g.
// `^(?P<cluster>[a-z0-9-]+)-node-[0-9]+$`. The environment variable
// REPLICATOR_HOSTNAME, when set, stands in for the host name (tests, and
// containers whose host name cannot be chosen).
type Hostname struct {
	Pattern *regexp.Regexp
	// Hostname replaces os.Hostname in tests.
	Hostname func() (string, error)
}

// HostnameEnv overrides the host name the hostname resolver reads.
const HostnameEnv = "REPLICATOR_HOSTNAME"

func systemHostname() (string, error) {
	if h, ok := os.LookupEnv(HostnameEnv); ok {
		return h, nil
	}
	return os.Hostname()
}

// NewHostname compiles expr and checks it has a "cluster" group.
func NewHostname(expr string) (*Hostname, error) {
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("origin: hostname:%s: %w", expr, err)
	}
	if re.SubexpIndex("cluster") < 0 {
		return nil, fmt.Errorf("origin: hostname:%s: the expression has no named group (?P<cluster>...)", expr)
	}
	return &Hostname{Pattern: re}, nil
}

// Resolve implements Resolver.
func (h *Hostname) Resolve(context.Context) (string, error) {
	get := h.Hostname
	if get == nil {
		get = systemHostname
	}
	name, err := get()
	if err != nil {
		return "", err
	}
	m := h.Pattern.FindStringSubmatch(name)
	if m == nil {
		return "", fmt.Errorf("host name %q does not match %s", name, h.Pattern)
	}
	return m[h.Pattern.SubexpIndex("cluster")], nil
}

func (h *Hostname) String() string { return "hostname:" + h.Pattern.String() }

// ParseSpec builds a resolver from an --origin value: static:ID, env:VAR,
// file:PATH or hostname:REGEX.
func ParseSpec(spec string) (Resolver, error) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok || arg == "" {
		return nil, fmt.Errorf("origin: spec %q: want static:ID, env:VAR, file:PATH or hostname:REGEX", spec)
	}
	switch kind {
	case "static":
		return Static(arg), nil
	case "env":
		return Env{Var: arg}, nil
	case "file":
		return File{Path: arg}, nil
	case "hostname":
		return NewHostname(arg)
	}
	return nil, fmt.Errorf("origin: spec %q: unknown resolver %q (want static, env, file or hostname)", spec, kind)
}

// Resolve runs r and validates its answer; every error names the resolver and
// its input.
func Resolve(ctx context.Context, r Resolver) (string, error) {
	id, err := r.Resolve(ctx)
	if err != nil {
		return "", fmt.Errorf("origin: resolver %s: %w", r, err)
	}
	if err := Validate(id); err != nil {
		return "", fmt.Errorf("origin: resolver %s: %w", r, err)
	}
	return id, nil
}

// PinFile is the name of the file in the data directory that records the
// cluster ID the directory belongs to.
const PinFile = "CLUSTER_ID"

// MismatchError names both IDs when a data directory is started as another
// cluster.
type MismatchError struct {
	Dir      string
	Pinned   string
	Resolved string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("origin: data directory %s belongs to cluster %q but this node resolved cluster %q; "+
		"start it with the original ID, or pass --reassign-origin to take the directory over deliberately",
		e.Dir, e.Pinned, e.Resolved)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Pin records id as the data directory's cluster on first start and checks it
// on every later start. With reassign, a different pinned ID is overwritten
// (the caller logs it) and the previous ID is returned.
func Pin(dir, id string, reassign bool) (previous string, err error) {
	return pin(dir, id, reassign, true)
}

// CheckPin is Pin without writing: it refuses a mismatch, and returns the
// pinned ID, so that a node can check at open and pin only once it has
// everything (a start that fails to bind claims no directory).
func CheckPin(dir, id string, reassign bool) (previous string, err error) {
	return pin(dir, id, reassign, false)
}

func pin(dir, id string, reassign, write bool) (previous string, err error) {
	path := filepath.Join(dir, PinFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		pinned := strings.TrimSpace(string(b))
		if pinned == id {
			return pinned, nil
		}
		if !reassign {
			return pinned, &MismatchError{Dir: dir, Pinned: pinned, Resolved: id}
		}
		previous = pinned
	case errors.Is(err, os.ErrNotExist):
	default:
		return "", fmt.Errorf("origin: read %s: %w", path, err)
	}
	if !write {
		return previous, nil
	}
	if err := atomicfile.Write(path, []byte(id+"\n")); err != nil {
		return previous, fmt.Errorf("origin: pin %s: %w", path, err)
	}
	return previous, nil
}

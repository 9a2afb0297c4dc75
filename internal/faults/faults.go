// Package faults holds the faults a test injects into a node: the
// robustness suites' disk-full and partition files, a skewed clock, an
// older build's command format, a crash between a write's commit and its
// answer (node.Options.Testing).
package faults

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/replicator/replicator/machine"
)

// Faults are faults a test injects into a node (node.Options.Testing).
type Faults struct {
	// DiskFullFile names a file that robustness tests write "full" into to
	// make log appends fail as on a full disk (ENOSPC), and empty to give
	// the space back.
	DiskFullFile string
	// RaftBlockFile names a file of raft addresses (one a line) this node
	// may not reach: robustness tests partition a cluster's nodes with it.
	RaftBlockFile string
	// ClockOffset shifts the node's physical clock (a skewed node), unless
	// Options.Clock is set.
	ClockOffset time.Duration
	// ReadsFormat, when 1, plays a build before command encoding 2 in a
	// mixed-version cluster: the node says it reads encoding 1 only, and its
	// machine refuses encoding 2 (machine.Options.ReadsFormat).
	ReadsFormat int
	// GCInterval, when set, replaces Options.GCInterval: an e2e test of
	// collection cannot wait minutes for it.
	GCInterval time.Duration
	// CommandFault, when set, sees every command of the node's own
	// bookkeeping (not local writes, not inbound batches) before it is
	// proposed; an error it returns fails the command as a lost lead would,
	// before anything is proposed. Tests only (no flag or variable sets it).
	CommandFault func(*machine.Command) error
	// ShortRetention lowers the floor of TombstoneRetention and
	// IdempotencyWindow from a minute to a second: the combined robustness
	// schedule collects deletes while links are narrowed and widened within
	// a run of seconds ($REPLICATOR_TESTING_SHORT_RETENTION=1).
	ShortRetention bool
	// RESPCrashKey, when set, kills the process (SIGKILL) once a RESP write
	// of that key committed and before its answer is written: the crash
	// between commit and answer, whose write must be there after a restart.
	RESPCrashKey string
}

// EnvPrefix begins the environment variables FromEnv reads.
const EnvPrefix = "REPLICATOR_TESTING_"

// FromEnv reads the faults of a robustness suite from the
// environment of a child process it started: REPLICATOR_TESTING_DISK_FULL_FILE,
// REPLICATOR_TESTING_RAFT_BLOCK_FILE, REPLICATOR_TESTING_CLOCK_OFFSET and
// REPLICATOR_TESTING_GC_INTERVAL (durations).
func FromEnv(getenv func(string) string) (Faults, error) {
	t := Faults{
		DiskFullFile:   getenv(EnvPrefix + "DISK_FULL_FILE"),
		RaftBlockFile:  getenv(EnvPrefix + "RAFT_BLOCK_FILE"),
		RESPCrashKey:   getenv(EnvPrefix + "RESP_CRASH_KEY"),
		ShortRetention: getenv(EnvPrefix+"SHORT_RETENTION") == "1",
	}
	for _, d := range []struct {
		name string
		into *time.Duration
	}{{"CLOCK_OFFSET", &t.ClockOffset}, {"GC_INTERVAL", &t.GCInterval}} {
		v := getenv(EnvPrefix + d.name)
		if v == "" {
			continue
		}
		dur, err := time.ParseDuration(v)
		if err != nil {
			return t, fmt.Errorf("faults: $%s%s: %w", EnvPrefix, d.name, err)
		}
		*d.into = dur
	}
	return t, nil
}

// DiskFull returns the test hook that fails WAL appends while the test's
// disk-full file says "full".
func (t *Faults) DiskFull() func() error {
	path := t.DiskFullFile
	if path == "" {
		return nil
	}
	return func() error {
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "full" {
			return fmt.Errorf("write %s: %w", path, syscall.ENOSPC)
		}
		return nil
	}
}

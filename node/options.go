package node

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/replicator/replicator/hlc"
	"github.com/replicator/replicator/origin"
)

// Options configures a node. The zero value of a field means its default;
// Open copies the options before use.
type Options struct {
	// ClusterID is shorthand for Origin: origin.Static(ClusterID). Exactly
	// one of the two must be set.
	ClusterID string
	// Origin resolves the cluster ID (static, env, file, hostname, custom).
	Origin origin.Resolver
	// ReassignOrigin lets a data directory pinned to another cluster ID be
	// taken over (logged). Off by default: a node refuses to start instead.
	ReassignOrigin bool

	// DataDir holds CLUSTER_ID, store/ (Pebble) and wal/ (the outbound WAL).
	DataDir string
	// Listen is the HTTP API address. Default 127.0.0.1:7400; ":0" picks a
	// free port (see Node.Addr).
	Listen string

	// MaxKeyBytes bounds keys. Default 4096.
	MaxKeyBytes int
	// MaxValueBytes bounds values. Default 1 MiB.
	MaxValueBytes int

	// TombstoneRetention is how long a delete's tombstone is kept at least.
	// Default 24h.
	TombstoneRetention time.Duration
	// GCInterval is how often tombstones past retention are collected.
	// Default 1 minute.
	GCInterval time.Duration
	// MaxClockOffset bounds how far ahead of the local clock a remote stamp
	// may be. Default 500ms.
	MaxClockOffset time.Duration

	// MaxGroupEntries bounds how many writes share one WAL append and fsync.
	// Default 1024.
	MaxGroupEntries int
	// WALSegmentSize is the WAL's segment file size. Default 8 MiB.
	WALSegmentSize int
	// UnsafeNoSync skips every fsync. It gives up durability: benchmarks
	// of CPU cost only.
	UnsafeNoSync bool

	// Clock is the physical clock. Default the system clock. Tests pass a
	// manual clock; robustness runs an offset clock.
	Clock hlc.PhysicalClock
	// Logger is the node's logger. Default slog.Default().
	Logger *slog.Logger
}

// DefaultOptions returns options with every default filled in except the
// cluster identity and data directory, which have none.
func DefaultOptions() *Options {
	o := &Options{}
	o.EnsureDefaults()
	return o
}

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7400"
	}
	if o.MaxKeyBytes == 0 {
		o.MaxKeyBytes = 4096
	}
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = 1 << 20
	}
	if o.TombstoneRetention == 0 {
		o.TombstoneRetention = 24 * time.Hour
	}
	if o.GCInterval == 0 {
		o.GCInterval = time.Minute
	}
	if o.MaxClockOffset == 0 {
		o.MaxClockOffset = hlc.DefaultMaxOffset
	}
	if o.MaxGroupEntries == 0 {
		o.MaxGroupEntries = 1024
	}
	if o.WALSegmentSize == 0 {
		o.WALSegmentSize = 8 << 20
	}
	if o.Clock == nil {
		o.Clock = hlc.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every problem at once.
func (o *Options) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("node: "+format, args...)) }
	switch {
	case o.ClusterID == "" && o.Origin == nil:
		add("a cluster identity is required (--cluster-id or --origin)")
	case o.ClusterID != "" && o.Origin != nil:
		add("give either a cluster ID or an origin resolver, not both")
	case o.ClusterID != "":
		if err := origin.Validate(o.ClusterID); err != nil {
			errs = append(errs, fmt.Errorf("node: --cluster-id: %w", err))
		}
	}
	if o.DataDir == "" {
		add("a data directory is required (--data)")
	}
	if o.MaxKeyBytes < 1 || o.MaxKeyBytes > 1<<16 {
		add("MaxKeyBytes %d out of range [1, 65536]", o.MaxKeyBytes)
	}
	if o.MaxValueBytes < 0 || o.MaxValueBytes > 64<<20 {
		add("MaxValueBytes %d out of range [0, 64 MiB]", o.MaxValueBytes)
	}
	if o.TombstoneRetention < time.Minute {
		add("TombstoneRetention %s is below 1m", o.TombstoneRetention)
	}
	if o.GCInterval <= 0 {
		add("GCInterval %s must be positive", o.GCInterval)
	}
	if o.MaxClockOffset <= 0 {
		add("MaxClockOffset %s must be positive", o.MaxClockOffset)
	}
	if o.MaxGroupEntries < 1 {
		add("MaxGroupEntries %d is below 1", o.MaxGroupEntries)
	}
	return errors.Join(errs...)
}

func (o *Options) resolver() origin.Resolver {
	if o.Origin != nil {
		return o.Origin
	}
	return origin.Static(o.ClusterID)
}

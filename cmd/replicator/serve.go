package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"github.com/replicator/replicator/internal/secret"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/internal/hugepages"
	"github.com/replicator/replicator/node"
	"github.com/replicator/replicator/origin"
)

// serveConfig is what `replicator serve` takes, from flags and from a YAML
// file (--config); flags win over the file.
type serveConfig struct {
	ClusterID          string   `yaml:"cluster_id"`
	Origin             string   `yaml:"origin"`
	ReassignOrigin     bool     `yaml:"reassign_origin"`
	Data               string   `yaml:"data"`
	NodeID             string   `yaml:"node_id"`
	RaftListen         string   `yaml:"raft_listen"`
	RaftKeyFile        string   `yaml:"raft_key_file"`
	SecretsKeyFile     string   `yaml:"secrets_key_file"`
	RaftAcceptGossip   bool     `yaml:"raft_accept_gossip_key"`
	RaftAdvertise      string   `yaml:"raft_advertise"`
	BootstrapExpect    int      `yaml:"bootstrap_expect"`
	Groups             int      `yaml:"groups"`
	RaftElection       duration `yaml:"raft_election_timeout"`
	Listen             string   `yaml:"listen"`
	MaxKeyBytes        int      `yaml:"max_key_bytes"`
	MaxValueBytes      int      `yaml:"max_value_bytes"`
	TombstoneRetention duration `yaml:"tombstone_retention"`
	ConflictRetention  duration `yaml:"conflict_retention"`
	ConflictMaxBytes   int64    `yaml:"conflict_max_bytes"`
	ConflictValueMax   int      `yaml:"conflict_value_max"`
	AEInterval         duration `yaml:"antientropy_interval"`
	AERepair           bool     `yaml:"antientropy_repair"`
	AEBandwidth        byteSize `yaml:"antientropy_bandwidth"`
	AECPU              float64  `yaml:"antientropy_cpu"`
	MaxClockOffset     duration `yaml:"max_clock_offset"`
	LogLevel           string   `yaml:"log_level"`
	LogFormat          string   `yaml:"log_format"`

	Peers         map[string]*peerConfig `yaml:"peers"`
	InsecurePeers bool                   `yaml:"insecure_peers"`
	BatchEntries  int                    `yaml:"batch_max_entries"`
	BatchBytes    int                    `yaml:"batch_max_bytes"`
	BatchLinger   duration               `yaml:"batch_linger"`
	ReplicateMax  int64                  `yaml:"replicate_max_bytes"`
	PinWindow     duration               `yaml:"pin_window"`
	IdemWindow    duration               `yaml:"idempotency_window"`

	HighEntries   uint64    `yaml:"wal_high_water_entries"`
	LowEntries    uint64    `yaml:"wal_low_water_entries"`
	HighBytes     int64     `yaml:"wal_high_water_bytes"`
	LowBytes      int64     `yaml:"wal_low_water_bytes"`
	HighAge       duration  `yaml:"wal_high_water_age"`
	LowAge        duration  `yaml:"wal_low_water_age"`
	AdmissionWait *duration `yaml:"admission_wait"`
	IdentityWait  *duration `yaml:"identity_check_wait"`
	Permits       int       `yaml:"replay_permits"`
	MinBodyRate   int64     `yaml:"min_body_rate"`
	MaxConns      int       `yaml:"max_connections"`
	MaxBodies     int       `yaml:"max_bodies_in_flight"`
	PermitQueue   int       `yaml:"replay_queue"`
	NoAutoReseed  bool      `yaml:"no_auto_reseed"`
	// ShutdownTimeout bounds a graceful stop (SIGTERM, SIGINT): past it the
	// process exits at once. Supervisors wait this plus a margin
	// (deploy/systemd TimeoutStopSec, deploy/kubernetes
	// terminationGracePeriodSeconds).
	ShutdownTimeout duration `yaml:"shutdown_timeout"`
	// SecretOverlap bounds how long a link takes the second secret of its
	// secret file (a rotation: docs/OPERATIONS.md "Rotating a link's
	// secret").
	SecretOverlap duration `yaml:"secret_overlap"`

	GossipBind      string   `yaml:"gossip_bind"`
	GossipAdvertise string   `yaml:"gossip_advertise"`
	Join            []string `yaml:"join"`
	GossipKeyFile   string   `yaml:"gossip_key_file"`
	GossipProfile   string   `yaml:"gossip_profile"`
	AdvertiseAPI    string   `yaml:"advertise_api"`
	AdvertiseRepl   string   `yaml:"advertise_replicate"`
	TLSCert         string   `yaml:"tls_cert"`
	TLSKey          string   `yaml:"tls_key"`
	TLSReload       duration `yaml:"tls_reload_interval"`
	LinkLagging     duration `yaml:"link_lagging"`
	LinkStalled     duration `yaml:"link_stalled"`
	TLSClientCA     string   `yaml:"tls_client_ca"`
	PeerCA          string   `yaml:"peer_ca"`
	PeerSANMode     string   `yaml:"peer_san_mode"`
	PeerListen      string   `yaml:"peer_listen"`
	RESPListen      string   `yaml:"resp_listen"`
	APITokenFile    string   `yaml:"api_token_file"`
	AdminTokenFile  string   `yaml:"admin_token_file"`
	Pprof           bool     `yaml:"pprof"`
	PprofListen     string   `yaml:"pprof_listen"`
	MemTableSize    uint64   `yaml:"memtable_size"`
	CacheSize       byteSize `yaml:"cache_size"`
	VersionCache    int      `yaml:"version_cache_keys"`
	HugePages       bool     `yaml:"huge_pages"`
}

// defaultServeConfig is the configuration before the file, the
// environment and the flags: the node's defaults, spelled out so that
// `serve -h` and --print-config show them. Marks derived from others (the
// low water marks: half the high ones) stay zero, meaning derived.
func defaultServeConfig() *serveConfig {
	d := node.DefaultOptions()
	dur := func(t time.Duration) *duration { v := duration(t); return &v }
	return &serveConfig{
		Listen: d.Listen, MaxKeyBytes: d.MaxKeyBytes, MaxValueBytes: d.MaxValueBytes,
		TombstoneRetention: duration(d.TombstoneRetention), MaxClockOffset: duration(d.MaxClockOffset),
		ConflictRetention: duration(d.ConflictRetention), ConflictMaxBytes: d.ConflictMaxBytes, ConflictValueMax: d.ConflictValueMax,
		AEInterval: duration(d.AntiEntropyInterval), AEBandwidth: byteSize(d.AntiEntropyBandwidth), AECPU: d.AntiEntropyCPU,
		LogLevel: "info", LogFormat: "text",
		BatchEntries: d.MaxBatchEntries, BatchBytes: d.MaxBatchBytes, BatchLinger: duration(d.BatchLinger),
		ReplicateMax: d.MaxReplicateBytes, PinWindow: duration(d.PinWindow),
		HighEntries: d.WaterMarks.HighEntries, HighBytes: d.WaterMarks.HighBytes, HighAge: duration(d.WaterMarks.HighAge),
		AdmissionWait: dur(d.AdmissionWait), IdentityWait: dur(d.IdentityCheckWait), ShutdownTimeout: duration(defaultShutdownTimeout),
		SecretOverlap: duration(24 * time.Hour),
		Permits:       d.Permits, PermitQueue: d.PermitQueue,
		MinBodyRate: d.MinBodyRate, MaxConns: d.MaxConnections, MaxBodies: d.MaxBodiesInFlight,
		GossipProfile: "", TLSReload: duration(d.TLSReloadInterval), PeerSANMode: node.SANModeURI,
		MemTableSize: d.MemTableSize, CacheSize: byteSize(d.CacheSize), VersionCache: d.VersionCacheKeys,
		HugePages:   true,
		LinkLagging: duration(d.LinkLagging), LinkStalled: duration(d.LinkStalled),
		RaftElection: duration(time.Second),
	}
}

// listFlag is a repeatable string flag.
// listFlag is a repeatable flag; meta names its value in the help.
type listFlag struct {
	p    *[]string
	meta string
}

func (l listFlag) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l listFlag) Set(v string) error { *l.p = append(*l.p, v); return nil }

// peerConfig is one entry of the YAML peers map (and what --peer,
// --peer-secret and --peer-secret-file fill in).
type peerConfig struct {
	URL        string `yaml:"url"`
	Secret     string `yaml:"secret,omitempty"`
	SecretFile string `yaml:"secret_file,omitempty"`
	Overflow   string `yaml:"overflow,omitempty"`
	// Compression: zstd or none (default).
	Compression string `yaml:"compression,omitempty"`
	// Include and Exclude: the link's filter (key prefixes).
	Include []string `yaml:"include,omitempty"`
	Exclude []string `yaml:"exclude,omitempty"`
	// Bandwidth: the link's limit, "20MiB" (per second) or bytes.
	Bandwidth string `yaml:"bandwidth,omitempty"`
	// AllowUnproven: see --peer-allow-unproven.
	AllowUnproven bool `yaml:"allow_unproven,omitempty"`
}

func (cfg *serveConfig) peer(name string) *peerConfig {
	if cfg.Peers == nil {
		cfg.Peers = map[string]*peerConfig{}
	}
	p := cfg.Peers[name]
	if p == nil {
		p = &peerConfig{}
		cfg.Peers[name] = p
	}
	return p
}

// namedFlag is a repeatable NAME=VALUE flag.
type namedFlag struct {
	set  func(name, value string)
	meta string // NAME=URL, as -h shows it
}

func (f namedFlag) String() string { return "" }

func (f namedFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=VALUE, got %q", v)
	}
	f.set(name, value)
	return nil
}

// duration reads "24h", "500ms" from YAML.
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = duration(v)
	return nil
}

func (d duration) MarshalYAML() (any, error) { return shortDuration(time.Duration(d)), nil }

func (d *duration) String() string {
	if d == nil {
		return "0s"
	}
	return shortDuration(time.Duration(*d))
}

func (*duration) Type() string   { return "duration" }
func (optDuration) Type() string { return "duration" }
func (f namedFlag) Type() string { return f.meta }
func (l listFlag) Type() string  { return l.meta }

// shortDuration is 24h rather than 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// optDuration is a duration flag that tells "0s" from unset.
type optDuration struct{ p **duration }

func (o optDuration) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return (*o.p).String()
}

func (o optDuration) Set(s string) error {
	var d duration
	if err := d.Set(s); err != nil {
		return err
	}
	*o.p = &d
	return nil
}
func (d *duration) Set(s string) error { v, err := time.ParseDuration(s); *d = duration(v); return err }

func loadConfigFile(path string, cfg *serveConfig) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// configPath finds --config (or $REPLICATOR_CONFIG) before the flags are
// parsed, so that the file is loaded first and every flag then overrides
// it.
func configPath(args []string) string {
	p := os.Getenv("REPLICATOR_CONFIG")
	for i, a := range args {
		for _, p := range []string{"--config", "-config"} {
			if a == p && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v
			}
		}
	}
	return p
}

// envPrefix names the environment variables serve reads: REPLICATOR_ and
// the flag's name in capitals, dashes as underscores (--wal-high-water-bytes
// is REPLICATOR_WAL_HIGH_WATER_BYTES). They sit between the file and the
// flags: the file sets, the environment overrides it, a flag overrides
// both. A repeatable flag takes a comma-separated list.
const envPrefix = "REPLICATOR_"

// clientEnv are the variables of the client commands, which serve ignores.
var clientEnv = map[string]bool{"REPLICATOR_ADDR": true, "REPLICATOR_TOKEN_FILE": true, "REPLICATOR_CONFIG": true}

// applyEnv sets fs's flags from the environment. It returns the
// REPLICATOR_ variables that name no flag (a typo, warned about).
func applyEnv(fs *flag.FlagSet, environ []string) (unknown []string, err error) {
	var errs []error
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || clientEnv[name] || strings.HasPrefix(name, node.TestingEnvPrefix) {
			continue
		}
		flagName := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, envPrefix)), "_", "-")
		f := fs.Lookup(flagName)
		if f == nil || flagName == "config" || flagName == "print-config" {
			unknown = append(unknown, name)
			continue
		}
		values := []string{value}
		if _, repeatable := f.Value.(namedFlag); repeatable {
			values = strings.Split(value, ",")
		} else if _, repeatable := f.Value.(listFlag); repeatable {
			values = strings.Split(value, ",")
		}
		for _, v := range values {
			if err := fs.Set(flagName, strings.TrimSpace(v)); err != nil {
				errs = append(errs, fmt.Errorf("$%s: %w", name, err))
			}
		}
	}
	sort.Strings(unknown)
	return unknown, errors.Join(errs...)
}

// redacted stands for a secret in --print-config; given back as a secret
// it is refused.
const redacted = "<redacted>"

// printConfig writes the effective settings as YAML that --config takes,
// secrets redacted, derived values (low water marks) filled in.
func printConfig(cfg *serveConfig, o *node.Options) error {
	c := *cfg
	c.Peers = map[string]*peerConfig{}
	for name, p := range cfg.Peers {
		q := *p
		if q.Secret != "" {
			q.Secret = redacted
		}
		c.Peers[name] = &q
	}
	if o != nil {
		c.LowEntries, c.LowBytes, c.LowAge = o.WaterMarks.LowEntries, o.WaterMarks.LowBytes, duration(o.WaterMarks.LowAge)
		c.IdemWindow = duration(o.IdempotencyWindow)
	}
	enc := yaml.NewEncoder(os.Stdout)
	enc.SetIndent(2)
	if err := enc.Encode(&c); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	if o != nil {
		printOverrides(os.Stdout, o)
	}
	return nil
}

func serveFlags(cfg *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.String("config", "", "YAML file with the same settings (then $REPLICATOR_* override it, then flags)")
	fs.Bool("print-config", false, "print the effective settings as YAML (secrets redacted) and exit")
	fs.StringVar(&cfg.ClusterID, "cluster-id", cfg.ClusterID, "this node's cluster ID ([a-z0-9][a-z0-9-]{0,62}); same as --origin static:ID")
	fs.StringVar(&cfg.Origin, "origin", cfg.Origin, "how the cluster ID is resolved: static:ID, env:VAR, file:PATH, hostname:REGEX")
	fs.BoolVar(&cfg.ReassignOrigin, "reassign-origin", cfg.ReassignOrigin, "take over a data directory pinned to another cluster ID (logged)")
	fs.StringVar(&cfg.Data, "data", cfg.Data, "data directory (created if missing)")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's ID within its cluster (default: the data directory's, minted at its first start)")
	fs.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "HOST:PORT of the raft port: this node is one of several of its cluster (docs/CLUSTER.md)")
	fs.StringVar(&cfg.RaftAdvertise, "raft-advertise", cfg.RaftAdvertise, "HOST:PORT the cluster's other nodes reach the raft port at (default --raft-listen)")
	fs.StringVar(&cfg.SecretsKeyFile, "secrets-key-file", cfg.SecretsKeyFile, "file with the base64 key (32 bytes: openssl rand -base64 32; the same on every node of the cluster) that seals the secrets of peers added at run time in the cluster's log")
	fs.StringVar(&cfg.RaftKeyFile, "raft-key-file", cfg.RaftKeyFile, "file with the cluster's own base64 raft key (openssl rand -base64 32; the same on its nodes, on no other cluster's): secures the raft port")
	fs.BoolVar(&cfg.RaftAcceptGossip, "raft-accept-gossip-key", cfg.RaftAcceptGossip, "with --raft-key-file: also take nodes that have only the gossip key (while the cluster moves to the raft key)")
	fs.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", cfg.BootstrapExpect, "how many fresh nodes found by gossip form a new cluster (0: wait to be added)")
	fs.IntVar(&cfg.Groups, "groups", cfg.Groups, "the cluster's number of raft groups, 1 to 64, each with its own leader (the same on every node; recorded when the cluster forms: docs/CLUSTER.md)")
	fs.Var(&cfg.RaftElection, "raft-election-timeout", "bounds how long the cluster's nodes wait without a leader before they elect another (raft's heartbeat timeout is half of it)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API address")
	fs.IntVar(&cfg.MaxKeyBytes, "max-key-bytes", cfg.MaxKeyBytes, "largest key in bytes")
	fs.IntVar(&cfg.MaxValueBytes, "max-value-bytes", cfg.MaxValueBytes, "largest value in bytes")
	fs.Var(&cfg.TombstoneRetention, "tombstone-retention", "how long tombstones are kept at least")
	fs.Var(&cfg.ConflictRetention, "conflict-retention", "how long the conflict log keeps a record")
	fs.Int64Var(&cfg.ConflictMaxBytes, "conflict-max-bytes", cfg.ConflictMaxBytes, "the conflict log's size past which the oldest records go")
	fs.IntVar(&cfg.ConflictValueMax, "conflict-value-max", cfg.ConflictValueMax, "largest lost value a conflict record keeps whole (a larger one: its length and hash)")
	fs.Var(&cfg.AEInterval, "antientropy-interval", "how often the leader compares the cluster's tree with each peer's (0: never; replicator diff still does)")
	fs.BoolVar(&cfg.AERepair, "antientropy-repair", cfg.AERepair, "each background comparison pulls and applies what this cluster lacks (off: it only reports)")
	fs.Var(&cfg.AEBandwidth, "antientropy-bandwidth", "bytes per second a background comparison exchanges with a peer at most, e.g. 4MiB")
	fs.Float64Var(&cfg.AECPU, "antientropy-cpu", cfg.AECPU, "share of one core a background comparison keeps busy at most, on each side (1: unpaced)")
	fs.Var(&cfg.MaxClockOffset, "max-clock-offset", "how far ahead of the local clock a remote stamp may be")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
	fs.BoolVar(&cfg.Pprof, "pprof", cfg.Pprof, "serve /debug/pprof on the API listener, behind the API token (profiles)")
	fs.StringVar(&cfg.PprofListen, "pprof-listen", cfg.PprofListen, "serve /debug/pprof on this address instead, without a token (keep it private)")
	fs.Uint64Var(&cfg.MemTableSize, "memtable-size", cfg.MemTableSize, "Pebble memtable bytes (larger: fewer compactions, more memory)")
	fs.IntVar(&cfg.VersionCache, "version-cache-keys", cfg.VersionCache, "keys whose newest version (no value) the write path keeps in memory, about 180 bytes each; -1: none")
	fs.BoolVar(&cfg.HugePages, "huge-pages", cfg.HugePages, "back Pebble's memtables with transparent huge pages (a cgo build under the kernel's madvise mode executes itself once with GLIBC_TUNABLES="+hugepages.Tunable+")")
	fs.Var(&cfg.CacheSize, "cache-size", "Pebble block cache, e.g. 1GiB (reads and the write path's read of a key's previous version hit memory below it)")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).URL = v }, "NAME=URL"}, "peer", "a peer cluster as NAME=URL (repeatable)")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).Secret = v }, "NAME=SECRET"}, "peer-secret", "a peer's shared secret as NAME=SECRET (repeatable)")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).SecretFile = v }, "NAME=PATH"}, "peer-secret-file", "a peer's shared secret read from NAME=PATH, trimmed (repeatable)")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).AllowUnproven = v == "true" }, "NAME=true"}, "peer-allow-unproven",
		"NAME=true: send the secret to nodes of peer NAME that cannot prove they hold it because they run a build before proofs (only while NAME upgrades)")
	fs.BoolVar(&cfg.InsecurePeers, "insecure-peers", cfg.InsecurePeers, "allow peers without a secret (closed networks and tests only)")
	fs.IntVar(&cfg.BatchEntries, "batch-max-entries", cfg.BatchEntries, "most entries in one outgoing batch")
	fs.IntVar(&cfg.BatchBytes, "batch-max-bytes", cfg.BatchBytes, "most bytes in one outgoing batch")
	fs.Var(&cfg.SecretOverlap, "secret-overlap", "how long a link takes the second secret of its secret file after it appeared (a rotation; SIGHUP rereads the files)")
	fs.Var(&cfg.ShutdownTimeout, "shutdown-timeout", "bound on a graceful stop (SIGTERM): past it the node exits at once, as after a crash, which loses nothing acknowledged; a second signal exits at once too")
	fs.Var(&cfg.BatchLinger, "batch-linger", "how long a batch waits to fill (0: not at all; a link's next batch fills while one is on the wire)")
	fs.Int64Var(&cfg.ReplicateMax, "replicate-max-bytes", cfg.ReplicateMax, "largest incoming batch in bytes")
	fs.Var(&cfg.PinWindow, "pin-window", "how old a pinned idempotency stamp may be")
	fs.Var(&cfg.IdemWindow, "idempotency-window", "how long an Idempotency-Key's record is kept (default 24h, or the tombstone retention when shorter; never above it)")
	fs.Uint64Var(&cfg.HighEntries, "wal-high-water-entries", cfg.HighEntries, "saturate when a peer's backlog passes this many entries")
	fs.Uint64Var(&cfg.LowEntries, "wal-low-water-entries", cfg.LowEntries, "leave saturation below this many (default half the high mark)")
	fs.Int64Var(&cfg.HighBytes, "wal-high-water-bytes", cfg.HighBytes, "saturate when a peer's backlog passes this many bytes")
	fs.Int64Var(&cfg.LowBytes, "wal-low-water-bytes", cfg.LowBytes, "leave saturation below this many bytes (default half the high mark)")
	fs.Var(&cfg.HighAge, "wal-high-water-age", "saturate when a peer's oldest unacknowledged entry is older")
	fs.Var(&cfg.LowAge, "wal-low-water-age", "leave saturation below this age (default half the high mark)")
	fs.Var(optDuration{&cfg.IdentityWait}, "identity-check-wait", "at start, how long writes wait for every peer to confirm this node's stream was not used by a restored or copied directory (0s does not wait)")
	fs.Var(optDuration{&cfg.AdmissionWait}, "admission-wait", "how long a write waits while saturated before it is refused (0s refuses at once)")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).Compression = v }, "NAME=zstd|none"}, "peer-compression", "NAME=zstd|none: compress batches to that peer with zstd when its nodes say they decode it (default none; worth it across a WAN). Seeds the cluster's log once: change it later with replicator compression")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).Include = append(cfg.peer(n).Include, v) }, "NAME=PREFIX"}, "peer-include", "NAME=PREFIX: only keys under this prefix cross to that peer (repeatable; every key when none). Seeds the cluster's log once: change it later with replicator peers filter")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).Bandwidth = v }, "NAME=RATE"}, "peer-bandwidth", "NAME=RATE: at most RATE bytes per second to that peer, counted as sent (compressed), e.g. 20MiB; re-seeds and backfills take at most half. Seeds the cluster's log once: change it later with replicator bandwidth")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).Exclude = append(cfg.peer(n).Exclude, v) }, "NAME=PREFIX"}, "peer-exclude", "NAME=PREFIX: keys under this prefix never cross to that peer (repeatable). Seeds the cluster's log once, as --peer-include")
	fs.Var(namedFlag{func(n, v string) { cfg.peer(n).Overflow = v }, "NAME=reject|detach"}, "peer-overflow", "NAME=reject|detach: what a peer's backlog overflow does (default reject)")
	fs.IntVar(&cfg.Permits, "replay-permits", cfg.Permits, "incoming batches applied at once")
	fs.Int64Var(&cfg.MinBodyRate, "min-body-rate", cfg.MinBodyRate, "slowest a request body may arrive, bytes/s after a 10 s grace (-1 off)")
	fs.IntVar(&cfg.MaxConns, "max-connections", cfg.MaxConns, "connections each listener holds at once (-1 no bound)")
	fs.IntVar(&cfg.MaxBodies, "max-bodies-in-flight", cfg.MaxBodies, "replication batches read at once (each peer a quarter)")
	fs.IntVar(&cfg.PermitQueue, "replay-queue", cfg.PermitQueue, "incoming batches waiting for a permit")
	fs.Var(&cfg.LinkLagging, "link-lagging", "a link is lagging past this long without contact, or with its oldest unacknowledged write this old")
	fs.Var(&cfg.LinkStalled, "link-stalled", "a link is stalled past this long (alert on it)")
	fs.BoolVar(&cfg.NoAutoReseed, "no-auto-reseed", cfg.NoAutoReseed, "re-seed peers only when asked (POST /admin/peers/NAME/reseed)")
	fs.StringVar(&cfg.GossipBind, "gossip-bind", cfg.GossipBind, "HOST:PORT for memberlist gossip (peer discovery); off when empty")
	fs.StringVar(&cfg.GossipAdvertise, "gossip-advertise", cfg.GossipAdvertise, "HOST:PORT other nodes reach the gossip port at (default --gossip-bind)")
	fs.Var(listFlag{&cfg.Join, "HOST:PORT"}, "join", "a gossip seed HOST:PORT (repeatable)")
	fs.StringVar(&cfg.GossipKeyFile, "gossip-key-file", cfg.GossipKeyFile, "file with the base64 memberlist encryption key (16, 24 or 32 bytes); nodes without it cannot join")
	fs.StringVar(&cfg.GossipProfile, "gossip-profile", cfg.GossipProfile, "memberlist timing: wan, lan or local (default: local on a loopback --gossip-bind, where every member is on one machine, else wan)")
	fs.StringVar(&cfg.AdvertiseAPI, "advertise-api", cfg.AdvertiseAPI, "URL the other nodes reach this node's API at, gossiped (default from --listen)")
	fs.StringVar(&cfg.AdvertiseRepl, "advertise-replicate", cfg.AdvertiseRepl, "URL peers reach this node's replicate endpoint at, gossiped and told in acks (default from --peer-listen or --listen)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate: serve TLS, and present it to peers")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM key of --tls-cert")
	fs.Var(&cfg.TLSReload, "tls-reload-interval", "how often --tls-cert/--tls-key are checked for a new certificate (SIGHUP reloads at once)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", cfg.TLSClientCA, "PEM CA of peers' client certificates: mutual TLS on links")
	fs.StringVar(&cfg.PeerCA, "peer-ca", cfg.PeerCA, "PEM CA of peers' server certificates (default --tls-client-ca)")
	fs.StringVar(&cfg.PeerSANMode, "peer-san-mode", cfg.PeerSANMode, "how a peer certificate names its cluster: uri (replicator://cluster/ID) or dns (first label)")
	fs.StringVar(&cfg.PeerListen, "peer-listen", cfg.PeerListen, "separate HOST:PORT for /v1/replicate (mutual TLS there, not on the API)")
	fs.StringVar(&cfg.RESPListen, "resp-listen", cfg.RESPListen, "HOST:PORT of the Redis-protocol front door (off when empty; the API's TLS and token; docs/RESP.md)")
	fs.StringVar(&cfg.APITokenFile, "api-token-file", cfg.APITokenFile, "file with the bearer token the API (and, without --admin-token-file, the admin endpoints) require")
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", cfg.AdminTokenFile, "file with the bearer token the admin endpoints (/admin/*: membership, peers, detach) require instead of the API token")
	return fs
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// nodeOptions turns the parsed configuration into node options; every
// problem is reported at once.
func (cfg *serveConfig) nodeOptions(log *slog.Logger) (*node.Options, error) {
	o := &node.Options{
		ClusterID:            cfg.ClusterID,
		ReassignOrigin:       cfg.ReassignOrigin,
		DataDir:              cfg.Data,
		NodeID:               cfg.NodeID,
		Listen:               cfg.Listen,
		MaxKeyBytes:          cfg.MaxKeyBytes,
		MaxValueBytes:        cfg.MaxValueBytes,
		TombstoneRetention:   time.Duration(cfg.TombstoneRetention),
		ConflictRetention:    time.Duration(cfg.ConflictRetention),
		ConflictMaxBytes:     cfg.ConflictMaxBytes,
		ConflictValueMax:     cfg.ConflictValueMax,
		AntiEntropyRepair:    cfg.AERepair,
		AntiEntropyBandwidth: int64(cfg.AEBandwidth),
		AntiEntropyCPU:       cfg.AECPU,
		AntiEntropyInterval:  aeInterval(cfg.AEInterval),
		MaxClockOffset:       time.Duration(cfg.MaxClockOffset),
		Logger:               log,
	}
	var errs []error
	pairs := map[string]*secret.Pair{}
	names := make([]string, 0, len(cfg.Peers))
	for name := range cfg.Peers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := cfg.Peers[name]
		secret := p.Secret
		if p.SecretFile != "" {
			if secret != "" {
				errs = append(errs, fmt.Errorf("peer %s: give a secret or a secret file, not both", name))
			}
			send, also, err := readSecretFile(p.SecretFile)
			if err != nil {
				// The file is what to fix: the peer is left out of the
				// node's options, whose "has no secret" would point at
				// --insecure-peers.
				errs = append(errs, fmt.Errorf("peer %s: %w", name, err))
				continue
			}
			secret = send
			pairs[name] = cfg.secretPair(name, send, also)
		}
		if secret == redacted {
			errs = append(errs, fmt.Errorf("peer %s: the secret is the placeholder --print-config writes; give the real one (or secret_file)", name))
		}
		bw, err := parseRate(p.Bandwidth)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: bandwidth: %w", name, err))
			continue
		}
		o.Peers = append(o.Peers, node.Peer{Name: name, URL: p.URL, Secret: secret, Secrets: pairs[name], Overflow: p.Overflow, AllowUnproven: p.AllowUnproven,
			Compression: p.Compression, Include: p.Include, Exclude: p.Exclude, Bandwidth: bw})
	}
	o.InsecurePeers = cfg.InsecurePeers
	o.MaxBatchEntries = cfg.BatchEntries
	o.MaxBatchBytes = cfg.BatchBytes
	o.BatchLinger = time.Duration(cfg.BatchLinger)
	if o.BatchLinger == 0 {
		o.BatchLinger = -1 // no linger
	}
	o.MaxReplicateBytes = cfg.ReplicateMax
	o.PinWindow = time.Duration(cfg.PinWindow)
	o.IdempotencyWindow = time.Duration(cfg.IdemWindow)
	o.WaterMarks = api.WaterMarks{HighEntries: cfg.HighEntries, LowEntries: cfg.LowEntries, HighBytes: cfg.HighBytes,
		LowBytes: cfg.LowBytes, HighAge: time.Duration(cfg.HighAge), LowAge: time.Duration(cfg.LowAge)}
	if cfg.AdmissionWait != nil {
		o.AdmissionWait = time.Duration(*cfg.AdmissionWait)
		if o.AdmissionWait == 0 {
			o.AdmissionWait = -1 // refuse at once
		}
	}
	if cfg.IdentityWait != nil {
		o.IdentityCheckWait = time.Duration(*cfg.IdentityWait)
		if o.IdentityCheckWait == 0 {
			o.IdentityCheckWait = -1 // do not wait
		}
	}
	o.Permits, o.PermitQueue, o.NoAutoReseed = cfg.Permits, cfg.PermitQueue, cfg.NoAutoReseed
	o.MinBodyRate, o.MaxConnections, o.MaxBodiesInFlight = cfg.MinBodyRate, cfg.MaxConns, cfg.MaxBodies
	o.TLSCert, o.TLSKey, o.TLSClientCA, o.PeerCA = cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, cfg.PeerCA
	o.TLSReloadInterval = time.Duration(cfg.TLSReload)
	o.LinkLagging, o.LinkStalled = time.Duration(cfg.LinkLagging), time.Duration(cfg.LinkStalled)
	o.PeerSANMode, o.PeerListen, o.RESPListen = cfg.PeerSANMode, cfg.PeerListen, cfg.RESPListen
	testing, err := node.TestingFromEnv(os.Getenv)
	if err != nil {
		errs = append(errs, err)
	}
	o.Testing = testing
	o.Pprof, o.PprofListen = cfg.Pprof, cfg.PprofListen
	o.MemTableSize = cfg.MemTableSize
	o.CacheSize = int64(cfg.CacheSize)
	o.VersionCacheKeys = cfg.VersionCache
	for _, tf := range []struct {
		flag, path string
		into       *string
	}{{"--api-token-file", cfg.APITokenFile, &o.APIToken}, {"--admin-token-file", cfg.AdminTokenFile, &o.AdminToken}} {
		if tf.path == "" {
			continue
		}
		b, err := os.ReadFile(tf.path)
		switch {
		case err != nil:
			errs = append(errs, secretFileError(tf.flag, tf.path, err))
		case strings.TrimSpace(string(b)) == "":
			errs = append(errs, fmt.Errorf("%s %s is empty", tf.flag, tf.path))
		default:
			*tf.into = strings.TrimSpace(string(b))
		}
	}
	if cfg.GossipBind != "" {
		g := &node.GossipOptions{Bind: cfg.GossipBind, Advertise: cfg.GossipAdvertise, Join: cfg.Join, Profile: cfg.GossipProfile,
			APIURL: cfg.AdvertiseAPI, ReplicateURL: cfg.AdvertiseRepl}
		if cfg.GossipKeyFile != "" {
			key, err := readGossipKey(cfg.GossipKeyFile)
			if err != nil {
				errs = append(errs, err)
			}
			g.Key = key
		}
		o.Gossip = g
	} else if len(cfg.Join) > 0 || cfg.GossipKeyFile != "" || cfg.AdvertiseAPI != "" || cfg.AdvertiseRepl != "" {
		errs = append(errs, errors.New("--join, --gossip-key-file, --advertise-api and --advertise-replicate need --gossip-bind"))
	}
	if cfg.SecretsKeyFile != "" {
		key, err := readKey("--secrets-key-file", cfg.SecretsKeyFile)
		if err == nil && len(key) != secret.KeySize {
			err = fmt.Errorf("--secrets-key-file %s: a key of %d bytes, want %d (openssl rand -base64 32)", cfg.SecretsKeyFile, len(key), secret.KeySize)
		}
		if err != nil {
			errs = append(errs, err)
		}
		o.SecretsKey = key
	}
	o.Groups = cfg.Groups
	if cfg.RaftListen != "" {
		o.Raft = &node.RaftOptions{Listen: cfg.RaftListen, Advertise: cfg.RaftAdvertise, BootstrapExpect: cfg.BootstrapExpect,
			ElectionTimeout: time.Duration(cfg.RaftElection), AcceptGossipKey: cfg.RaftAcceptGossip}
		if cfg.RaftKeyFile != "" {
			key, err := readKey("--raft-key-file", cfg.RaftKeyFile)
			if err == nil && len(key) < 16 {
				err = fmt.Errorf("--raft-key-file %s: a key of %d bytes, want at least 16 (openssl rand -base64 32)", cfg.RaftKeyFile, len(key))
			}
			if err != nil {
				errs = append(errs, err)
			}
			o.Raft.Key = key
		} else if cfg.RaftAcceptGossip {
			errs = append(errs, errors.New("--raft-accept-gossip-key needs --raft-key-file"))
		}
	} else if cfg.RaftAdvertise != "" || cfg.BootstrapExpect != 0 || cfg.RaftKeyFile != "" {
		errs = append(errs, errors.New("--raft-advertise, --raft-key-file and --bootstrap-expect need --raft-listen (a node of a cluster of several)"))
	}
	if cfg.Origin != "" {
		if cfg.ClusterID != "" {
			errs = append(errs, errors.New("give --cluster-id or --origin, not both"))
		}
		r, err := origin.ParseSpec(cfg.Origin)
		if err != nil {
			errs = append(errs, err)
		}
		o.ClusterID, o.Origin = "", r
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}

// secretFileError says why a secret file (a peer secret, a token, a key)
// could not be read. One that is there but not readable by this process
// says so and names the uid the node runs as: a file made under umask 077
// and mounted into the image, which runs as 65532, is the usual case, and
// no other flag is the fix.
func secretFileError(what, path string, err error) error {
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%s %s: permission denied: this node runs as uid %d (gid %d), and the file must be readable by it "+
			"(give the file to that user, or run the node as the file's owner)", what, path, os.Getuid(), os.Getgid())
	}
	return fmt.Errorf("%s: %w", what, err)
}

// readGossipKey reads a base64 memberlist key (as `openssl rand -base64 32`
// prints), trimmed.
func readGossipKey(path string) ([]byte, error) {
	key, err := readKey("--gossip-key-file", path)
	if err != nil {
		return nil, err
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("--gossip-key-file %s: a key of %d bytes, want 16, 24 or 32", path, n)
	}
	return key, nil
}

// readKey reads a base64 key (as `openssl rand -base64 32` prints), trimmed.
func readKey(flag, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, secretFileError(flag, path, err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%s %s: not base64: %w", flag, path, err)
	}
	return key, nil
}

func runServe(args []string) error {
	cfg := defaultServeConfig()
	if p := configPath(args); p != "" {
		if err := loadConfigFile(p, cfg); err != nil {
			return err
		}
	}
	fs := serveFlags(cfg)
	unknownEnv, envErr := applyEnv(fs, os.Environ())
	if err := parse(fs, args); err != nil {
		return err
	}
	if envErr != nil {
		return envErr
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %q", fs.Args())
	}
	// Before anything is logged or opened: this may execute the binary
	// again, which then starts here from the top.
	huge, hugeErr := hugepages.Off, error(nil)
	if fs.Lookup("print-config").Value.String() != "true" {
		huge, hugeErr = hugepages.Ensure(cfg.HugePages)
	}
	log, err := newLogger(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	if len(unknownEnv) > 0 {
		log.Warn("environment variables that name no serve flag are ignored", "vars", strings.Join(unknownEnv, ","))
	}
	opts, err := cfg.nodeOptions(log)
	if fs.Lookup("print-config").Value.String() == "true" {
		if perr := printConfig(cfg, opts); perr != nil {
			return perr
		}
		return err // printed, and refused if it would not start
	}
	if err != nil {
		return err
	}
	if hugeErr != nil {
		log.Warn("memory", "huge_pages", string(huge), "err", hugeErr)
	} else {
		log.Info("memory", "huge_pages", string(huge))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	n, err := node.Open(ctx, opts)
	if err != nil {
		return err
	}
	if err := n.Start(); err != nil {
		n.Close()
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// Registered before the loop, so that no signal between the first and
	// the stop is lost: the first ends the loop, a second the stop.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if ctx.Err() != nil {
		sigs <- syscall.SIGTERM // came during the start: stop now
	}
	for {
		select {
		case <-sigs:
			return closeBounded(n.Close, time.Duration(cfg.ShutdownTimeout), sigs, log)
		case <-n.Fatal():
			// A reason a restart does not fix (logged by the node): exit
			// non-zero, so that the operator looks; the stop is bounded
			// as any other.
			cerr := closeBounded(n.Close, time.Duration(cfg.ShutdownTimeout), sigs, log)
			return errors.Join(n.FatalErr(), cerr)
		case <-hup:
			_ = n.ReloadTLS() // logged either way
			cfg.reloadSecrets(log)
		}
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

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
	Listen             string   `yaml:"listen"`
	MaxKeyBytes        int      `yaml:"max_key_bytes"`
	MaxValueBytes      int      `yaml:"max_value_bytes"`
	TombstoneRetention duration `yaml:"tombstone_retention"`
	MaxClockOffset     duration `yaml:"max_clock_offset"`
	LogLevel           string   `yaml:"log_level"`
	LogFormat          string   `yaml:"log_format"`
	// ClockOffset shifts this node's physical clock. For robustness tests of
	// clock skew only.
	ClockOffset duration `yaml:"test_clock_offset"`
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

func (d *duration) String() string     { return time.Duration(*d).String() }
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

// configPath finds --config before the flags are parsed, so that the file
// is loaded first and every flag then overrides it.
func configPath(args []string) string {
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
	return ""
}

func serveFlags(cfg *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.String("config", "", "YAML file with the same settings (flags win)")
	fs.StringVar(&cfg.ClusterID, "cluster-id", cfg.ClusterID, "this node's cluster ID ([a-z0-9][a-z0-9-]{0,62}); same as --origin static:ID")
	fs.StringVar(&cfg.Origin, "origin", cfg.Origin, "how the cluster ID is resolved: static:ID, env:VAR, file:PATH, hostname:REGEX")
	fs.BoolVar(&cfg.ReassignOrigin, "reassign-origin", cfg.ReassignOrigin, "take over a data directory pinned to another cluster ID (logged)")
	fs.StringVar(&cfg.Data, "data", cfg.Data, "data directory (created if missing)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API address")
	fs.IntVar(&cfg.MaxKeyBytes, "max-key-bytes", cfg.MaxKeyBytes, "largest key in bytes")
	fs.IntVar(&cfg.MaxValueBytes, "max-value-bytes", cfg.MaxValueBytes, "largest value in bytes")
	fs.Var(&cfg.TombstoneRetention, "tombstone-retention", "how long tombstones are kept at least")
	fs.Var(&cfg.MaxClockOffset, "max-clock-offset", "how far ahead of the local clock a remote stamp may be")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
	fs.Var(&cfg.ClockOffset, "test-clock-offset", "shift this node's clock (robustness tests only)")
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
		ClusterID:          cfg.ClusterID,
		ReassignOrigin:     cfg.ReassignOrigin,
		DataDir:            cfg.Data,
		Listen:             cfg.Listen,
		MaxKeyBytes:        cfg.MaxKeyBytes,
		MaxValueBytes:      cfg.MaxValueBytes,
		TombstoneRetention: time.Duration(cfg.TombstoneRetention),
		MaxClockOffset:     time.Duration(cfg.MaxClockOffset),
		Logger:             log,
	}
	var errs []error
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
	if cfg.ClockOffset != 0 {
		o.Clock = offsetClock(time.Duration(cfg.ClockOffset))
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}

func runServe(args []string) error {
	cfg := &serveConfig{LogLevel: "info", LogFormat: "text"}
	if p := configPath(args); p != "" {
		if err := loadConfigFile(p, cfg); err != nil {
			return err
		}
	}
	fs := serveFlags(cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	log, err := newLogger(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	opts, err := cfg.nodeOptions(log)
	if err != nil {
		return err
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
	<-ctx.Done()
	log.Info("shutting down")
	return n.Close()
}

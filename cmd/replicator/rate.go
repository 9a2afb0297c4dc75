package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// parseRate reads a bandwidth: bytes per second as a number with an
// optional unit (B, KB, MB, GB, KiB, MiB, GiB) and an optional "/s";
// "", "0" and "none" are no limit.
func parseRate(v string) (int64, error) {
	v = strings.TrimSuffix(strings.TrimSpace(v), "/s")
	if v == "" || v == "0" || v == "none" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSpace(strings.TrimSuffix(v, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f*mult > 1<<50 {
		return 0, fmt.Errorf("%q: want bytes per second, e.g. 20MiB, 500KB or 1048576 (0: no limit)", v)
	}
	return int64(f * mult), nil
}

// byteSize reads a rate such as "4MiB" (parseRate) from a flag or YAML.
type byteSize int64

func (b *byteSize) Set(s string) error { v, err := parseRate(s); *b = byteSize(v); return err }
func (b *byteSize) String() string {
	if b == nil {
		return "0"
	}
	return human(int64(*b))
}
func (*byteSize) Type() string { return "RATE" }
func (b *byteSize) UnmarshalYAML(n *yaml.Node) error {
	if err := b.Set(n.Value); err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	return nil
}
func (b byteSize) MarshalYAML() (any, error) { return human(int64(b)), nil }

// aeInterval is --antientropy-interval as the node takes it: 0 (never) is
// negative there, where 0 is the default.
func aeInterval(d duration) time.Duration {
	if d == 0 {
		return -1
	}
	return time.Duration(d)
}

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/replicator/replicator/client"
)

// outputFlags is -o/--output table|json on every command that prints a
// result (--json, the older spelling, stays).
type outputFlags struct{ format string }

func (o *outputFlags) register(fs *flag.FlagSet) {
	o.format = "table"
	const usage = "output format: table (for people) or json (for scripts)"
	fs.StringVar(&o.format, "o", o.format, usage)
	fs.StringVar(&o.format, "output", o.format, usage+"; same as -o")
	fs.BoolFunc("json", "same as -o json", func(v string) error {
		if v == "true" {
			o.format = "json"
		}
		return nil
	})
}

func (o *outputFlags) check() error {
	switch o.format {
	case "table", "json":
		return nil
	}
	return usagef("-o %q: want table or json", o.format)
}

// parseOut registers -o on fs, parses args and checks the format: the
// start of every command that prints a result and takes no client flags.
func parseOut(fs *flag.FlagSet, args []string) (*outputFlags, error) {
	var out outputFlags
	out.register(fs)
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	return &out, out.check()
}

// print writes v as indented JSON, or calls table with stdout.
func (o *outputFlags) print(v any, table func(w io.Writer)) error {
	if o.format == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	table(os.Stdout)
	return nil
}

// valueOut is a key's value for JSON output: text as a string, anything
// else (not UTF-8) base64-encoded under value_base64.
type valueOut struct {
	Key         string `json:"key"`
	Value       string `json:"value,omitempty"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
	Version     string `json:"version"`
	Origin      string `json:"origin"`
	Expires     string `json:"expires,omitempty"`
}

func newValueOut(key string, v []byte, version, origin string) valueOut {
	out := valueOut{Key: key, Version: version, Origin: origin}
	if utf8.Valid(v) {
		out.Value = string(v)
	} else {
		out.ValueBase64 = v
	}
	return out
}

// writeOut is a write's answer for JSON output.
type writeOut struct {
	client.WriteResult
	Replayed bool `json:"replayed"`
}

// human is a byte count in binary units.
func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// age is a duration in seconds as an operator reads it: 850ms, 4.2s, 3m12s.
func age(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// count is a number with thousands separators: 1,011,962.
func count[T ~int | ~int64 | ~uint64](n T) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is set at build time (-ldflags "-X main.Version=v1.2.3"); the
// module's version or VCS revision stands in otherwise.
var Version = ""

// version is this build's version string.
func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			if dirty {
				rev += "-dirty"
			}
			return "devel-" + rev
		}
	}
	return "devel"
}

// errHelp ends a command that printed its help: exit 0.
var errHelp = errors.New("help printed")

// parse parses fs from args with flags anywhere among the arguments (as
// kubectl and etcdctl do: `put KEY VALUE --addr URL`); "--" ends the flags.
// -h prints the command's flags, with their defaults, to stdout; flags named
// test-* are for tests and left out.
func parse(fs *flag.FlagSet, args []string) error {
	if completing != nil {
		completing(fs) // shell completion asks which flags there are
		return errHelp
	}
	// The flag package's own messages are off: a parse error is printed
	// once, by the caller, with a pointer to -h; the list is printed for -h
	// alone.
	fs.SetOutput(io.Discard)
	usage := func() {
		fmt.Fprintf(os.Stdout, "Flags of replicator %s (anywhere among the arguments):\n", fs.Name())
		fs.VisitAll(func(f *flag.Flag) {
			if strings.HasPrefix(f.Name, "test-") {
				return
			}
			name, usage := flag.UnquoteUsage(f)
			if t, ok := f.Value.(interface{ Type() string }); ok {
				name = t.Type()
			}
			line := "  --" + f.Name
			if len(f.Name) == 1 {
				line = "  -" + f.Name // -o, as it is typed
			}
			if name != "" {
				line += " " + name
			}
			line += "\n      " + usage
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "[]" {
				line += fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintln(os.Stdout, line)
		})
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				usage()
				return errHelp
			}
			return usageError{fmt.Errorf("%w (replicator %s -h lists its flags)", err, fs.Name())}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			pos = append(pos, rest...) // after "--", everything is an argument
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return fs.Parse(append([]string{"--"}, pos...))
}

// completing, while the shell completes a command line, receives the
// command's flag set from parse instead of a parse: each command builds its
// flags once, for running and for completing alike.
var completing func(fs *flag.FlagSet)

// completeFlags lists the flags run would parse that start with prefix.
func completeFlags(run func([]string) error, args []string, prefix string) []string {
	var names []string
	completing = func(fs *flag.FlagSet) {
		fs.VisitAll(func(f *flag.Flag) {
			if strings.HasPrefix(f.Name, "test-") {
				return
			}
			name := "--" + f.Name
			if len(f.Name) == 1 {
				name = "-" + f.Name
			}
			if strings.HasPrefix(name, prefix) {
				names = append(names, name+"\t"+f.Usage)
			}
		})
	}
	defer func() { completing = nil }()
	_ = run(args)
	return names
}

// envAddr is the default node address: $REPLICATOR_ADDR, or the default.
func envAddr() string {
	if a := os.Getenv("REPLICATOR_ADDR"); a != "" {
		return a
	}
	return "http://127.0.0.1:7400"
}

// runVersion prints this build's version (the same as --version).
func runVersion(args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	out, err := parseOut(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("version takes no arguments")
	}
	v := struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}{version(), runtime.Version()}
	return out.print(v, func(w io.Writer) { fmt.Fprintln(w, "replicator", v.Version) })
}

package hugepages

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	const madvise = "always [madvise] never\n"
	for _, c := range []struct {
		name      string
		env       []string
		mode      string
		cgo, want bool
		exec      bool
		state     State
		tunables  string // GLIBC_TUNABLES after, when exec
	}{
		{"madvise mode, cgo: exec with the tunable", []string{"PATH=/bin"}, madvise, true, true, true, On, Tunable},
		{"the operator's other tunables stay", []string{"GLIBC_TUNABLES=glibc.malloc.arena_max=2"}, madvise, true, true, true, On, "glibc.malloc.arena_max=2:" + Tunable},
		{"an empty variable", []string{"GLIBC_TUNABLES="}, madvise, true, true, true, On, Tunable},
		{"already set (the exec before, or the operator)", []string{"GLIBC_TUNABLES=" + Tunable, marker}, madvise, true, true, false, On, ""},
		{"the operator's value 2 (hugetlbfs)", []string{"GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"}, madvise, true, true, false, On, ""},
		{"set to off by the operator's tunable", []string{"GLIBC_TUNABLES=glibc.malloc.hugetlb=0"}, madvise, true, true, false, Off, ""},
		{"set, but no cgo: Go memory", []string{"GLIBC_TUNABLES=" + Tunable}, madvise, false, true, false, Unavailable, ""},
		{"set, but the kernel never does", []string{"GLIBC_TUNABLES=" + Tunable}, "always madvise [never]\n", true, true, false, Unavailable, ""},
		{"executed once, the tunable gone (glibc cleans a privileged process's environment)", []string{marker}, madvise, true, true, false, Unavailable, ""},
		{"turned off", nil, madvise, true, false, false, Off, ""},
		{"the kernel does it always", nil, "[always] madvise never\n", true, true, false, Always, ""},
		{"the kernel never does", nil, "always madvise [never]\n", true, true, false, Unavailable, ""},
		{"no mode file", nil, "", true, true, false, Unavailable, ""},
		{"no cgo: Go memory", nil, madvise, false, true, false, Unavailable, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := decide(c.env, c.mode, c.cgo, c.want)
			if d.exec != c.exec || d.state != c.state {
				t.Fatalf("decide: exec %v state %q, want exec %v state %q", d.exec, d.state, c.exec, c.state)
			}
			if !c.exec {
				return
			}
			var got []string
			for _, kv := range d.env {
				if v, ok := strings.CutPrefix(kv, "GLIBC_TUNABLES="); ok {
					got = append(got, v)
				}
			}
			if len(got) != 1 || got[0] != c.tunables {
				t.Fatalf("GLIBC_TUNABLES after: %q, want one, %q", got, c.tunables)
			}
			if !slices.Contains(d.env, marker) {
				t.Fatalf("no %s in the executed environment: it could execute itself again", marker)
			}
			for _, kv := range c.env {
				if !strings.HasPrefix(kv, "GLIBC_TUNABLES=") && !slices.Contains(d.env, kv) {
					t.Fatalf("%q lost from the environment: %q", kv, d.env)
				}
			}
		})
	}
}

// TestEnsureExecutesOnce runs Ensure in a child process (this test binary
// again): where the kernel and the build allow it, the child executes
// itself once, keeps its process ID, and comes back with the tunable set;
// elsewhere it runs on, in the state decide gives.
func TestEnsureExecutesOnce(t *testing.T) {
	if os.Getenv("HUGEPAGES_CHILD") == "1" {
		fmt.Printf("pid %d\n", os.Getpid())
		st, err := Ensure(true)
		comm, _ := os.ReadFile("/proc/self/comm")
		fmt.Printf("pid %d state %s tunables %q err %v comm %s\n", os.Getpid(), st, os.Getenv("GLIBC_TUNABLES"), err, strings.TrimSpace(string(comm)))
		return
	}
	// Bounded: an execution that repeats itself must fail here, not hang.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestEnsureExecutesOnce$", "-test.count=1")
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GLIBC_TUNABLES=") }), "HUGEPAGES_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "pid ") {
			lines = append(lines, l)
		}
	}
	mode, _ := os.ReadFile(modeFile)
	want := decide(nil, string(mode), cgoBuild, true)
	t.Logf("kernel mode %q, cgo %v: %q", strings.TrimSpace(string(mode)), cgoBuild, lines)
	if !want.exec {
		// No exec: one start, one answer, the state decide gave.
		if len(lines) != 2 || !strings.Contains(lines[1], "state "+string(want.state)) {
			t.Fatalf("child said %q, want one start in state %q", lines, want.state)
		}
		return
	}
	// Exec: the first image prints its pid and executes; the second prints
	// the pid again, executes nothing more (the tunable is set), and answers.
	if len(lines) != 3 {
		t.Fatalf("child said %q, want a start, a start after the exec, and an answer", lines)
	}
	pid := strings.Fields(lines[0])[1]
	if lines[1] != "pid "+pid || !strings.HasPrefix(lines[2], "pid "+pid+" state on tunables \""+Tunable+"\" err <nil>") {
		t.Fatalf("child said %q: want the same process, on, with %s", lines, Tunable)
	}
	// The process keeps its name: executed as /proc/self/exe it would be
	// "exe" to ps, pgrep and the journal.
	name := filepath.Base(os.Args[0])
	if len(name) > 15 { // the kernel keeps 15 bytes of a name
		name = name[:15]
	}
	if !strings.HasSuffix(lines[2], "comm "+name) {
		t.Fatalf("child said %q: its name after the execution is not %s", lines[2], name)
	}
}

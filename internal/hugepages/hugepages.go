// Package hugepages backs the process's large C allocations, Pebble's
// memtables first, with transparent huge pages where the kernel hands them
// out only on request.
//
// A write's memtable insert and a read of a key's previous version each walk
// Pebble's skiplist, 64 MiB of randomly placed nodes: on 4 KiB pages nearly
// every step is a TLB miss, which under a virtual machine's nested paging
// costs a walk of two page tables, and every first touch of a page is a
// fault. On 2 MiB pages the arena is 32 entries. Measured on the project
// machine (docs/PERFORMANCE.md, "Huge pages"): a's CPU per RESP SET fell by
// about a tenth at -P 16 (the memtable's share by a third) and more at -P 1.
//
// Pebble allocates its memtables (and block cache) with C's calloc in a
// cgo build, so the way in is glibc's malloc tunable glibc.malloc.hugetlb=1:
// malloc then asks madvise(MADV_HUGEPAGE) for what it maps. Tunables are
// read when the program starts, so the node executes itself once more with
// the tunable in its environment (same process ID, arguments and files).
// Nothing is done when it would change nothing: a build without cgo (its
// memtables are Go memory, which the runtime does not advise), a kernel whose
// transparent huge pages are "always" (already) or "never", an environment
// that already names the tunable, or the operator's opt-out.
package hugepages

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// Tunable is glibc's malloc tunable this package sets.
const Tunable = "glibc.malloc.hugetlb=1"

// envTunables is glibc's environment variable of tunables.
const envTunables = "GLIBC_TUNABLES"

// modeFile says the kernel's transparent huge page mode, the bracketed word.
const modeFile = "/sys/kernel/mm/transparent_hugepage/enabled"

// State is what the process's memory is backed by, for the node's log.
type State string

const (
	// On: glibc's malloc asks for huge pages (the tunable is set).
	On State = "on"
	// Always: the kernel backs every large anonymous mapping with huge
	// pages by itself.
	Always State = "always (kernel)"
	// Off: the operator turned it off.
	Off State = "off"
	// Unavailable: the kernel has none to give, or this build cannot ask
	// (no cgo: Pebble's memory is Go memory), or the re-execution failed.
	Unavailable State = "unavailable"
)

// marker is set in the environment of the execution Ensure makes: a process
// that finds it never executes again. glibc removes GLIBC_TUNABLES (or some
// of it) from a privileged process's environment (setuid, or file
// capabilities without NoNewPrivileges), so the tunable's absence alone
// would make it execute itself forever. Its name does not begin with
// REPLICATOR_, which serve reads as settings.
const marker = "_REPLICATOR_HUGE_PAGES=executed"

// decision is what Ensure would do: exec with env, or keep running in state.
type decision struct {
	exec  bool
	env   []string
	state State
}

// hugetlbValue returns the value glibc.malloc.hugetlb has in the
// environment's GLIBC_TUNABLES ("" when not set).
func hugetlbValue(env []string) string {
	for _, kv := range env {
		v, ok := strings.CutPrefix(kv, envTunables+"=")
		if !ok {
			continue
		}
		for _, t := range strings.Split(v, ":") {
			if val, ok := strings.CutPrefix(t, "glibc.malloc.hugetlb="); ok {
				return val
			}
		}
		return ""
	}
	return ""
}

// decide is Ensure's choice from what it reads: the environment, the
// kernel's mode file's contents ("" when absent), whether this build calls C
// for its memory, and whether the operator wants it.
func decide(env []string, mode string, cgo, want bool) decision {
	switch v := hugetlbValue(env); {
	case v == "0":
		return decision{state: Off} // the operator's tunable says no
	case v != "" && cgo && !strings.Contains(mode, "[never]") && mode != "":
		return decision{state: On} // set here, by the operator or by the exec before
	case v != "":
		return decision{state: Unavailable}
	}
	executed := slices.Contains(env, marker)
	switch {
	case !want:
		return decision{state: Off}
	case strings.Contains(mode, "[always]"):
		return decision{state: Always}
	case !strings.Contains(mode, "[madvise]") || !cgo || executed:
		// executed: the tunable did not survive the exec (a privileged
		// process, whose environment glibc cleans): never again.
		return decision{state: Unavailable}
	}
	out := make([]string, 0, len(env)+2)
	set := false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, envTunables+"="); ok {
			// Other tunables the operator set stay; glibc separates them
			// with colons.
			kv = envTunables + "=" + strings.TrimSuffix(v, ":") + ":" + Tunable
			if v == "" {
				kv = envTunables + "=" + Tunable
			}
			set = true
		}
		out = append(out, kv)
	}
	if !set {
		out = append(out, envTunables+"="+Tunable)
	}
	return decision{exec: true, env: append(out, marker), state: On}
}

// Ensure executes the running binary again with glibc's huge page tunable
// when that would back its memory with huge pages (want: the operator's
// --huge-pages). It returns only when it did not execute, with the state
// the process runs in, and the error of an execution that failed (the
// process runs on, unavailable). Call it before the process opens anything
// it must not lose: the new image starts from main.
func Ensure(want bool) (State, error) {
	mode, _ := os.ReadFile(modeFile)
	d := decide(os.Environ(), string(mode), cgoBuild, want)
	if !d.exec {
		return d.state, nil
	}
	if err := execSelf(os.Args, d.env); err != nil {
		return Unavailable, fmt.Errorf("hugepages: execute %s again: %w", os.Args[0], err)
	}
	return d.state, nil // not reached
}

package hugepages

import (
	"os"
	"strings"
	"syscall"
)

// execSelf replaces the process's image by the binary it runs from. It
// executes the file /proc/self/exe resolves to, so that the process keeps
// its name (a process executed as /proc/self/exe is named "exe" by the
// kernel: pgrep and the journal would lose it); /proc/self/exe itself when
// the file was removed or replaced since (its resolved name then ends in
// " (deleted)").
func execSelf(args, env []string) error {
	path, err := os.Readlink("/proc/self/exe")
	if err != nil || strings.HasSuffix(path, " (deleted)") {
		path = "/proc/self/exe"
	}
	return syscall.Exec(path, args, env)
}

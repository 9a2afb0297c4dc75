package hugepages

import "syscall"

// execSelf replaces the process's image by the binary it runs from, which
// /proc/self/exe names even when the file was replaced or removed since.
func execSelf(args, env []string) error {
	return syscall.Exec("/proc/self/exe", args, env)
}

//go:build !linux

package hugepages

import "errors"

func execSelf(args, env []string) error {
	return errors.New("hugepages: only on Linux")
}

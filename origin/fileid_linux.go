//go:build linux

package origin

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// identify says which file path is: its inode, and its birth time where the
// file system keeps one (ext4, xfs, btrfs). ok is false when it does not
// exist.
func identify(path string) (fileID, bool, error) {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_INO|unix.STATX_BTIME, &st)
	if errors.Is(err, unix.ENOENT) {
		return fileID{}, false, nil
	}
	if errors.Is(err, unix.ENOSYS) {
		fi, err := os.Stat(path)
		if err != nil {
			return fileID{}, false, err
		}
		return fileID{Ino: inode(fi)}, true, nil
	}
	if err != nil {
		return fileID{}, false, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	id := fileID{Ino: st.Ino}
	if st.Mask&unix.STATX_BTIME != 0 {
		id.Btime = st.Btime.Sec*1e9 + int64(st.Btime.Nsec)
	}
	return id, true, nil
}

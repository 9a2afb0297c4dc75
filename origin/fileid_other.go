//go:build !linux

package origin

import (
	"errors"
	"os"
)

// identify says which file path is, by its inode where the platform has
// one (0 otherwise: no copy is detected).
func identify(path string) (fileID, bool, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fileID{}, false, nil
	}
	if err != nil {
		return fileID{}, false, err
	}
	return fileID{Ino: inode(fi)}, true, nil
}

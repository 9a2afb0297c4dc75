// Package segfile repairs tidwall/wal segment directories before tidwall
// opens them: the cluster's log (wal) and the old outbound WAL it migrates (internal/legacywal) share it.
package segfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	twal "github.com/tidwall/wal"
)

// FinishPendingTruncation lets tidwall complete a truncation a crash
// interrupted (its .START/.END files) before the segments are scanned.
// tidwall renames those files before it loads the tail, so even an Open
// that then fails on a torn tail has finished them.
func FinishPendingTruncation(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".START") || strings.HasSuffix(e.Name(), ".END") {
			if tw, err := twal.Open(dir, &twal.Options{AllowEmpty: true, NoCopy: true}); err == nil {
				tw.Close()
			}
			return nil
		}
	}
	return nil
}

// TruncateSync cuts the file at path to size bytes and fsyncs it.
func TruncateSync(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

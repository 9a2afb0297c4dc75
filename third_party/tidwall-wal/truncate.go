package wal

// Moved out of wal.go unchanged (PATCHES.md): the project keeps every file
// under 800 lines.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tidwall/tinylru"
)

func (l *Log) ClearCache() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.corrupt {
		return ErrCorrupt
	} else if l.closed {
		return ErrClosed
	}
	l.clearCache()
	return nil
}

func (l *Log) clearCache() {
	l.scache.Range(func(_, v interface{}) bool {
		s := v.(*segment)
		s.ebuf = nil
		s.epos = nil
		return true
	})
	l.scache = tinylru.LRU{}
	l.scache.Resize(l.opts.SegmentCacheSize)
}

// atomicWrite performs an temp write + rename to ensure the file writing is
// and atomic operation. One os.WriteFile alone is not good enough.
func (l *Log) atomicWrite(name string, data []byte) error {
	// Create a TEMP file
	tempName := name + ".TEMP"
	defer os.RemoveAll(tempName)
	if err := func() error {
		f, err := os.OpenFile(tempName, os.O_CREATE|os.O_RDWR|os.O_TRUNC,
			l.opts.FilePerms)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.Write(data); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		return f.Close()
	}(); err != nil {
		return err
	}
	// Rename the TEMP file to final name
	return os.Rename(tempName, name)
}

// TruncateFront truncates the front of the log by removing all entries that
// are before the provided `index`. In other words the entry at `index` becomes
// the first entry in the log.
//
// The `AllowEmpty` option may be used to allow for removing all entries in the
// log by providing `LastIndex+1` as the index. Otherwise without `AllowEmpty`,
// at least one entry must always remain following a truncate.
func (l *Log) TruncateFront(index uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.corrupt {
		return ErrCorrupt
	} else if l.closed {
		return ErrClosed
	}
	return l.truncateFront(index)
}

func (l *Log) truncateFront(index uint64) (err error) {
	if index < l.firstIndex || index > l.lastIndex+1 {
		return ErrOutOfRange
	}
	if !l.opts.AllowEmpty && index == l.lastIndex+1 {
		return ErrOutOfRange
	}
	if index == l.firstIndex {
		// nothing to truncate
		return nil
	}
	var segIdx int
	var s *segment
	var ebuf []byte
	if index == l.lastIndex+1 {
		// Truncate all entries, only care about the last segment
		segIdx = len(l.segments) - 1
		s = l.segments[segIdx]
		ebuf = nil
	} else {
		segIdx = l.findSegment(index)
		s, err = l.loadSegment(index)
		if err != nil {
			return err
		}
		epos := s.epos[index-s.index:]
		ebuf = s.ebuf[epos[0].pos:]
	}
	// Create a START file contains the truncated segment.
	startName := filepath.Join(l.path, segmentName(index)+".START")
	if err = l.atomicWrite(startName, ebuf); err != nil {
		return fmt.Errorf("failed to create start segment: %w", err)
	}
	// The log was truncated but still needs some file cleanup. Any errors
	// following this message will not cause an on-disk data ocorruption, but
	// may cause an inconsistency with the current program, so we'll return
	// ErrCorrupt so the the user can attempt a recover by calling Close()
	// followed by Open().
	defer func() {
		if v := recover(); v != nil {
			err = ErrCorrupt
		}
		if err != nil {
			l.corrupt = true
		}
	}()
	if segIdx == len(l.segments)-1 {
		// Close the tail segment file
		if err = l.sfile.Close(); err != nil {
			return err
		}
	}
	// Delete truncated segment files
	for i := 0; i <= segIdx; i++ {
		if err = os.Remove(l.segments[i].path); err != nil {
			return err
		}
	}
	// Rename the START file to the final truncated segment name.
	newName := filepath.Join(l.path, segmentName(index))
	if err = os.Rename(startName, newName); err != nil {
		return err
	}
	s.path = newName
	s.index = index
	if segIdx == len(l.segments)-1 {
		// Reopen the tail segment file
		l.sfile, err = os.OpenFile(newName, os.O_WRONLY, l.opts.FilePerms)
		if err != nil {
			return err
		}
		var n int64
		if n, err = l.sfile.Seek(0, 2); err != nil {
			return err
		}
		if n != int64(len(ebuf)) {
			err = errors.New("invalid seek")
			return err
		}
		// Load the last segment entries
		if err = l.loadSegmentEntries(s); err != nil {
			return err
		}
	}
	l.segments = append([]*segment{}, l.segments[segIdx:]...)
	l.firstIndex = index
	l.clearCache()
	return nil
}

// TruncateBack truncates the back of the log by removing all entries that
// are after the provided `index`. In other words the entry at `index` becomes
// the last entry in the log.
//
// The `AllowEmpty` option may be used to allow for removing all entries in the
// log by providing `FirstIndex()-1` as the index. Otherwise without
// `AllowEmpty`, at least one entry must always remain following a truncate.
func (l *Log) TruncateBack(index uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.corrupt {
		return ErrCorrupt
	} else if l.closed {
		return ErrClosed
	}
	return l.truncateBack(index)
}

func (l *Log) truncateBack(index uint64) (err error) {
	if index < l.firstIndex-1 || index > l.lastIndex {
		return ErrOutOfRange
	}
	if !l.opts.AllowEmpty && index == l.firstIndex-1 {
		return ErrOutOfRange
	}
	if index == l.lastIndex {
		// nothing to truncate
		return nil
	}
	var segIdx int
	var s *segment
	var ebuf []byte
	if index == l.firstIndex-1 {
		// Truncate all entries, only care about the first segment
		segIdx = 0
		s = l.segments[segIdx]
		ebuf = nil
	} else {
		segIdx = l.findSegment(index)
		s, err = l.loadSegment(index)
		if err != nil {
			return err
		}
		epos := s.epos[:index-s.index+1]
		ebuf = s.ebuf[:epos[len(epos)-1].end]
	}
	// Create an END file contains the truncated segment.
	endName := filepath.Join(l.path, segmentName(s.index)+".END")
	if err = l.atomicWrite(endName, ebuf); err != nil {
		return fmt.Errorf("failed to create end segment: %w", err)
	}
	// The log was truncated but still needs some file cleanup. Any errors
	// following this message will not cause an on-disk data ocorruption, but
	// may cause an inconsistency with the current program, so we'll return
	// ErrCorrupt so the the user can attempt a recover by calling Close()
	// followed by Open().
	defer func() {
		if v := recover(); v != nil {
			err = ErrCorrupt
		}
		if err != nil {
			l.corrupt = true
		}
	}()

	// Close the tail segment file
	if err = l.sfile.Close(); err != nil {
		return err
	}
	// Delete truncated segment files
	for i := segIdx; i < len(l.segments); i++ {
		if err = os.Remove(l.segments[i].path); err != nil {
			return err
		}
	}
	// Rename the END file to the final truncated segment name.
	newName := filepath.Join(l.path, segmentName(s.index))
	if err = os.Rename(endName, newName); err != nil {
		return err
	}
	// Reopen the tail segment file
	l.sfile, err = os.OpenFile(newName, os.O_WRONLY, l.opts.FilePerms)
	if err != nil {
		return err
	}
	var n int64
	n, err = l.sfile.Seek(0, 2)
	if err != nil {
		return err
	}
	if n != int64(len(ebuf)) {
		err = errors.New("invalid seek")
		return err
	}
	s.path = newName
	l.segments = append([]*segment{}, l.segments[:segIdx+1]...)
	l.lastIndex = index
	l.clearCache()
	if err = l.loadSegmentEntries(s); err != nil {
		return err
	}
	return nil
}

// Sync performs an fsync on the log. This is not necessary when the
// NoSync option is set to false.
func (l *Log) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.corrupt {
		return ErrCorrupt
	} else if l.closed {
		return ErrClosed
	}
	return l.sfile.Sync()
}

// IsEmpty returns true if there are no entries in the log.
func (l *Log) IsEmpty() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.corrupt {
		return false, ErrCorrupt
	} else if l.closed {
		return false, ErrClosed
	}
	return (l.firstIndex == 0 && l.lastIndex == 0) ||
		l.firstIndex > l.lastIndex, nil
}

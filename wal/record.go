package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
)

// Records. Each raft entry is one record, inside tidwall's binary framing
// (uvarint length, data). Version 2, written now:
//
//	2 | CRC-32C(first || body) | first (8, big-endian) | body
//
// where first is the raft index of the first entry of the StoreLogs call
// that wrote the record. One StoreLogs is one write and one fsync, so a crash
// tears at most the last append: a whole record of a later append found after
// damage tells corruption from a torn tail (repair.go). Version 1
//
//	1 | CRC-32C(body) | body
//
// was written by earlier builds and is still read; it says nothing of its
// append. body is the same in both: index, term (uvarints), type (1 byte),
// data, extensions (uvarint length, bytes), appended-at (varint Unix
// nanoseconds, 0 for none).
//
// The stable state file is framed as version 1: atomicfile writes it whole
// or not at all, so there is no append to name.
const (
	recordV1 = 1
	recordV2 = 2
	headerV1 = 1 + 4     // version, CRC-32C
	headerV2 = 1 + 4 + 8 // version, CRC-32C, first
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frame prepends version 1 and the CRC-32C of body (the stable state).
func frame(dst, body []byte) []byte {
	dst = append(dst, recordV1)
	dst = binary.BigEndian.AppendUint32(dst, crc32.Checksum(body, castagnoli))
	return append(dst, body...)
}

// unframe checks a record of either version and returns its body and the
// first index of the append that wrote it (0 for version 1, which does not
// say).
func unframe(rec []byte) (body []byte, first uint64, err error) {
	if len(rec) < headerV1 {
		return nil, 0, fmt.Errorf("record of %d bytes", len(rec))
	}
	var covered []byte
	switch rec[0] {
	case recordV1:
		body, covered = rec[headerV1:], rec[headerV1:]
	case recordV2:
		if len(rec) < headerV2 {
			return nil, 0, fmt.Errorf("record of %d bytes", len(rec))
		}
		body, covered = rec[headerV2:], rec[headerV1:]
		first = binary.BigEndian.Uint64(rec[headerV1:])
	default:
		return nil, 0, fmt.Errorf("record version %d, want %d or %d", rec[0], recordV1, recordV2)
	}
	if got, want := crc32.Checksum(covered, castagnoli), binary.BigEndian.Uint32(rec[1:]); got != want {
		return nil, 0, fmt.Errorf("checksum mismatch (crc32c %08x, record says %08x)", got, want)
	}
	return body, first, nil
}

// encode appends one log entry's version 2 record, for an append whose
// first entry is first.
func encode(dst []byte, first uint64, l *raft.Log) ([]byte, error) {
	if first > l.Index {
		// decode would refuse the record: a caller's bug, caught before it
		// reaches the disk.
		return dst, fmt.Errorf("wal: entry %d in an append from %d", l.Index, first)
	}
	start := len(dst)
	dst = append(dst, recordV2, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint64(dst, first)
	dst = appendBody(dst, l)
	binary.BigEndian.PutUint32(dst[start+1:], crc32.Checksum(dst[start+headerV1:], castagnoli))
	return dst, nil
}

// appendBody appends the body of an entry's record, the same in every
// version.
func appendBody(dst []byte, l *raft.Log) []byte {
	dst = binary.AppendUvarint(dst, l.Index)
	dst = binary.AppendUvarint(dst, l.Term)
	dst = append(dst, byte(l.Type))
	dst = binary.AppendUvarint(dst, uint64(len(l.Data)))
	dst = append(dst, l.Data...)
	dst = binary.AppendUvarint(dst, uint64(len(l.Extensions)))
	dst = append(dst, l.Extensions...)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	return binary.AppendVarint(dst, at)
}

// decode reads a record of either version, bounding every length by what is
// there. first is the first index of the append that wrote it (0 for
// version 1).
func decode(rec []byte, l *raft.Log) (first uint64, err error) {
	body, first, err := unframe(rec)
	if err != nil {
		return 0, err
	}
	r := reader{b: body}
	l.Index = r.uvarint()
	l.Term = r.uvarint()
	l.Type = raft.LogType(r.byte())
	l.Data = r.bytes()
	l.Extensions = r.bytes()
	at := r.varint()
	l.AppendedAt = time.Time{}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d bytes after the entry", len(r.b))
	}
	if r.err == nil && rec[0] == recordV2 && first > l.Index {
		// An append begins at or before each of its entries.
		r.err = fmt.Errorf("entry %d says its append began at %d", l.Index, first)
	}
	return first, r.err
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("bad uvarint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errors.New("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = errors.New("short record")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("length %d beyond the record's %d bytes", n, len(r.b))
		return nil
	}
	if n == 0 {
		return nil
	}
	out := append([]byte(nil), r.b[:n]...)
	r.b = r.b[n:]
	return out
}

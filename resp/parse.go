// Package resp is a node's Redis-protocol front door (docs/RESP.md): a
// RESP2/RESP3 listener that speaks to the same node Go API as the HTTP
// surface. This file reads commands, bounded before anything is allocated.
package resp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// ErrProtocol is the class of requests that do not parse or break a bound:
// the connection answers one error and is closed (the stream cannot be
// resynchronised).
var ErrProtocol = errors.New("resp: protocol error")

// ErrHTTP is a connection whose first line is an HTTP request line or
// header: a web page's form posted to the port must not run as inline
// commands (Redis guards the same way). Closed without an answer.
var ErrHTTP = errors.New("resp: an HTTP request on the RESP port")

// Limits bound what one command may claim.
type Limits struct {
	// MaxArgs bounds a command's arguments (MSET of many keys is one
	// command).
	MaxArgs int
	// MaxBulk bounds one argument (a key or a value).
	MaxBulk int
	// MaxInline bounds an inline command's line (telnet, not clients).
	MaxInline int
	// MaxCommand bounds the bytes of one command, all arguments together.
	MaxCommand int
}

// DefaultLimits are what a node uses unless told otherwise: a value of 1 MiB
// and its key fit one argument.
func DefaultLimits() Limits {
	return Limits{MaxArgs: 1 << 16, MaxBulk: 1<<20 + 4096, MaxInline: 64 << 10, MaxCommand: 64 << 20}
}

// reader reads commands from a connection.
type reader struct {
	br     *bufio.Reader
	limits Limits
	// first is true until a command was read: only the first line may be
	// an HTTP request line; later an inline POST is refused the same way.
	first bool
	// src, when the reader reads a connection, is told where commands
	// begin and end (the rate bound of a command being read).
	src *source
	// budget, when set, holds the arguments read (held counts them until
	// the caller gives them back).
	budget *budget
	held   int64
}

func newReader(r io.Reader, l Limits) *reader {
	return &reader{br: bufio.NewReaderSize(r, 64<<10), limits: l, first: true}
}

// release gives back to the budget the arguments read so far.
func (r *reader) release() {
	if r.budget != nil {
		r.budget.give(r.held)
	}
	r.held = 0
}

// buffered reports whether another command is already read from the
// connection (a pipeline): the caller takes it before answering.
func (r *reader) buffered() bool { return r.br.Buffered() > 0 }

// line reads one CRLF-terminated line of at most max bytes, without the
// CRLF. The bytes are valid until the next read.
func (r *reader) line(max int) ([]byte, error) {
	b, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		if len(b) > max {
			return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrProtocol, max)
		}
		// A line longer than the buffer but within max: gather it.
		buf := append([]byte(nil), b...)
		for errors.Is(err, bufio.ErrBufferFull) {
			b, err = r.br.ReadSlice('\n')
			buf = append(buf, b...)
			if len(buf) > max+2 {
				return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrProtocol, max)
			}
		}
		b = buf
	}
	if err != nil {
		return nil, err
	}
	b = b[:len(b)-1]
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	if len(b) > max {
		return nil, fmt.Errorf("%w: a line longer than %d bytes", ErrProtocol, max)
	}
	return b, nil
}

// read returns the next command's arguments (the name first). io.EOF at a
// command's boundary is a clean end.
func (r *reader) read() ([][]byte, error) {
	for {
		args, err := r.readOne()
		if err != nil || len(args) > 0 {
			return args, err
		}
		// An empty command (*0, a blank line): Redis skips it.
	}
}

func (r *reader) readOne() ([][]byte, error) {
	first := r.first
	r.first = false
	c, err := r.br.ReadByte()
	if err != nil {
		return nil, err
	}
	if r.src != nil {
		r.src.begin()
		defer r.src.end()
	}
	if c != '*' {
		if err := r.br.UnreadByte(); err != nil {
			return nil, err
		}
		return r.inline(first)
	}
	hdr, err := r.line(32)
	if err != nil {
		return nil, unexpected(err)
	}
	n, err := strconv.Atoi(string(hdr))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: invalid multibulk length %q", ErrProtocol, hdr)
	case n <= 0:
		return nil, nil
	case n > r.limits.MaxArgs:
		return nil, fmt.Errorf("%w: %d arguments, at most %d", ErrProtocol, n, r.limits.MaxArgs)
	}
	// Never allocate for what is claimed: a slice grows as arguments come.
	args := make([][]byte, 0, min(n, 16))
	total := 0
	for i := 0; i < n; i++ {
		c, err := r.br.ReadByte()
		if err != nil {
			return nil, unexpected(err)
		}
		if c != '$' {
			return nil, fmt.Errorf("%w: expected '$', got %q", ErrProtocol, c)
		}
		hdr, err := r.line(32)
		if err != nil {
			return nil, unexpected(err)
		}
		size, err := strconv.Atoi(string(hdr))
		switch {
		case err != nil || size < 0:
			return nil, fmt.Errorf("%w: invalid bulk length %q", ErrProtocol, hdr)
		case size > r.limits.MaxBulk:
			return nil, fmt.Errorf("%w: an argument of %d bytes, at most %d", ErrProtocol, size, r.limits.MaxBulk)
		}
		if total += size; total > r.limits.MaxCommand {
			return nil, fmt.Errorf("%w: a command of more than %d bytes", ErrProtocol, r.limits.MaxCommand)
		}
		arg, err := r.bulk(size + 2)
		if err != nil {
			return nil, err
		}
		if arg[size] != '\r' || arg[size+1] != '\n' {
			return nil, fmt.Errorf("%w: a bulk argument not ended by CRLF", ErrProtocol)
		}
		args = append(args, arg[:size:size])
	}
	return args, nil
}

// bulkChunk is what a bulk argument is read and charged by: an argument
// claimed large is allocated as its bytes come, not as it is claimed.
const bulkChunk = 256 << 10

// bulk reads n bytes of an argument, charging them to the budget as they
// arrive.
func (r *reader) bulk(n int) ([]byte, error) {
	arg := make([]byte, 0, min(n, bulkChunk))
	for len(arg) < n {
		k := min(n-len(arg), bulkChunk)
		if r.budget != nil {
			if !r.budget.take(int64(k)) {
				return nil, fmt.Errorf("%w: %w", ErrProtocol, ErrBudget)
			}
			r.held += int64(k)
		}
		arg = slices.Grow(arg, k)
		if _, err := io.ReadFull(r.br, arg[len(arg):len(arg)+k]); err != nil {
			return nil, unexpected(err)
		}
		arg = arg[:len(arg)+k]
	}
	return arg, nil
}

// inline reads a command written as a line of words (telnet). Words are
// split on spaces; "double" and 'single' quotes group words, as redis-cli's
// own parser does, with \" and \\ escapes in double quotes.
func (r *reader) inline(first bool) ([][]byte, error) {
	b, err := r.line(r.limits.MaxInline)
	if err != nil {
		return nil, unexpected(err)
	}
	if looksHTTP(b, first) {
		return nil, ErrHTTP
	}
	args, err := splitInline(b)
	if err != nil {
		return nil, err
	}
	if len(args) > r.limits.MaxArgs {
		return nil, fmt.Errorf("%w: %d arguments, at most %d", ErrProtocol, len(args), r.limits.MaxArgs)
	}
	return args, nil
}

// looksHTTP: a request line (POST, GET, ... HTTP/1.x) first, or a POST or
// Host: header at any time, as Redis refuses them.
func looksHTTP(line []byte, first bool) bool {
	lower := bytes.ToLower(line)
	if bytes.HasPrefix(lower, []byte("post ")) || bytes.HasPrefix(lower, []byte("host:")) {
		return true
	}
	return first && bytes.Contains(lower, []byte(" http/1."))
}

func splitInline(b []byte) ([][]byte, error) {
	var args [][]byte
	i := 0
	for {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		if i == len(b) {
			return args, nil
		}
		var word []byte
		switch q := b[i]; q {
		case '"', '\'':
			i++
			closed := false
			for i < len(b) {
				c := b[i]
				if c == '\\' && q == '"' && i+1 < len(b) {
					word = append(word, b[i+1])
					i += 2
					continue
				}
				if c == q {
					closed = true
					i++
					break
				}
				word = append(word, c)
				i++
			}
			if !closed || (i < len(b) && b[i] != ' ' && b[i] != '\t') {
				return nil, fmt.Errorf("%w: unbalanced quotes in request", ErrProtocol)
			}
		default:
			start := i
			for i < len(b) && b[i] != ' ' && b[i] != '\t' {
				i++
			}
			word = append([]byte(nil), b[start:i]...)
		}
		if word == nil {
			word = []byte{}
		}
		args = append(args, word)
	}
}

// unexpected turns an end of input inside a command into a protocol error
// (io.EOF is only clean between commands).
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %w", ErrProtocol, io.ErrUnexpectedEOF)
	}
	return err
}

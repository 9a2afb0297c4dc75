package resp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func readAll(t testing.TB, in string, l Limits) ([][][]byte, error) {
	t.Helper()
	r := newReader(strings.NewReader(in), l)
	var out [][][]byte
	for {
		args, err := r.read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, args)
	}
}

// TestReadCommands: multibulk and inline commands, pipelined, with quotes.
func TestReadCommands(t *testing.T) {
	got, err := readAll(t, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\nx!\r\n*0\r\nGET \"a b\" 'c'\r\nPING\n", DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"SET", "k", "v\r\nx!"}, {"GET", "a b", "c"}, {"PING"}}
	if len(got) != len(want) {
		t.Fatalf("%d commands, want %d: %q", len(got), len(want), got)
	}
	for i := range want {
		for j := range want[i] {
			if string(got[i][j]) != want[i][j] {
				t.Fatalf("command %d arg %d: %q, want %q", i, j, got[i][j], want[i][j])
			}
		}
	}
}

// TestReadBounds: every bound refuses before allocating what is claimed,
// and a truncated command is a protocol error, not a clean end.
func TestReadBounds(t *testing.T) {
	l := Limits{MaxArgs: 4, MaxBulk: 10, MaxInline: 20, MaxCommand: 15}
	for _, c := range []struct{ name, in string }{
		{"too many args", "*5\r\n"},
		{"huge multibulk", "*99999999999\r\n"},
		{"bulk too long", "*1\r\n$11\r\n"},
		{"huge bulk", "*1\r\n$4294967296\r\n"},
		{"negative bulk", "*1\r\n$-1\r\n"},
		{"command too long", "*2\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n"},
		{"inline too long", strings.Repeat("a", 30) + "\r\n"},
		{"no dollar", "*1\r\n:1\r\n"},
		{"bad terminator", "*1\r\n$1\r\nab\r\n"},
		{"truncated", "*2\r\n$3\r\nGET\r\n"},
		{"unbalanced quote", "GET \"a\r\n"},
		{"bad length", "*x\r\n"},
	} {
		_, err := readAll(t, c.in, l)
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want a protocol error", c.name, err)
		}
	}
}

// TestHTTPRefused: a connection whose first line is an HTTP request, or
// that sends POST or Host: inline, is refused (a web page's form must not
// run commands).
func TestHTTPRefused(t *testing.T) {
	for _, in := range []string{"POST / HTTP/1.1\r\n", "GET / HTTP/1.1\r\n", "PING\r\nHost: example.com\r\n", "PING\r\npost /x\r\n"} {
		_, err := readAll(t, in, DefaultLimits())
		if !errors.Is(err, ErrHTTP) {
			t.Errorf("%q: %v, want ErrHTTP", in, err)
		}
	}
	if _, err := readAll(t, "GET k\r\nGET / HTTP/1.1\r\n", DefaultLimits()); err != nil {
		t.Errorf("a later GET with spaces is a command: %v", err)
	}
}

// FuzzReadCommand: no input panics, allocates past the bounds, or reads
// arguments longer than allowed.
func FuzzReadCommand(f *testing.F) {
	for _, s := range []string{"*1\r\n$4\r\nPING\r\n", "PING\r\n", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "SET \"a\\\"b\" 'c d'\r\n", "*-1\r\n", "*1\r\n$-1\r\n", "POST / HTTP/1.1\r\n"} {
		f.Add([]byte(s))
	}
	l := Limits{MaxArgs: 64, MaxBulk: 256, MaxInline: 256, MaxCommand: 1024}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := newReader(bytes.NewReader(b), l)
		for i := 0; i < 100; i++ {
			args, err := r.read()
			if err != nil {
				return
			}
			if len(args) == 0 || len(args) > l.MaxArgs {
				t.Fatalf("%d args", len(args))
			}
			total := 0
			for _, a := range args {
				if len(a) > max(l.MaxBulk, l.MaxInline) {
					t.Fatalf("an argument of %d bytes", len(a))
				}
				total += len(a)
			}
			if total > max(l.MaxCommand, l.MaxInline) {
				t.Fatalf("a command of %d bytes", total)
			}
		}
	})
}

package bench

import (
	"strconv"
	"testing"
)

// The bodies are built with appends; they must say what fmt's %q said.
func TestAppendKeyQuotesAsFmt(t *testing.T) {
	for _, prefix := range []string{"oneway", "a\"b", "é/\\x", ""} {
		for _, i := range []int64{0, 7, 123456789012, 9999999999999} {
			got := string(appendKey([]byte("x"), prefix, i))
			want := "x" + strconv.Quote(key(prefix, int(i)))
			if got != want {
				t.Errorf("appendKey(%q, %d) = %s, want %s", prefix, i, got, want)
			}
		}
	}
}

package resp

import (
	"fmt"
	"testing"
)

// TestSubstr: GETRANGE's offsets as Redis reads them (its own tests'
// cases).
func TestSubstr(t *testing.T) {
	v := []byte("Hello World")
	for _, tc := range []struct {
		start, end int64
		want       string
	}{
		{0, 3, "Hell"}, {-3, -1, "rld"}, {0, -1, "Hello World"}, {10, 100, "d"}, {5, 3, ""},
		{-1, -5, ""}, {-100, 2, "Hel"}, {20, 30, ""},
	} {
		if got := string(substr(v, tc.start, tc.end)); got != tc.want {
			t.Errorf("substr(%d, %d) = %q, want %q", tc.start, tc.end, got, tc.want)
		}
	}
	if got := substr(nil, 0, -1); len(got) != 0 {
		t.Errorf("of nothing: %q", got)
	}
}

func FuzzSubstr(f *testing.F) {
	f.Add([]byte("abc"), int64(-2), int64(5))
	f.Fuzz(func(t *testing.T, v []byte, start, end int64) {
		got := substr(v, start, end)
		if len(got) > len(v) {
			t.Fatal(fmt.Sprintf("%d bytes of %d", len(got), len(v)))
		}
	})
}

package replica

import (
	"testing"
	"time"
)

// The wait between tries to begin a term grows and stays bounded however
// long the failures last (it once wrapped to zero after a minute).
func TestTermBackoffBounded(t *testing.T) {
	prev := time.Duration(0)
	for f := 1; f < 200; f++ {
		d := termBackoff(f)
		if d < prev || d <= 0 || d > time.Second {
			t.Fatalf("termBackoff(%d) = %v after %v: want growing, in (0, 1s]", f, d, prev)
		}
		prev = d
	}
	if termBackoff(1) != 20*time.Millisecond || termBackoff(100) != time.Second {
		t.Fatalf("termBackoff(1) = %v, termBackoff(100) = %v", termBackoff(1), termBackoff(100))
	}
}

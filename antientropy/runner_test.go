package antientropy

import (
	"testing"
	"time"
)

// TestPaceWaits: a background comparison pauses after each request for
// what its byte budget and its CPU share ask, whichever is longer; the zero
// pace (an operator's command) never pauses.
func TestPaceWaits(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		p    pace
		took time.Duration
		n    int64
		want time.Duration
	}{
		{pace{}, 100 * ms, 1 << 20, 0},
		{pace{cpu: 0.25}, 100 * ms, 0, 300 * ms},
		{pace{cpu: 1}, 100 * ms, 0, 0},
		{pace{bytes: 1 << 20}, 100 * ms, 1 << 20, 900 * ms},
		{pace{bytes: 1 << 20, cpu: 0.25}, 100 * ms, 1 << 20, 900 * ms},
		{pace{bytes: 1 << 20, cpu: 0.25}, 500 * ms, 1 << 19, 1500 * ms},
		{pace{bytes: 1 << 20}, 2 * time.Second, 1 << 20, 0},
	} {
		if got := c.p.wait(c.took, c.n); got != c.want {
			t.Errorf("%+v after %s and %d bytes: %s, want %s", c.p, c.took, c.n, got, c.want)
		}
	}
}

package links

import (
	"testing"
	"time"

	"github.com/replicator/replicator/api"
)

// TestHistoryRing: the ring keeps the newest samples, oldest first, and
// after() returns only what a page has not seen.
func TestHistoryRing(t *testing.T) {
	h := newHistory(4)
	at := func(i int) time.Time { return time.Unix(1000+int64(i), 0) }
	for i := 0; i < 3; i++ {
		h.add(api.HistorySample{Time: at(i)})
	}
	if got := h.after(time.Time{}); len(got) != 3 || !got[0].Time.Equal(at(0)) || !got[2].Time.Equal(at(2)) {
		t.Fatalf("before wrapping: %v", got)
	}
	for i := 3; i < 10; i++ {
		h.add(api.HistorySample{Time: at(i)})
	}
	got := h.after(time.Time{})
	if len(got) != 4 {
		t.Fatalf("after wrapping: %d samples, want 4", len(got))
	}
	for i, s := range got {
		if !s.Time.Equal(at(6 + i)) {
			t.Fatalf("sample %d is %v, want %v (oldest first)", i, s.Time, at(6+i))
		}
	}
	if got := h.after(at(8)); len(got) != 1 || !got[0].Time.Equal(at(9)) {
		t.Fatalf("after the 8th: %v", got)
	}
}

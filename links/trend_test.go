package links

import (
	"math"
	"testing"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/transport"
)

// TestTrendForecast: the seconds to a high-water mark follow from the last
// minute's write and drain rates, on a clock the test moves.
func TestTrendForecast(t *testing.T) {
	marks := api.WaterMarks{HighEntries: 10_000, HighBytes: 1 << 30, HighAge: 10 * time.Minute}
	near := func(got *float64, want float64) bool { return got != nil && math.Abs(*got-want) < 0.01 }

	// 100 writes/s in, 50/s acknowledged, 100 bytes each: the backlog grows
	// 50/s, and at 1,000 entries it has 180 s to the 10,000 mark.
	var tr trend
	var acked, backlog uint64
	var bl transport.Backlog
	for s := 0; s <= 20; s++ {
		bl = transport.Backlog{Acked: acked, Entries: backlog, Bytes: int64(backlog) * 100, OldestAge: time.Second}
		tr.observe(time.Duration(s)*time.Second, bl)
		if s == 3 {
			if f := tr.forecast(bl, marks); f.SecondsToLimit != nil || f.WriteRate != 0 {
				t.Fatalf("a forecast from 3 s of history: %+v", f)
			}
			// ... but a mark reached is reached, history or not.
			if f := tr.forecast(transport.Backlog{Entries: 10_000}, marks); !near(f.SecondsToLimit, 0) || f.Mark != "entries" {
				t.Fatalf("at the entries mark with 3 s of history: %+v", f)
			}
		}
		acked += 50
		backlog += 50
	}
	f := tr.forecast(bl, marks)
	if f.WriteRate != 100 || f.DrainRate != 50 || f.Mark != "entries" || !near(f.SecondsToLimit, (10_000-1_000)/50.0) {
		t.Fatalf("growing 50/s at 1,000 of 10,000: %+v (seconds %v)", f, deref(f.SecondsToLimit))
	}
	// The bytes mark, nearer, wins.
	m := marks
	m.HighBytes = 150_000 // 100,000 now, growing 5,000 B/s: 10 s
	if f := tr.forecast(bl, m); f.Mark != "bytes" || !near(f.SecondsToLimit, 10) {
		t.Fatalf("bytes mark 10 s away: %+v (seconds %v)", f, deref(f.SecondsToLimit))
	}

	// Draining faster than writing: no forecast, the rates still shown.
	var dr trend
	for s := 0; s <= 10; s++ {
		dr.observe(time.Duration(s)*time.Second, transport.Backlog{Acked: uint64(200 * s), Entries: uint64(5000 - 100*s), Bytes: int64(500_000 - 10_000*s)})
	}
	if f := dr.forecast(transport.Backlog{Entries: 4000}, marks); f.SecondsToLimit != nil || f.DrainRate != 200 || f.WriteRate != 100 {
		t.Fatalf("draining: %+v", f)
	}

	// A peer that acknowledges nothing while writes wait: the age mark,
	// 10 min less the oldest entry's 9 min, is a minute away; writes at
	// 1/s would take hours to reach the entries mark.
	var st trend
	for s := 0; s <= 30; s++ {
		st.observe(time.Duration(s)*time.Second, transport.Backlog{Acked: 7, Entries: uint64(10 + s), Bytes: int64(100 * (10 + s))})
	}
	if f := st.forecast(transport.Backlog{Entries: 40, OldestAge: 9 * time.Minute}, marks); f.Mark != "age" || !near(f.SecondsToLimit, 60) {
		t.Fatalf("stalled: %+v (seconds %v)", f, deref(f.SecondsToLimit))
	}
	// Over a mark already: 0, not negative.
	if f := st.forecast(transport.Backlog{Entries: 40, OldestAge: 11 * time.Minute}, marks); !near(f.SecondsToLimit, 0) {
		t.Fatalf("over the age mark: %+v (seconds %v)", f, deref(f.SecondsToLimit))
	}

	// A position that goes back (a stream replaced, a rewind) starts the
	// trend again: no rate across it, no overflow into a forecast.
	var back trend
	for s := 0; s <= 10; s++ {
		back.observe(time.Duration(s)*time.Second, transport.Backlog{Acked: uint64(1000 + s), Entries: 1})
	}
	back.observe(11*time.Second, transport.Backlog{Acked: 3, Entries: 1})
	if f := back.forecast(transport.Backlog{Acked: 3, Entries: 1}, marks); f.WriteRate != 0 || f.SecondsToLimit != nil || len(back.obs) != 1 {
		t.Fatalf("after a rewind: %+v, %d observations", f, len(back.obs))
	}

	// Observations older than the span go; one a second is kept.
	var long trend
	for ms := 0; ms <= 300_000; ms += 100 {
		long.observe(time.Duration(ms)*time.Millisecond, transport.Backlog{})
	}
	if n := len(long.obs); n < 60 || n > 62 || long.obs[len(long.obs)-1].at-long.obs[0].at > trendSpan {
		t.Fatalf("%d observations kept over %s", n, long.obs[len(long.obs)-1].at-long.obs[0].at)
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

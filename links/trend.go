package links

import (
	"cmp"
	"math"
	"time"

	"github.com/replicator/replicator/api"
	"github.com/replicator/replicator/transport"
)

// A link's trend: its write and drain rates over the last minute, and from
// them how long until its backlog reaches a high-water mark, so that
// saturation is seen coming (docs/SATURATION.md, "Seeing it coming").

const (
	// trendEvery is the spacing of a trend's observations, trendSpan how
	// far back the rates look: a minute smooths a burst of writes and a
	// batch's ack, and still follows a change within a minute.
	trendEvery = time.Second
	trendSpan  = time.Minute
	// trendMin is the shortest history a forecast is made from.
	trendMin = 5 * time.Second
)

type trendObs struct {
	at      time.Duration // on the monotonic clock
	written uint64        // the stream's entries written (acked + backlog)
	acked   uint64
	bytes   int64
}

// trend is one link's observations, oldest first, at most one per
// trendEvery, over trendSpan.
type trend struct {
	obs []trendObs
	// last is the link's latest backlog, observed or not (a forecast
	// for /metrics is made from it).
	last transport.Backlog
}

// observe records the link at monotonic time at, from one snapshot of its
// backlog (bl.Acked with the figures measured from it). A position that
// goes back (the stream replaced, the link rewound to a peer behind) starts
// the trend again: rates across it would mean nothing.
func (t *trend) observe(at time.Duration, bl transport.Backlog) {
	t.last = bl
	o := trendObs{at: at, written: bl.Acked + bl.Entries, acked: bl.Acked, bytes: bl.Bytes}
	if n := len(t.obs); n > 0 {
		if last := t.obs[n-1]; o.written < last.written || o.acked < last.acked {
			t.obs = t.obs[:0]
		} else if at-last.at < trendEvery {
			return
		}
	}
	t.obs = append(t.obs, o)
	cut := 0
	for cut < len(t.obs)-1 && at-t.obs[cut+1].at >= trendSpan {
		cut++
	}
	t.obs = t.obs[cut:]
}

// forecast is the link's rates and, when its backlog grows toward a high
// mark (or its oldest entry ages with nothing drained), the seconds until
// it gets there at those rates.
func (t *trend) forecast(bl transport.Backlog, marks api.WaterMarks) api.Forecast {
	var f api.Forecast
	best, mark := math.Inf(1), ""
	consider := func(secs float64, m string) {
		if secs < best {
			best, mark = max(secs, 0), m
		}
	}
	// Over a mark already: 0, whatever the rates (refused writes stop the
	// growth, not the saturation).
	switch {
	case marks.HighEntries > 0 && bl.Entries >= marks.HighEntries:
		consider(0, "entries")
	case marks.HighBytes > 0 && bl.Bytes >= marks.HighBytes:
		consider(0, "bytes")
	case marks.HighAge > 0 && bl.Entries > 0 && bl.OldestAge >= marks.HighAge:
		consider(0, "age")
	}
	if n := len(t.obs); n >= 2 && t.obs[n-1].at-t.obs[0].at >= trendMin {
		a, b := t.obs[0], t.obs[n-1]
		dt := (b.at - a.at).Seconds()
		f.WriteRate = float64(b.written-a.written) / dt
		f.DrainRate = float64(b.acked-a.acked) / dt
		g := f.WriteRate - f.DrainRate
		if c := cmp.Or(bl.Capacity, t.last.Capacity); c > 0 {
			// The link's bandwidth limit caps what it can drain, however
			// fast it drained a moment ago: writes above it grow the
			// backlog.
			f.Capacity = c
			g = max(g, f.WriteRate-c)
		}
		if g > 0 && marks.HighEntries > 0 {
			consider((float64(marks.HighEntries)-float64(bl.Entries))/g, "entries")
		}
		if g := float64(b.bytes-a.bytes) / dt; g > 0 && marks.HighBytes > 0 {
			consider(float64(marks.HighBytes-bl.Bytes)/g, "bytes")
		}
		// Nothing drained over the span and something waits: the oldest
		// entry ages a second a second.
		if f.DrainRate == 0 && bl.Entries > 0 && marks.HighAge > 0 {
			consider((marks.HighAge - bl.OldestAge).Seconds(), "age")
		}
	}
	if mark != "" {
		f.SecondsToLimit, f.Mark = &best, mark
	}
	return f
}

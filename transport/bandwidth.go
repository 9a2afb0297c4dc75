package transport

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// A link's bandwidth limit (LinkSettings.Bandwidth, from the cluster's log)
// is a token bucket of bytes per second over request bodies as sent (after
// compression): what crosses the WAN is what the operator pays for. Its
// burst is a quarter second of the rate, so that over any window of a few
// seconds the link stays within a few percent of its limit (a full bucket
// adds burst/window), and no batch is built larger than that (a single
// entry larger still waits for its tokens in turn). Re-seeds and
// backfills pass a second bucket of half the rate first: they take at most
// half the link, so live batches always have the other half (and all of it
// when no snapshot runs).

// minBurst keeps a small limit usable: a heartbeat or a small batch always
// fits.
const minBurst = 16 << 10

// snapshotKey marks a post of a re-seed or a backfill (its context).
type snapshotKey struct{}

func snapshotPost(ctx context.Context) context.Context {
	return entriesPost(context.WithValue(ctx, snapshotKey{}, true))
}

// entriesKey marks a post that carries entries (a live batch, a re-seed's
// or a backfill's): it passes the pause gate (Shipper.Pause).
type entriesKey struct{}

func entriesPost(ctx context.Context) context.Context {
	return context.WithValue(ctx, entriesKey{}, true)
}

// limiters holds a link's buckets; guarded by Shipper.mu.
type limiters struct {
	bytesPerSec   int64
	link, snap    *rate.Limiter
	throttledNano int64 // time posts waited for tokens, ever
}

// burstFor is the bucket size of a rate.
func burstFor(bps int64) int { return int(max(bps/4, minBurst)) }

// limiterLocked returns the link's buckets as the log's settings say now
// (nil, nil: no limit). REQUIRES: s.mu held.
func (s *Shipper) limitersLocked(bps int64) (link, snap *rate.Limiter) {
	l := &s.mu.bw
	if bps <= 0 {
		l.bytesPerSec, l.link, l.snap = 0, nil, nil
		return nil, nil
	}
	if l.bytesPerSec != bps || l.link == nil {
		l.bytesPerSec = bps
		if l.link == nil {
			l.link = rate.NewLimiter(rate.Limit(bps), burstFor(bps))
			l.snap = rate.NewLimiter(rate.Limit(bps/2), burstFor(bps/2))
		} else {
			// Changed at runtime: the buckets keep what they hold.
			l.link.SetLimit(rate.Limit(bps))
			l.link.SetBurst(burstFor(bps))
			l.snap.SetLimit(rate.Limit(bps / 2))
			l.snap.SetBurst(burstFor(bps / 2))
		}
	}
	return l.link, l.snap
}

// throttle waits until n bytes may go on the wire, and counts the wait.
// Charge takes n bytes exchanged with the peer outside this shipper's own
// posts (the answers to the peer's anti-entropy requests) from the link's
// bandwidth limit, waiting for them as a post does.
func (s *Shipper) Charge(ctx context.Context, n int) error { return s.throttle(ctx, n) }

func (s *Shipper) throttle(ctx context.Context, n int) error {
	bps := s.settings().Bandwidth
	s.mu.Lock()
	link, snap := s.limitersLocked(bps)
	s.mu.Unlock()
	if link == nil {
		return nil
	}
	t0 := time.Now()
	var err error
	if ctx.Value(snapshotKey{}) != nil {
		err = waitBytes(ctx, snap, n)
	}
	if err == nil {
		err = waitBytes(ctx, link, n)
	}
	if d := time.Since(t0); d > time.Millisecond {
		s.mu.Lock()
		s.mu.bw.throttledNano += int64(d)
		s.mu.Unlock()
	}
	return err
}

// waitBytes takes n tokens of l, a burst at a time when n is larger.
func waitBytes(ctx context.Context, l *rate.Limiter, n int) error {
	for n > 0 {
		take := min(n, l.Burst())
		if err := l.WaitN(ctx, take); err != nil {
			return err
		}
		n -= take
	}
	return nil
}

// budgetCap is the largest batch body the link's limit lets out at once
// (0: no cap): a live batch fits the link's burst, a snapshot's batch the
// snapshot bucket's.
func (s *Shipper) budgetCap(snapshot bool) int {
	bps := s.settings().Bandwidth
	if bps <= 0 {
		return 0
	}
	if snapshot {
		return burstFor(bps / 2)
	}
	return burstFor(bps)
}

// Throttled is how long posts of the link waited for its bandwidth limit.
func (s *Shipper) Throttled() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(s.mu.bw.throttledNano)
}

package policy

import (
	"errors"
	"sync"
	"time"
)

// ErrOpen is returned while a breaker's circuit is open.
var ErrOpen = errors.New("policy: circuit open: the dependency kept failing; not calling it until the cooldown passes")

// Breaker stops calls to a dependency that keeps failing: after Threshold
// consecutive failures the circuit opens for Cooldown, then lets one probe
// through (half-open); a success closes it, a failure opens it again.
type Breaker struct {
	Threshold int           // default 5
	Cooldown  time.Duration // default 10s
	// Now reads the clock; default time.Now. Tests drive it by hand.
	Now func() time.Time

	mu struct {
		sync.Mutex
		failures  int
		openUntil time.Time
		probing   bool
	}
}

// State names the breaker's state: "closed", "open" or "half-open".
func (b *Breaker) State() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.mu.openUntil.IsZero():
		return "closed"
	case b.now().Before(b.mu.openUntil):
		return "open"
	}
	return "half-open"
}

func (b *Breaker) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

// Allow returns ErrOpen while the circuit is open (and while a half-open
// probe is out).
func (b *Breaker) Allow() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.openUntil.IsZero() {
		return nil
	}
	if b.now().Before(b.mu.openUntil) || b.mu.probing {
		return ErrOpen
	}
	b.mu.probing = true
	return nil
}

// Record learns the outcome of an allowed call.
func (b *Breaker) Record(ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.probing = false
	if ok {
		b.mu.failures = 0
		b.mu.openUntil = time.Time{}
		return
	}
	b.mu.failures++
	threshold, cooldown := b.Threshold, b.Cooldown
	if threshold <= 0 {
		threshold = 5
	}
	if cooldown <= 0 {
		cooldown = 10 * time.Second
	}
	if b.mu.failures >= threshold || !b.mu.openUntil.IsZero() {
		b.mu.openUntil = b.now().Add(cooldown)
	}
}

package acceptor

import (
	"errors"
	"net/http"
	"time"

	"github.com/replicator/replicator/wire"
)

// arrivals are one sender's requests in progress.
type arrivals struct {
	active  int
	waiting int // of them, batches waiting in awaitSender
	// moved is closed (and replaced) when one of the sender's requests
	// arrives, ends or applies.
	moved chan struct{}
}

// gapGrace is how long a batch that finds a gap, with none of its sender's
// other requests in progress (or all of them waiting too), waits for the
// one before it to arrive: a sender keeps two batches on the wire, and on
// two connections the second can arrive first.
const gapGrace = 100 * time.Millisecond

// arrive counts a request of sender in; left counts it out.
func (a *Acceptor) arrive(sender string) (left func()) {
	a.mu.Lock()
	ar := a.mu.arrivals[sender]
	if ar == nil {
		ar = &arrivals{moved: make(chan struct{})}
		a.mu.arrivals[sender] = ar
	}
	ar.active++
	a.movedLocked(ar)
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		ar.active--
		a.movedLocked(ar)
		if ar.active == 0 {
			delete(a.mu.arrivals, sender)
		}
	}
}

func (a *Acceptor) movedLocked(ar *arrivals) {
	close(ar.moved)
	ar.moved = make(chan struct{})
}

// movedOf is the sender's current moved channel (nil if none in progress).
func (a *Acceptor) movedOf(sender string) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ar := a.mu.arrivals[sender]; ar != nil {
		return ar.moved
	}
	return nil
}

// senderMoved tells waiting batches of sender that one of its batches
// applied.
func (a *Acceptor) senderMoved(sender string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ar := a.mu.arrivals[sender]; ar != nil {
		a.movedLocked(ar)
	}
}

// awaitSender is for a batch that found a gap: it returns at once if the
// sender's requests moved since before that attempt (moved, taken then, is
// closed), else it waits until they move. With none of the sender's other
// requests in progress, or all of them waiting too, it waits at most
// gapGrace: nothing else will fill the gap, and a real one is refused
// soon. It never waits past deadline nor the request's life, and it reports
// whether to try again, with the channel to wait on next.
func (a *Acceptor) awaitSender(r *http.Request, sender string, moved chan struct{}, deadline time.Time) (chan struct{}, bool) {
	a.mu.Lock()
	ar := a.mu.arrivals[sender]
	if ar == nil || moved == nil {
		a.mu.Unlock()
		return nil, false
	}
	others := ar.active-ar.waiting-1 > 0
	ar.waiting++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		ar.waiting--
		a.mu.Unlock()
	}()
	wait := time.Until(deadline)
	if !others {
		wait = min(wait, gapGrace)
	}
	if wait <= 0 {
		return nil, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-moved:
		return a.movedOf(sender), true
	case <-t.C:
		return nil, false
	case <-r.Context().Done():
		return nil, false
	}
}

// applyInOrder applies b, and while it finds a gap that the sender's batch
// before it, still on its way, may fill, applies it again each time the
// sender's requests move (awaitSender). An applied batch's ack says how
// long its last attempt took.
func (a *Acceptor) applyInOrder(r *http.Request, sender string, b *wire.Batch) (wire.Ack, error) {
	// start is the last attempt's: a wait for the batch before this one
	// is neither the apply's time (metrics) nor the receiver's share of
	// the round trip (apply_us, which opens the sender's window).
	moved := a.movedOf(sender)
	start := time.Now()
	ack, err := a.Apply(sender, b)
	for deadline := time.Now().Add(a.opts.PermitWait); ; {
		// A gap may be the batch before this one still on its way (sent
		// on another connection, being read, or waiting for a permit):
		// decide again each time the sender's requests move.
		var gap *GapError
		if !errors.As(err, &gap) {
			break
		}
		var again bool
		if moved, again = a.awaitSender(r, sender, moved, deadline); !again {
			break
		}
		start = time.Now()
		ack, err = a.Apply(sender, b)
	}
	if err == nil {
		took := time.Since(start)
		a.senderMoved(sender)
		ack.ApplyMicros = max(1, took.Microseconds())
		if a.opts.ObserveApply != nil {
			a.opts.ObserveApply(took)
		}
	}
	return ack, err
}

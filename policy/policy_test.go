package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

var errTransient = errors.New("transient")

type retryableErr bool

func (r retryableErr) Error() string   { return fmt.Sprintf("retryable=%v", bool(r)) }
func (r retryableErr) Retryable() bool { return bool(r) }

func always(error) bool { return true }

// run executes p inside a scope with an op that fails `fail` times with err,
// and returns the fake-clock times of each attempt and Execute's error.
func run(t *testing.T, ctx context.Context, p *BoundedExponential, fail int, err error) ([]time.Duration, error) {
	start := time.Now()
	var at []time.Duration
	ctx, _ = NewScope(ctx)
	e := p.Execute(ctx, func(ctx context.Context) error {
		at = append(at, time.Since(start))
		if Attempt(ctx) != len(at) {
			t.Fatalf("Attempt(ctx) = %d on call %d", Attempt(ctx), len(at))
		}
		if len(at) <= fail {
			return err
		}
		return nil
	})
	return at, e
}

func TestExactDelaySequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := MustNew(Options{MaxAttempts: 6, InitialDelay: 50 * time.Millisecond, MaxDelay: 300 * time.Millisecond, NoJitter: true, Classifier: always})
		at, err := run(t, context.Background(), p, 100, errTransient)
		want := []time.Duration{0, 50, 150, 350, 650, 950} // delays 50,100,200,300(cap),300
		if len(at) != len(want) {
			t.Fatalf("%d attempts, want %d", len(at), len(want))
		}
		for i := range want {
			if at[i] != want[i]*time.Millisecond {
				t.Fatalf("attempt %d at %s, want %s (all: %v)", i+1, at[i], want[i]*time.Millisecond, at)
			}
		}
		var g *GaveUpError
		if !errors.As(err, &g) || g.Attempts != 6 || g.Reason != "attempts exhausted" || !errors.Is(err, errTransient) {
			t.Fatalf("final error %v", err)
		}
		if !strings.Contains(err.Error(), "6 attempt") {
			t.Fatalf("final error does not carry the attempt count: %v", err)
		}
	})
}

func TestDefaultsSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := MustNew(Options{NoJitter: true, Classifier: always})
		at, _ := run(t, context.Background(), p, 100, errTransient)
		want := []time.Duration{0, 50, 150, 350} // 4 attempts: delays 50, 100, 200
		if fmt.Sprint(at) != fmt.Sprint(scale(want, time.Millisecond)) {
			t.Fatalf("default sequence %v, want %v", at, scale(want, time.Millisecond))
		}
	})
}

func scale(ds []time.Duration, u time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d * u
	}
	return out
}

func TestJitterBounds(t *testing.T) {
	b := Backoff{Initial: 50 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
	r := rand.New(rand.NewPCG(3, 4))
	for n := 1; n <= 12; n++ {
		base := Backoff{Initial: b.Initial, Max: b.Max}.Delay(n, nil)
		lo, hi := time.Duration(0.8*float64(base)), min(time.Duration(1.2*float64(base)), b.Max)
		sawSpread := false
		for i := 0; i < 500; i++ {
			d := b.Delay(n, r)
			if d < lo || d > hi {
				t.Fatalf("n=%d: %s outside [%s, %s]", n, d, lo, hi)
			}
			if d != base {
				sawSpread = true
			}
		}
		if !sawSpread {
			t.Fatalf("n=%d: jitter never moved the delay", n)
		}
	}
}

func TestDeadlineCutsOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := MustNew(Options{MaxAttempts: 10, InitialDelay: 50 * time.Millisecond, MaxDelay: time.Second, NoJitter: true, Classifier: always})
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
		defer cancel()
		start := time.Now()
		at, err := run(t, ctx, p, 100, errTransient)
		// attempts at 0 and 50ms; the next would start at 150ms, past the
		// deadline: return at once instead of sleeping into it.
		if len(at) != 2 || time.Since(start) != 50*time.Millisecond {
			t.Fatalf("attempts %v, returned after %s", at, time.Since(start))
		}
		var g *GaveUpError
		if !errors.As(err, &g) || g.Reason != "deadline" || !errors.Is(err, errTransient) {
			t.Fatalf("error %v", err)
		}
	})
}

func TestCancellationNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := MustNew(Options{Classifier: always})
		ctx, cancel := context.WithCancel(context.Background())
		ctx, _ = NewScope(ctx)
		calls := 0
		err := p.Execute(ctx, func(ctx context.Context) error {
			calls++
			cancel()
			return ctx.Err()
		})
		if calls != 1 || !errors.Is(err, context.Canceled) {
			t.Fatalf("calls %d, err %v", calls, err)
		}
		// cancelled while sleeping between attempts
		ctx2, cancel2 := context.WithCancel(context.Background())
		ctx2, _ = NewScope(ctx2)
		calls = 0
		go func() { time.Sleep(10 * time.Millisecond); cancel2() }()
		err = p.Execute(ctx2, func(context.Context) error { calls++; return errTransient })
		if calls != 1 || !errors.Is(err, errTransient) {
			t.Fatalf("cancel during backoff: calls %d, err %v", calls, err)
		}
	})
}

func TestNoScopeRunsOnce(t *testing.T) {
	p := MustNew(Options{Classifier: always})
	calls := 0
	err := p.Execute(context.Background(), func(context.Context) error { calls++; return errTransient })
	if calls != 1 || err != errTransient {
		t.Fatalf("without a scope: %d calls, %v", calls, err)
	}
}

func TestDefaultClassifier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tests := []struct {
			name  string
			err   error
			calls int
		}{
			{"network error", &net.OpError{Op: "dial", Err: errors.New("refused")}, 4},
			{"unexpected eof", io.ErrUnexpectedEOF, 4},
			{"server says retryable (5xx, replay permits)", retryableErr(true), 4},
			{"server says not retryable (4xx, outbound backlog)", retryableErr(false), 1},
			{"wrapped not retryable", fmt.Errorf("put: %w", retryableErr(false)), 1},
			{"plain error", errors.New("validation"), 1},
			{"cancellation", context.Canceled, 1},
		}
		for _, tc := range tests {
			p := MustNew(Options{NoJitter: true})
			at, err := run(t, context.Background(), p, 100, tc.err)
			if len(at) != tc.calls || !errors.Is(err, tc.err) {
				t.Errorf("%s: %d calls (%v), want %d", tc.name, len(at), err, tc.calls)
			}
		}
	})
}

func TestInvalidOptionsNameEveryField(t *testing.T) {
	_, err := New(Options{MaxAttempts: -1, InitialDelay: -time.Second, MaxDelay: -2 * time.Second})
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("%v", err)
	}
	for _, f := range []string{"MaxAttempts", "InitialDelay", "MaxDelay"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
	if _, err := New(Options{InitialDelay: time.Second, MaxDelay: time.Millisecond}); err == nil || !strings.Contains(err.Error(), "MaxDelay") {
		t.Errorf("MaxDelay below InitialDelay: %v", err)
	}
	if _, err := New(Options{}); err != nil {
		t.Errorf("zero options take the defaults: %v", err)
	}
}

func TestBreaker(t *testing.T) {
	now := time.Unix(0, 0)
	b := &Breaker{Threshold: 3, Cooldown: time.Second, Now: func() time.Time { return now }}
	for i := 0; i < 3; i++ {
		if err := b.Allow(); err != nil {
			t.Fatalf("closed breaker refused call %d", i)
		}
		b.Record(false)
	}
	if b.State() != "open" || !errors.Is(b.Allow(), ErrOpen) {
		t.Fatalf("after 3 failures: %s", b.State())
	}
	now = now.Add(time.Second)
	if b.Allow() != nil {
		t.Fatal("half-open breaker refused the probe")
	}
	if !errors.Is(b.Allow(), ErrOpen) {
		t.Fatal("half-open breaker let a second call through with the probe out")
	}
	b.Record(false)
	if b.State() != "open" {
		t.Fatalf("failed probe: %s", b.State())
	}
	now = now.Add(time.Second)
	b.Allow()
	b.Record(true)
	if b.State() != "closed" || b.Allow() != nil {
		t.Fatalf("successful probe: %s", b.State())
	}
	// With a policy, an open circuit fails fast without calling.
	p := MustNew(Options{Breaker: &Breaker{Threshold: 1, Cooldown: time.Hour}, Classifier: always, NoJitter: true, InitialDelay: time.Nanosecond, MaxDelay: time.Nanosecond})
	ctx, _ := NewScope(context.Background())
	calls := 0
	err := p.Execute(ctx, func(context.Context) error { calls++; return errTransient })
	if calls != 1 || !errors.Is(err, ErrOpen) {
		t.Fatalf("policy with an open breaker: %d calls, %v", calls, err)
	}
}

func TestFreshKeysIncrease(t *testing.T) {
	prev := Fresh()
	for i := 0; i < 1000; i++ {
		k := Fresh()
		if !prev.HLC.Less(k.HLC) || k.ID == prev.ID {
			t.Fatalf("key %d not strictly after the previous: %+v %+v", i, prev, k)
		}
		prev = k
	}
	a, b := KeyFromID("msg-1", time.Unix(100, 0)), KeyFromID("msg-1", time.Unix(100, 0))
	if a != b || a == KeyFromID("msg-2", time.Unix(100, 0)) {
		t.Fatal("derived keys are not a function of the upstream identity")
	}
}

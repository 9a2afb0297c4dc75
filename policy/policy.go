// Package policy is the caller-side surface: an opt-in retry policy and the
// idempotency scope that makes a retry safe.
//
// A retry is safe only under a stable identity. A scope pins one logical
// mutation's identity (an HLC, and the string form sent as the HTTP
// Idempotency-Key) on the context; writes under it are stamped with that HLC,
// so a retry is a last-writer-wins tie and collapses instead of applying
// twice. The policy retries only inside a scope: without one it runs the
// operation exactly once.
package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"
)

// RetryPolicy re-invokes an operation that failed transiently.
type RetryPolicy interface {
	Execute(ctx context.Context, op func(ctx context.Context) error) error
}

// Backoff is an exponential delay with optional jitter: after failure n
// (from 1) it is min(Max, Initial*2^(n-1)), spread by up to Jitter either way
// and never above Max.
type Backoff struct {
	Initial, Max time.Duration
	Jitter       float64 // fraction, e.g. 0.2; 0 for the exact sequence
}

// Delay returns the delay after the n-th consecutive failure.
func (b Backoff) Delay(n int, r *rand.Rand) time.Duration {
	d := b.Initial
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	if b.Jitter > 0 {
		var f float64
		if r != nil {
			f = r.Float64()
		} else {
			f = rand.Float64()
		}
		d = time.Duration(float64(d) * (1 + b.Jitter*(2*f-1)))
	}
	if d > b.Max {
		d = b.Max
	}
	if d < 0 {
		d = 0
	}
	return d
}

// Options configure BoundedExponential. Zero fields take the defaults of
// DefaultOptions, except Classifier (nil means DefaultClassifier).
type Options struct {
	// MaxAttempts counts every call, the first included. Default 4.
	MaxAttempts int
	// InitialDelay is the delay after the first failure. Default 50ms.
	InitialDelay time.Duration
	// MaxDelay caps every delay, jitter included. Default 2s.
	MaxDelay time.Duration
	// Classifier says whether an error is worth another attempt.
	Classifier func(error) bool
	// NoJitter turns jitter off, for the exact delay sequence.
	NoJitter bool
	// Jitter is the spread of each delay either way. Default 0.2.
	Jitter float64
	// Breaker, when set, fails fast while its circuit is open and learns
	// from every attempt.
	Breaker *Breaker
	// OnRetry, when set, is told of every failed attempt that will be
	// retried (for logs: attempt number, delay, error).
	OnRetry func(attempt int, delay time.Duration, err error)
}

// DefaultOptions are the shipped defaults: 4 attempts, 50ms, 2s, jitter 0.2.
func DefaultOptions() Options {
	return Options{MaxAttempts: 4, InitialDelay: 50 * time.Millisecond, MaxDelay: 2 * time.Second, Jitter: 0.2}
}

// ErrInvalidOptions is the class of errors for options New refuses.
var ErrInvalidOptions = errors.New("policy: invalid options")

// BoundedExponential is the shipped RetryPolicy.
type BoundedExponential struct {
	opts    Options
	backoff Backoff
	mu      sync.Mutex
	rng     *rand.Rand
}

// New builds a BoundedExponential. Zero fields of opts take defaults; a
// MaxAttempts below 1, a negative InitialDelay or a MaxDelay below
// InitialDelay is refused, naming every bad field at once.
func New(opts Options) (*BoundedExponential, error) {
	d := DefaultOptions()
	var errs []error
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = d.MaxAttempts
	} else if opts.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("%w: MaxAttempts %d is below 1", ErrInvalidOptions, opts.MaxAttempts))
	}
	if opts.InitialDelay == 0 {
		opts.InitialDelay = d.InitialDelay
	} else if opts.InitialDelay < 0 {
		errs = append(errs, fmt.Errorf("%w: InitialDelay %s is negative", ErrInvalidOptions, opts.InitialDelay))
	}
	if opts.MaxDelay == 0 {
		opts.MaxDelay = max(d.MaxDelay, opts.InitialDelay)
	} else if opts.MaxDelay < opts.InitialDelay {
		errs = append(errs, fmt.Errorf("%w: MaxDelay %s is below InitialDelay %s", ErrInvalidOptions, opts.MaxDelay, opts.InitialDelay))
	}
	if opts.Jitter == 0 {
		opts.Jitter = d.Jitter
	} else if opts.Jitter < 0 || opts.Jitter >= 1 {
		errs = append(errs, fmt.Errorf("%w: Jitter %g out of [0, 1)", ErrInvalidOptions, opts.Jitter))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if opts.Classifier == nil {
		opts.Classifier = DefaultClassifier
	}
	jitter := opts.Jitter
	if opts.NoJitter {
		jitter = 0
	}
	return &BoundedExponential{
		opts:    opts,
		backoff: Backoff{Initial: opts.InitialDelay, Max: opts.MaxDelay, Jitter: jitter},
		rng:     rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}, nil
}

// MustNew is New for options known to be valid.
func MustNew(opts Options) *BoundedExponential {
	p, err := New(opts)
	if err != nil {
		panic(err)
	}
	return p
}

// Delay returns the delay the policy waits after failed attempt n (n >= 1).
func (p *BoundedExponential) Delay(n int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.backoff.Delay(n, p.rng)
}

// GaveUpError wraps the last error of an operation the policy stopped
// retrying, with how many attempts it made.
type GaveUpError struct {
	Attempts int
	Reason   string // "not retryable", "attempts exhausted", "deadline", "circuit open"
	Err      error
}

func (e *GaveUpError) Error() string {
	return fmt.Sprintf("policy: gave up after %d attempt(s) (%s): %v", e.Attempts, e.Reason, e.Err)
}

func (e *GaveUpError) Unwrap() error { return e.Err }

// Execute runs op; inside an idempotency scope it retries transient failures
// with backoff. It never retries the caller's own cancellation, never sleeps
// past the context's deadline (it returns the last error early instead), and
// wraps the final error with the attempt count (*GaveUpError).
func (p *BoundedExponential) Execute(ctx context.Context, op func(ctx context.Context) error) error {
	_, scoped := KeyFrom(ctx)
	for attempt := 1; ; attempt++ {
		if b := p.opts.Breaker; b != nil {
			if err := b.Allow(); err != nil {
				return &GaveUpError{Attempts: attempt - 1, Reason: "circuit open", Err: err}
			}
		}
		err := op(withAttempt(ctx, attempt))
		if b := p.opts.Breaker; b != nil {
			b.Record(err == nil || !p.opts.Classifier(err))
		}
		if err == nil {
			return nil
		}
		if !scoped {
			// Nothing is ever retried without an identity.
			return err
		}
		if ctx.Err() != nil {
			// The caller's own cancellation or deadline: not ours to retry.
			return err
		}
		if !p.opts.Classifier(err) {
			return &GaveUpError{Attempts: attempt, Reason: "not retryable", Err: err}
		}
		if attempt >= p.opts.MaxAttempts {
			return &GaveUpError{Attempts: attempt, Reason: "attempts exhausted", Err: err}
		}
		delay := p.Delay(attempt)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < delay {
			return &GaveUpError{Attempts: attempt, Reason: "deadline", Err: err}
		}
		if p.opts.OnRetry != nil {
			p.opts.OnRetry(attempt, delay, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

type attemptKey struct{}

func withAttempt(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, attemptKey{}, n)
}

// Attempt returns which attempt of a policy's Execute ctx belongs to (1 for
// the first, 0 outside a policy).
func Attempt(ctx context.Context) int {
	n, _ := ctx.Value(attemptKey{}).(int)
	return n
}

// Retryable is implemented by errors that know whether a retry could
// succeed (client.Error does, from the server's "retryable" field).
type Retryable interface {
	Retryable() bool
}

// DefaultClassifier retries transient failures: network errors, timeouts,
// and errors that say they are retryable (5xx answers, saturation refusals
// whose source is retryable). It never retries validation, authorization,
// precondition or non-retryable saturation errors, nor a cancellation.
func DefaultClassifier(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var r Retryable
	if errors.As(err, &r) {
		return r.Retryable()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true // a per-attempt timeout (the caller's own is checked first)
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/crc32"
	"time"

	"github.com/replicator/replicator/hlc"
)

// Key is one logical mutation's identity. Every attempt of the mutation
// carries the same Key: library writes are stamped with HLC (so a retry ties
// in last-writer-wins and changes nothing), and HTTP requests send ID as their
// Idempotency-Key (so the server replays its recorded answer).
type Key struct {
	ID  string
	HLC hlc.Timestamp
}

type keyCtx struct{}

// WithKey pins k on ctx: the scope of one logical mutation.
func WithKey(ctx context.Context, k Key) context.Context {
	return context.WithValue(ctx, keyCtx{}, k)
}

// KeyFrom returns the key pinned on ctx, if any.
func KeyFrom(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyCtx{}).(Key)
	return k, ok
}

// mint is the process's own clock for fresh keys: strictly increasing, so no
// two keys this process mints share an HLC.
var mint = hlc.NewClock(nil, 0)

// Fresh mints a new key: the current time, advanced past every key this
// process minted before, and a random ID.
func Fresh() Key {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("policy: no randomness: " + err.Error())
	}
	return Key{ID: hex.EncodeToString(b[:]), HLC: mint.Now()}
}

// NewScope pins a fresh key on ctx and returns both.
func NewScope(ctx context.Context) (context.Context, Key) {
	k := Fresh()
	return WithKey(ctx, k), k
}

// KeyFromID derives a key from a stable upstream identity, such as a queue
// message's ID and the time it was enqueued: a worker that crashes and
// re-runs the message derives the same key, so its retry collapses too. The
// time must lie within the server's pin window (default 1h) of the write.
func KeyFromID(id string, at time.Time) Key {
	return Key{ID: id, HLC: hlc.Timestamp{Wall: at.UnixNano(), Logical: crc32.ChecksumIEEE([]byte(id))}}
}

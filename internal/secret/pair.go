package secret

import (
	"crypto/sha256"
	"encoding/hex"
	"sync/atomic"
)

// A link's secret is rotated without a gap (docs/OPERATIONS.md "Rotating
// a link's secret"): for a while each side holds two, the one it sends
// (the first) and another it also takes (the second), and a request names
// the one it was made with by its key ID, so the receiver answers and
// proves with that one.

// KeyID names a secret without telling it: the first 8 bytes of its
// SHA-256, in hex ("" for no secret). A secret is high-entropy (a link's
// is at least 16 bytes): the prefix of its hash gives nothing a MAC under
// it does not.
func KeyID(s string) string {
	if s == "" {
		return ""
	}
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

// Pair holds a link's secrets: the one this side sends, and until Until
// (wall ns; 0: no bound) another it also takes. Safe for concurrent use.
type Pair struct {
	v atomic.Pointer[pairValue]
}

type pairValue struct {
	send, also     string
	sendID, alsoID string
	until          int64
}

// NewPair holds send (and also, "" for none, taken until until).
func NewPair(send, also string, until int64) *Pair {
	p := &Pair{}
	p.Set(send, also, until)
	return p
}

// Set replaces the secrets (a reload).
func (p *Pair) Set(send, also string, until int64) {
	if also == send {
		also = ""
	}
	p.v.Store(&pairValue{send: send, also: also, sendID: KeyID(send), alsoID: KeyID(also), until: until})
}

// Send is the secret this side sends and proves with, and its key ID.
func (p *Pair) Send() (secret, id string) {
	if p == nil {
		return "", ""
	}
	v := p.v.Load()
	return v.send, v.sendID
}

// Also is the second secret taken ("" once past its bound, at now).
func (p *Pair) Also(now int64) string {
	if p == nil {
		return ""
	}
	v := p.v.Load()
	if v.also == "" || (v.until != 0 && now >= v.until) {
		return ""
	}
	return v.also
}

// For is the secret a request naming key ID id was made with, as of now:
// the sent one for id "" (a sender that names none: a build before
// rotation) or its ID, the second one for its ID while it is taken; ok
// false for any other.
func (p *Pair) For(id string, now int64) (string, bool) {
	if p == nil {
		return "", false
	}
	v := p.v.Load()
	switch {
	case id == "" || id == v.sendID:
		return v.send, true
	case v.also != "" && id == v.alsoID && (v.until == 0 || now < v.until):
		return v.also, true
	}
	return "", false
}

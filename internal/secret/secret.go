// Package secret compares secrets (tokens, link secrets) in time that
// depends on neither their content nor their length:
// subtle.ConstantTimeCompare returns at once when the lengths differ, which
// tells a caller the length of the secret it guesses at.
package secret

import (
	"crypto/sha256"
	"crypto/subtle"
)

// Equal reports got == want, in time independent of both.
func Equal(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

package wire

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Proving a peer (issue 25, docs/SECURITY.md "A peer holding its secret").
// A shipper that holds a secret shared with a peer cluster sends neither
// the secret nor a batch to a URL until the node there proved it holds the
// same secret: it posts a fresh nonce to PathProve, and the node answers
// ProofMAC of it. Every post then carries a fresh nonce (HeaderNonce), and
// every answer the receiver gives a post it authenticated carries
// AnswerMAC of that nonce, the status and the body (HeaderMAC): an ack, a
// gap's high-water mark or a redirect that does not verify never moves the
// shipper's cursor or its URL. A URL a gossip member or a not_leader
// answer named is thus harmless until its node proves the secret.

const (
	// PathReplicate is where a shipper posts its batches.
	PathReplicate = "/v1/replicate"
	// PathProve is where a shipper asks a peer node to prove the secret.
	PathProve = "/v1/replicate/prove"
	// HeaderNonce carries the shipper's fresh nonce (64 hex digits), on a
	// proof request and on every post.
	HeaderNonce = "X-Replicator-Nonce"
	// HeaderKeyID names the link secret a request was made with
	// (secret.KeyID): during a rotation the receiver holds two and
	// authenticates, answers and proves with the one named (none: a build
	// before rotation, the receiver's first).
	HeaderKeyID = "X-Replicator-Key-Id"
	// HeaderMAC carries AnswerMAC on an answer to a post.
	HeaderMAC = "X-Replicator-MAC"
)

// Proof is the answer at PathProve.
type Proof struct {
	// Cluster is the answering node's cluster ID.
	Cluster string `json:"cluster"`
	// Proof is ProofMAC(secret, sender, Cluster, nonce).
	Proof string `json:"proof"`
}

// NewNonce returns a fresh nonce of 32 random bytes, in hex.
func NewNonce() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidNonce reports whether s is a nonce as NewNonce makes them.
func ValidNonce(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func mac(secret string, parts ...string) string {
	m := hmac.New(sha256.New, []byte(secret))
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// ProofMAC is what the receiver of sender's batches, cluster receiver,
// answers to nonce: a MAC only a holder of the secret computes.
func ProofMAC(secret, sender, receiver, nonce string) string {
	return mac(secret, "replicator-peer-proof/1", sender, receiver, nonce)
}

// AnswerMAC authenticates an answer (its status and body) to the post that
// carried nonce.
func AnswerMAC(secret, nonce string, status int, body []byte) string {
	return mac(secret, "replicator-answer/1", nonce, strconv.Itoa(status), string(body))
}

// VerifyMAC compares a MAC received with the one expected, in constant time.
func VerifyMAC(got, want string) bool {
	return hmac.Equal([]byte(got), []byte(want))
}

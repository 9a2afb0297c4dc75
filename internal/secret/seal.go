package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// Secrets given at run time (a peer added by `replicator peer add`) are
// state of the cluster's log, so they reach every node, its raft snapshots
// and its backups: they are sealed there (AES-256-GCM) under the key every
// node of the cluster is given (--secrets-key-file), never held in clear.

// KeySize is a sealing key's length.
const KeySize = 32

// ErrNoKey refuses to seal or open without a key.
var ErrNoKey = errors.New("secret: no secrets key: give every node of the cluster the same --secrets-key-file")

// Seal encrypts plaintext under key, bound to context (the peer's name: a
// sealed secret moved to another peer's record does not open).
func Seal(key []byte, context, plaintext string) ([]byte, error) {
	g, err := gcm(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, g.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return g.Seal(nonce, nonce, []byte(plaintext), []byte(context)), nil
}

// Open decrypts what Seal made under key and context.
func Open(key []byte, context string, sealed []byte) (string, error) {
	g, err := gcm(key)
	if err != nil {
		return "", err
	}
	if len(sealed) < g.NonceSize()+g.Overhead() {
		return "", errors.New("secret: a sealed secret too short")
	}
	p, err := g.Open(nil, sealed[:g.NonceSize()], sealed[g.NonceSize():], []byte(context))
	if err != nil {
		return "", fmt.Errorf("secret: the sealed secret does not open with this node's key (another --secrets-key-file than the node that sealed it?): %w", err)
	}
	return string(p), nil
}

func gcm(key []byte) (cipher.AEAD, error) {
	if len(key) == 0 {
		return nil, ErrNoKey
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("secret: a secrets key of %d bytes, want %d", len(key), KeySize)
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

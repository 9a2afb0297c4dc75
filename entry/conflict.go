package entry

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/replicator/replicator/hlc"
)

// Conflict is one record of the conflict log: a version last-writer-wins
// discarded although the winner's author had not seen it (Context). Every
// node of a cluster holds the same records (the machine decides them in the
// apply's own batch); the same discard decided at another cluster has the
// same ID.
type Conflict struct {
	ID     string // ConflictID(Key, Loser, Winner)
	Key    string
	Loser  Stamp
	Winner Stamp
	// LoserTombstone: the discarded version was a delete.
	LoserTombstone bool
	// LoserValue is the discarded value when it is at most the log's bound
	// (else nil, and only its length and hash are kept).
	LoserValue []byte
	LoserLen   int
	LoserHash  []byte // SHA-256 of the discarded value
	// LoserExpires is the discarded version's expiry (0: none): a restore
	// writes it back with it.
	LoserExpires int64
	// Incoming: the discarded version was the entry that arrived (else the
	// version the key held).
	Incoming bool
	// Peer is the link the incoming version came over.
	Peer string
	// At is the applying command's stamp: the log's time, not a clock's.
	At hlc.Timestamp
	// Possible: the winner carried no context (a peer of an older build,
	// or a version stored before the log kept contexts), so whether its
	// author had seen the loser is not known.
	Possible bool
	// Restored is the version of the write that brought the loser back
	// (zero: not restored).
	Restored Stamp
	// Aliases are the IDs this record had before the key moved on and the
	// loss was named against its new version (oldest first, at most
	// MaxConflictAliases): an ID from an alert or a ticket still finds it.
	Aliases []string
}

// MaxConflictAliases bounds a record's aliases (the oldest go first).
const MaxConflictAliases = 8

// ConflictID is a conflict's identity: the key and the two versions. The
// same discard decided at any cluster has the same ID.
func ConflictID(key string, loser, winner Stamp) string {
	h := sha256.New()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(loser.String()))
	h.Write([]byte{0})
	h.Write([]byte(winner.String()))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

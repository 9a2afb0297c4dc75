// Package jsonstring appends a JSON string exactly as encoding/json writes
// it, without reflection for the printable ASCII that keys, versions and
// origins almost always are: the hot answers (a write's, a recorded keyed
// answer) are built with it, and must be byte for byte what a reflective
// encoder would give, since a recorded answer is replayed verbatim.
package jsonstring

import "encoding/json"

// Append appends s as a JSON string, HTML characters escaped as
// encoding/json escapes them.
func Append(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

package jsonstring

import (
	"bytes"
	"encoding/json"
	"testing"
)

func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "k", "a/b c", `q"uote`, `back\slash`, "<script>&", "tab\t", "\x00", "é", "\u2028", "\xff", "1764546000000000000.3.a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := Append([]byte("x"), s); !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Fatalf("Append(%q) = %s, encoding/json writes %s", s, got[1:], want)
		}
	})
}

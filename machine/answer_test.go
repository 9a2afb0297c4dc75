package machine

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestWriteAnswerMatchesEncodingJSON(t *testing.T) {
	for _, c := range [][3]string{
		{"k", "1764546000000000000.0.a", "a"},
		{"users/42", "1.2.b", "b"},
		{`a"b\c<d>&e`, "1.0.x", "x"},
		{"é\u2028\x01", "2.0.y", "y"},
	} {
		want, err := json.Marshal(WriteAnswer{Key: c[0], Version: c[1], Origin: c[2]})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, '\n')
		if got := AppendWriteAnswer(nil, c[0], c[1], c[2]); !bytes.Equal(got, want) {
			t.Errorf("%q: got %s want %s", c[0], got, want)
		}
	}
}

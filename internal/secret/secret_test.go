package secret

import "testing"

func TestEqual(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{{"s3cret", "s3cret", true}, {"s3cret", "s3cre", false}, {"", "", true}, {"a", "", false}, {"x", "y", false}} {
		if got := Equal(c.a, c.b); got != c.want {
			t.Errorf("Equal(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

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

// TestPair: a request naming no key ID is taken with the secret sent; one
// naming the second secret's ID only while it is taken (its bound); any
// other ID never. A reload changes what is sent at once.
func TestPair(t *testing.T) {
	p := NewPair("old-secret-0123456789", "new-secret-0123456789", 100)
	if s, id := p.Send(); s != "old-secret-0123456789" || id != KeyID(s) || len(id) != 16 {
		t.Fatalf("send %q %q", s, id)
	}
	for _, c := range []struct {
		id   string
		now  int64
		want string
		ok   bool
	}{
		{"", 0, "old-secret-0123456789", true},
		{KeyID("old-secret-0123456789"), 500, "old-secret-0123456789", true},
		{KeyID("new-secret-0123456789"), 99, "new-secret-0123456789", true},
		{KeyID("new-secret-0123456789"), 100, "", false},
		{KeyID("other"), 0, "", false},
	} {
		if got, ok := p.For(c.id, c.now); got != c.want || ok != c.ok {
			t.Errorf("For(%q, %d) = %q %v, want %q %v", c.id, c.now, got, ok, c.want, c.ok)
		}
	}
	p.Set("new-secret-0123456789", "", 0)
	if s, _ := p.Send(); s != "new-secret-0123456789" || p.Also(0) != "" {
		t.Fatalf("after a reload: send %q, also %q", s, p.Also(0))
	}
	if _, ok := p.For(KeyID("old-secret-0123456789"), 0); ok {
		t.Fatal("the old secret is still taken after the rotation ended")
	}
}

package resp

import "testing"

// TestMatch: the cases Redis's own tests (keyspace.tcl, util.c's
// stringmatchlen tests) and its documentation give for KEYS patterns.
func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, key string
		want         bool
	}{
		{"*", "", true}, {"*", "anything/at/all", true},
		{"h?llo", "hello", true}, {"h?llo", "hallo", true}, {"h?llo", "hllo", false},
		{"h*llo", "hllo", true}, {"h*llo", "heeeello", true}, {"h*llo", "hello!", false},
		{"h[ae]llo", "hello", true}, {"h[ae]llo", "hallo", true}, {"h[ae]llo", "hillo", false},
		{"h[^e]llo", "hallo", true}, {"h[^e]llo", "hello", false},
		{"h[a-b]llo", "hallo", true}, {"h[a-b]llo", "hbllo", true}, {"h[a-b]llo", "hcllo", false},
		{"h[b-a]llo", "hallo", true}, // a range given backwards
		{`h\*llo`, "h*llo", true}, {`h\*llo`, "hello", false},
		{`[\]]`, "]", true}, {`a\`, `a\`, true},
		{"user:*:name", "user:1000:name", true}, {"user:*:name", "user:1000:email", false},
		{"*a*b*c*", "xxaxxbxxcxx", true}, {"*a*b*c*", "xxaxxcxxbxx", false},
		{"a*", "", false}, {"", "", true}, {"", "a", false},
		{"[abc", "a", true}, // a class never closed runs to the end
		{"k/*", "k/1", true}, {"k/*", "k", false},
	} {
		if got := match(tc.pattern, tc.key); got != tc.want {
			t.Errorf("match(%q, %q) = %v, want %v", tc.pattern, tc.key, got, tc.want)
		}
	}
}

func TestLiteralPrefix(t *testing.T) {
	for p, want := range map[string]string{"user:*": "user:", "*": "", "a?c": "a", `a\*b*`: "a*b", "abc": "abc", "ab[c]": "ab"} {
		if got := literalPrefix(p); got != want {
			t.Errorf("literalPrefix(%q) = %q, want %q", p, got, want)
		}
		if !match(p, want) && p != "a?c" && p != "ab[c]" {
			t.Errorf("%q does not match its own prefix %q", p, want)
		}
	}
}

// FuzzMatch: no pattern panics or loops, and a key always matches "*" and
// itself with every wildcard escaped.
func FuzzMatch(f *testing.F) {
	f.Add("h[^e]*l?o", "hallo")
	f.Add(`\`, "x")
	f.Fuzz(func(t *testing.T, pattern, key string) {
		match(pattern, key)
		literalPrefix(pattern)
		if !match("*", key) {
			t.Fatalf("* does not match %q", key)
		}
		esc := make([]byte, 0, 2*len(key))
		for i := 0; i < len(key); i++ {
			esc = append(esc, '\\', key[i])
		}
		if !match(string(esc), key) {
			t.Fatalf("%q escaped does not match itself", key)
		}
	})
}

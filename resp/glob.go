package resp

// The glob patterns of KEYS and SCAN MATCH, as Redis matches them
// (stringmatchlen): * any run of bytes, ? one byte, [abc] [^abc] [a-z] a
// class (a range given backwards is the same range), \x the byte x. Neither
// path.Match (its * stops at '/', a key's usual separator) nor a glob
// library (other negation and escape rules) matches what a Redis client's
// pattern means, so this is written here, in the iterative form that never
// backtracks more than once per star.

// match reports whether key matches pattern.
func match(pattern, key string) bool {
	p, k := 0, 0
	starP, starK := -1, 0 // the last star's place, and where it resumes
	for k < len(key) {
		if p < len(pattern) {
			switch pattern[p] {
			case '*':
				for p < len(pattern) && pattern[p] == '*' {
					p++
				}
				if p == len(pattern) {
					return true
				}
				starP, starK = p, k
				continue
			case '?':
				p++
				k++
				continue
			case '[':
				if ok, next := matchClass(pattern, p, key[k]); ok {
					p, k = next, k+1
					continue
				}
			case '\\':
				if p+1 < len(pattern) {
					if pattern[p+1] == key[k] {
						p, k = p+2, k+1
						continue
					}
					break
				}
				fallthrough // a trailing backslash is itself
			default:
				if pattern[p] == key[k] {
					p++
					k++
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		// The last star takes one byte more.
		starK++
		p, k = starP, starK
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// matchClass matches b against the class opening at pattern[open] ('['),
// and returns where the pattern resumes after it. A class never closed
// runs to the pattern's end, as in Redis.
func matchClass(pattern string, open int, b byte) (bool, int) {
	i := open + 1
	not := i < len(pattern) && pattern[i] == '^'
	if not {
		i++
	}
	found := false
	for i < len(pattern) && pattern[i] != ']' {
		switch {
		case pattern[i] == '\\' && i+1 < len(pattern):
			i++
			found = found || pattern[i] == b
		case i+2 < len(pattern) && pattern[i+1] == '-' && pattern[i+2] != ']':
			lo, hi := pattern[i], pattern[i+2]
			if lo > hi {
				lo, hi = hi, lo
			}
			found = found || (lo <= b && b <= hi)
			i += 2
		default:
			found = found || pattern[i] == b
		}
		i++
	}
	if i < len(pattern) {
		i++ // the ']'
	}
	return found != not, i
}

// literalPrefix is the part of pattern before its first wildcard: every
// key it matches begins with it, so a scan need read only from there.
func literalPrefix(pattern string) string {
	var out []byte
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '*', '?', '[':
			return string(out)
		case '\\':
			if i+1 < len(pattern) {
				i++
				c = pattern[i]
			}
			out = append(out, c)
		default:
			out = append(out, c)
		}
	}
	return string(out)
}

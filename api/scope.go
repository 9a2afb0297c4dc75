package api

// Scope is what a route requires, and, as a set, what a caller's
// credentials grant (docs/SECURITY.md): the API token grants ScopeAPI, the
// admin token ScopeAdmin, and the API token both while no admin token is
// given. A route of ScopeNone is open to all.
type Scope uint8

const (
	// ScopeNone: health, readiness, the dashboard page and the peer
	// endpoints (which authenticate peers themselves).
	ScopeNone Scope = 0
	// ScopeAPI: reads and writes of data, metrics.
	ScopeAPI Scope = 1 << 0
	// ScopeAdmin: everything under /admin/ and the profiles.
	ScopeAdmin Scope = 1 << 1
)

// Allows reports that a grant reaches a route that needs need.
func (s Scope) Allows(need Scope) bool { return need == ScopeNone || s&need == need }

func (s Scope) String() string {
	switch s {
	case ScopeNone:
		return "none"
	case ScopeAPI:
		return "api"
	case ScopeAdmin:
		return "admin"
	case ScopeAPI | ScopeAdmin:
		return "api+admin"
	}
	return "unknown"
}

// ParseScope reads a scope's (or a grant's) name.
func ParseScope(s string) (Scope, bool) {
	for _, sc := range []Scope{ScopeNone, ScopeAPI, ScopeAdmin, ScopeAPI | ScopeAdmin} {
		if sc.String() == s {
			return sc, true
		}
	}
	return ScopeNone, false
}

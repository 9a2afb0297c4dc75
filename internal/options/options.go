// Package options resolves a package's Options the way pebble's do: a copy
// of what the caller passed (nil is the zero value), its defaults filled,
// then every problem reported at once by Validate.
package options

// Of is a package's *Options.
type Of[T any] interface {
	*T
	// EnsureDefaults fills every field the caller left zero.
	EnsureDefaults()
	// Validate reports every problem of the options together.
	Validate() error
}

// Resolve returns a copy of opts (the zero value when nil) with its
// defaults filled, or the problems Validate found. The caller's value is
// never changed.
func Resolve[T any, P Of[T]](opts *T) (T, error) {
	var o T
	if opts != nil {
		o = *opts
	}
	P(&o).EnsureDefaults()
	return o, P(&o).Validate()
}

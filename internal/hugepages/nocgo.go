//go:build !cgo

package hugepages

// cgoBuild: without cgo Pebble's memory is Go memory, which glibc's
// tunable does not reach.
const cgoBuild = false

//go:build cgo

package hugepages

// cgoBuild: Pebble allocates its memtables and block cache with C's calloc.
const cgoBuild = true

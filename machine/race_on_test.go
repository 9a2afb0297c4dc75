//go:build race

package machine

// raceOn: the race detector slows these tests about tenfold; the longest
// histories run shorter under it (the full ones run in the plain suite).
const raceOn = true

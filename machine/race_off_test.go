//go:build !race

package machine

const raceOn = false

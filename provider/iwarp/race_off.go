//go:build !race

package iwarp

// raceEnabled says the race detector is on: see raceRelease.
const raceEnabled = false

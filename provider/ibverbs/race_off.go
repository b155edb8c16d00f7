//go:build !race

package ibverbs

// raceEnabled says the race detector is on: see race_on.go.
const raceEnabled = false

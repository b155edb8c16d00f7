//go:build race

package ibverbs

// raceEnabled says the race detector is on: call3 then takes its C stacks
// from a pool, with atomic operations the detector sees.
const raceEnabled = true

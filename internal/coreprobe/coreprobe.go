// Package coreprobe measures how long a cache line takes to go from one
// processor to another and back, the cost under every handoff between
// two cores that share memory: shm0's work requests and completions,
// rsock's rings over shm0, a goroutine woken on another core. On a
// virtual machine it moves with where the hypervisor places the vCPUs,
// by four times or more from one minute to the next, and shm0's
// latencies and rsock's figures over shm0 with it; the benchmarks print
// it beside their figures so that a run can be read against it.
package coreprobe

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// line is a cache line of its own.
type line struct {
	_ [64]byte
	v atomic.Uint64
	_ [56]byte
}

// giveUp bounds a measurement whose other side is never scheduled.
const giveUp = time.Second

// RoundTrip measures a cache line's round trip between the first two
// processors this process may run on: two threads, each pinned to one
// of them, hand a counter back and forth rounds times, and the result is
// the mean time of one handoff there and back. It fails when the
// process may run on fewer than two processors, or when the handoffs do
// not finish within a second (the other thread was not scheduled).
func RoundTrip(rounds int) (time.Duration, error) {
	if rounds < 1 {
		return 0, errors.New("coreprobe: give at least one round")
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return 0, fmt.Errorf("coreprobe: the processors this process may use: %w", err)
	}
	cpus := make([]int, 0, 2)
	for cpu := 0; cpu < len(allowed)*64 && len(cpus) < 2; cpu++ {
		if allowed.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	if len(cpus) < 2 {
		return 0, errors.New("coreprobe: this process may run on one processor only")
	}
	var l line
	var stop atomic.Bool // either side gave up
	type result struct {
		d   time.Duration
		err error
	}
	echoed := make(chan error, 1)
	measured := make(chan result, 1)
	// Each side's goroutine pins its thread and returns still locked to
	// it, so that the runtime ends the thread rather than reuse it pinned.
	go func() {
		if err := pin(cpus[1]); err != nil {
			stop.Store(true)
			echoed <- err
			return
		}
		for i := uint64(1); i <= uint64(rounds); i++ {
			if !await(&l.v, 2*i-1, &stop) {
				echoed <- errors.New("coreprobe: the other processor's thread did not answer within a second")
				return
			}
			l.v.Store(2 * i)
		}
		echoed <- nil
	}()
	go func() {
		if err := pin(cpus[0]); err != nil {
			stop.Store(true)
			measured <- result{err: err}
			return
		}
		start := time.Now()
		for i := uint64(1); i <= uint64(rounds); i++ {
			l.v.Store(2*i - 1)
			if !await(&l.v, 2*i, &stop) {
				measured <- result{err: errors.New("coreprobe: the other processor's thread did not answer within a second")}
				return
			}
		}
		measured <- result{d: time.Since(start) / time.Duration(rounds)}
	}()
	r := <-measured
	errEcho := <-echoed
	if r.err != nil {
		return 0, r.err
	}
	return r.d, errEcho
}

// pin locks the calling goroutine to its thread and the thread to cpu.
func pin(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("coreprobe: pinning a thread to processor %d: %w", cpu, err)
	}
	return nil
}

// await spins until v holds want, and reports false if that took longer
// than giveUp or the other side gave up; then it makes the other side
// give up too.
func await(v *atomic.Uint64, want uint64, stop *atomic.Bool) bool {
	var deadline time.Time
	for spins := 0; v.Load() != want; spins++ {
		if spins&(1<<16-1) != 0 {
			continue
		}
		if stop.Load() {
			return false
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(giveUp)
		} else if now.After(deadline) {
			stop.Store(true)
			return false
		}
	}
	return true
}

// Package listenwait holds how long a provider's listener waits for a
// connecting peer during connection setup, in one place that the tests
// of every package in the module can lengthen and that users cannot
// reach.
//
// A listener closes a connection whose peer is silent for Timeout at a
// step of setup where the peer owes it a message: the request a
// connection opens with (iWARP's MPA Request, shm's request) and the
// confirmation of the listener's reply (iWARP's RTR in peer-to-peer
// mode, shm's RTU). The default, Default, keeps a connection that says
// nothing from holding a handshake slot for long.
//
// A test that dials a listener of its own process is that peer, and
// under -race on busy cores a process can stall for longer than a second
// (a GC cycle that a large region starts, goroutines left unscheduled):
// the listener then drops a connection that its dialler is still setting
// up, and the dial fails with EOF or its QP in the error state. The
// TestMain of a package whose tests do that sets the wait to a dialler's
// own bound on a setup step before it runs the tests:
//
//	listenwait.Set(listenwait.TestTimeout)
//
// and a test of what a listener does with a silent peer sets a shorter
// wait for itself and restores it when it ends.
package listenwait

import (
	"sync/atomic"
	"time"
)

// Default is how long a listener waits for each setup message a peer
// owes it, unless a test has called Set.
const Default = time.Second

// TestTimeout is the wait that tests dialling listeners of their own
// process set: as long as a dialler waits for each step of setup when its
// context sets no deadline, so that a listener gives up on a stalled
// dialler no sooner than the dialler would.
const TestTimeout = 10 * time.Second

var wait atomic.Int64

func init() { wait.Store(int64(Default)) }

// Timeout is how long a listener waits for each setup message a
// connecting peer owes it: Default, or what a test has Set.
func Timeout() time.Duration { return time.Duration(wait.Load()) }

// Set makes Timeout return d for the waits that begin from now on (a
// wait under way keeps its deadline) and returns a function that
// restores the previous value. Production code never calls it; tests
// call it from TestMain, or for the length of a test.
func Set(d time.Duration) (restore func()) {
	prev := wait.Swap(int64(d))
	return func() { wait.Store(prev) }
}

package rsock

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// On iWARP (tcp0) a wait that parks is woken by the connection's receive
// goroutine, which waits for its socket in Go's network poller. The
// scheduler looks at the poller only when it has nothing else to run, so
// while another wait of the process spins (each round yields with
// runtime.Gosched, which queues it again), the parked wait's bytes sit
// in its socket until that spin ends: a gRPC call over tcp0 paid it
// every time. So a wait that spins also polls, once per round, one of the
// process's parked iWARP connections in its stead (helpParked), and a
// completion that arrives for it is taken as soon as the spinning one
// would take its own. Only connections parked for less than helpWindow
// are polled: a poll keeps the receive goroutine off the socket for a
// while (pollGrace in provider/iwarp), which a connection that stays
// idle should not pay when the spinning stops.

// helpWindow is how long after it parked a connection is polled by
// spinning waits.
const helpWindow = time.Millisecond

// Park states of a connection (Conn.park).
const (
	notParked    = iota // the wait that holds pollMu polls for itself, or none waits
	parkedIdle          // that wait is parked: a helper may poll for it
	parkedHelped        // a helper polls for it now
)

// parked is the process's parked connections.
var parked struct {
	n     atomic.Int32 // len(conns), read without mu
	mu    sync.Mutex
	conns []*Conn
	next  int // the next one a helper looks at
}

// parkEpoch is the origin of Conn.parkedAt.
var parkEpoch = time.Now()

// parkStart registers c as parked, so that spinning waits poll for it.
// pollMu is held.
func (c *Conn) parkStart() {
	if !c.helpable {
		return
	}
	c.parkedAt.Store(int64(time.Since(parkEpoch)))
	parked.mu.Lock()
	c.parkIdx = len(parked.conns)
	parked.conns = append(parked.conns, c)
	parked.n.Store(int32(len(parked.conns)))
	c.park.Store(parkedIdle)
	parked.mu.Unlock()
}

// parkEnd takes c out of the parked connections, once a helper that
// polls for it has finished: from then on, its wait polls for itself.
// pollMu is held.
func (c *Conn) parkEnd() {
	if !c.helpable {
		return
	}
	for !c.park.CompareAndSwap(parkedIdle, notParked) {
		runtime.Gosched() // a helper's poll, which does not wait
	}
	parked.mu.Lock()
	last := len(parked.conns) - 1
	moved := parked.conns[last]
	parked.conns[c.parkIdx] = moved
	moved.parkIdx = c.parkIdx
	parked.conns[last] = nil
	parked.conns = parked.conns[:last]
	parked.n.Store(int32(last))
	parked.mu.Unlock()
}

// unpark ends c's park (parkEnd) and disconnects c if a helper found it
// broken: a helper leaves that to c's own wait. pollMu is held.
func (c *Conn) unpark() {
	c.parkEnd()
	c.afterPost()
}

// helpParked polls, for the spinning wait of self at now (since
// parkEpoch), the completion queue of the next parked connection, if it
// is not self and parked within helpWindow; the completions it finds are
// acted on as the parked wait would, which complete wakes; if they broke
// the connection, its wait disconnects it when it leaves (unpark). It
// reports whether it polled one.
func helpParked(self *Conn, now time.Duration) bool {
	if parked.n.Load() == 0 || !parked.mu.TryLock() {
		return false
	}
	var o *Conn
	if n := len(parked.conns); n > 0 {
		parked.next = (parked.next + 1) % n
		o = parked.conns[parked.next]
	}
	parked.mu.Unlock()
	// o may have left the parked connections since, or even be closed:
	// its park state is notParked then, and the swap fails.
	if o == nil || o == self || now-time.Duration(o.parkedAt.Load()) > helpWindow ||
		!o.park.CompareAndSwap(parkedIdle, parkedHelped) {
		return false
	}
	o.take()
	o.park.Store(parkedIdle)
	return true
}

package iwarp

import (
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs/driver"
)

// memPipe is one direction of a stream held in memory: a byte ring.
type memPipe struct {
	buf        [1 << 16]byte
	head, tail int // read at head, written at tail: tail-head bytes held
}

// move copies between s and the ring, as much as fits (write) or is
// held (read), and returns how much it moved.
func (p *memPipe) move(s []byte, write bool) int {
	at, n := p.head%len(p.buf), p.tail-p.head
	if write {
		at, n = p.tail%len(p.buf), len(p.buf)-n
	}
	ring := p.buf[at:min(len(p.buf), at+n)]
	if write {
		k := copy(ring, s)
		p.tail += k
		return k
	}
	k := copy(s, ring)
	p.head += k
	return k
}

// SocketsInMemory makes the readv and writev of the connections of a and
// b (connected to each other, their sockets idle) move the bytes between
// two rings in memory instead of their sockets: what goverbs itself
// spends on a message, with no kernel, for BenchmarkSendRecvInMemory.
// Nothing else changes: a goroutine waiting for its socket is not woken
// by what a ring holds, so the caller must poll. held tells how many
// bytes the rings hold; restore gives the connections back their
// sockets, which is sound only once held is 0.
func SocketsInMemory(a, b driver.QP) (held func() int, restore func()) {
	ca, cb := a.(*qp).live.Load(), b.(*qp).live.Load()
	fa, fb := uintptr(ca.sk.fd), uintptr(cb.sk.fd)
	// sockIO is read by the connections' receivers and transmitters,
	// under rxMu and txMu: swap it while holding both.
	swap := func(f func(trap, fd uintptr, iov []unix.Iovec) (uintptr, syscall.Errno)) {
		for _, c := range []*conn{ca, cb} {
			c.rxMu.Lock()
			c.txMu.Lock()
		}
		sockIO = f
		for _, c := range []*conn{ca, cb} {
			c.txMu.Unlock()
			c.rxMu.Unlock()
		}
	}
	var mu sync.Mutex
	toA, toB := new(memPipe), new(memPipe)
	prev := sockIO
	swap(func(trap, fd uintptr, iov []unix.Iovec) (uintptr, syscall.Errno) {
		var p *memPipe
		write := trap == unix.SYS_WRITEV
		switch {
		case fd == fa && write, fd == fb && !write:
			p = toB
		case fd == fb && write, fd == fa && !write:
			p = toA
		default:
			return prev(trap, fd, iov)
		}
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range iov {
			s := unsafe.Slice(v.Base, v.Len)
			k := p.move(s, write)
			if k < len(s) && k > 0 {
				k += p.move(s[k:], write) // the ring wrapped
			}
			n += k
			if k < len(s) {
				break
			}
		}
		if n == 0 && !write {
			return 0, unix.EAGAIN
		}
		return uintptr(n), 0
	})
	held = func() int {
		mu.Lock()
		defer mu.Unlock()
		return toA.tail - toA.head + toB.tail - toB.head
	}
	return held, func() { swap(prev) }
}

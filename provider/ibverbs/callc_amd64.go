package ibverbs

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// On amd64 the provider calls C through its own trampolines rather than
// purego.SyscallN, whose variadic arguments escape to the heap: the data
// path allocates nothing.
//
// call, for everything but the data path, goes through runtime.cgocall
// as cgo calls do: the goroutine enters the syscall state, so a call that
// blocks (waiting for an event, a connection) gives up its P.
//
// call3, the data path's call (post_send, post_recv, poll_cq, bind_mw:
// functions that never block), does not. The syscall state costs more
// than those calls themselves where system calls and thread wake-ups are
// dear: sysmon takes the P of a goroutine that has run for 10 ms without
// passing through the scheduler (a busy-polling loop) if it finds it in a
// foreign call, and hands it to another thread, which is woken for
// nothing, while the polling goroutine must then find a P again on its
// way back; on rxe, whose post_send does the device's work in the kernel
// and lasts long, that is most of the time. call3 instead switches to a
// C stack of its own and calls the function from the goroutine, as a
// Go function that does not yield: the runtime sees a running goroutine
// (a garbage collection waits the call's length for it, as for any
// loop without a preemption point). The C stacks are mapped once, one
// for each P (GOMAXPROCS) up to cStackCount: call3 pins its goroutine to
// its P for the call and runs C on that P's stack, which no other call
// can be using, with no atomic operation. A P numbered beyond the stacks
// goes through runtime.cgocall.
//
// Under the race detector the stacks are a pool instead, taken and given
// back with atomic operations: those order Go memory from one call to
// another that sees its effect in C, which the detector cannot see
// through C (TestCallOrdersLikeCgo).

// ctrampPC is the address of ctramp (callc_amd64.s).
var ctrampPC uintptr

//go:linkname runtime_cgocall runtime.cgocall
//go:noescape
func runtime_cgocall(fn uintptr, arg unsafe.Pointer) int32

// runtime_procPin pins the goroutine to its P, whose number it returns,
// until runtime_procUnpin: nothing else runs on that P meanwhile.
//
//go:linkname runtime_procPin runtime.procPin
func runtime_procPin() int

//go:linkname runtime_procUnpin runtime.procUnpin
func runtime_procUnpin()

// ccallOn calls a.fn with the first three of a.a on the C stack whose
// top is stack, and stores its result in a.r1 (callc_amd64.s).
//
//go:noescape
func ccallOn(a *cargs, stack uintptr)

// call calls the C function fn with up to six integer or pointer
// arguments and returns its integer or pointer result. An argument
// written uintptr(unsafe.Pointer(p)) in the call keeps p alive and
// where it is for the call (go:uintptrescapes moves it to the heap if
// it was on the stack, which can move).
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) uintptr {
	if len(args) > len(cargs{}.a) {
		panic("ibverbs: more than six arguments to a C function")
	}
	a := cargs{fn: fn}
	copy(a.a[:], args)
	runtime_cgocall(ctrampPC, unsafe.Pointer(&a))
	return a.r1
}

// call3 is the data path's call: three arguments, no variadic slice
// (whose backing array go:uintptrescapes would put on the heap), on a C
// stack of the pool without entering the syscall state. fn must not
// block; the data path passes only memory already on the heap, so it
// allocates nothing.
//
//go:uintptrescapes
func call3(fn, a1, a2, a3 uintptr) uintptr {
	a := cargs{fn: fn, a: [6]uintptr{a1, a2, a3}}
	return ccall(&a)
}

// ccall is call3 with its function and arguments in a (the first three
// of a.a): the posts and polls keep theirs ready in their QP, SRQ or CQ
// (a ccall's arguments are moved from memory once, in ccallOn). It
// returns the result, which it also leaves in a.r1. The memory the
// arguments point to must stay alive and in place for the call: the
// heap, or a caller's frame (a goroutine's stack does not move while it
// runs C, which it does as a Go function that does not yield).
//
// It is nosplit, its frame small: procPin, ccallOn and procUnpin check
// no stack either, and ccallSlow checks its own.
//
//go:nosplit
func ccall(a *cargs) uintptr {
	if !raceEnabled {
		if i := runtime_procPin(); uint(i) < cStackCount {
			if top := cStacks.tops[i].Load(); top != 0 {
				ccallOn(a, top)
				runtime_procUnpin()
				return a.r1
			}
		}
		runtime_procUnpin()
	}
	return ccallSlow(a)
}

// ccallSlow is ccall without a C stack at hand: the pool not mapped yet,
// a P numbered beyond the stacks, or the race detector on (the pool's
// stacks are then taken and given back atomically).
func ccallSlow(a *cargs) uintptr {
	switch {
	case raceEnabled:
		if i, ok := cStacks.take(); ok {
			ccallOn(a, cStacks.top(i))
			cStacks.put(i)
			return a.r1
		}
	case cStacks.base.Load() != 0 || cStacks.mapStacks():
		if i := runtime_procPin(); i < cStackCount {
			ccallOn(a, cStacks.top(i))
			runtime_procUnpin()
			return a.r1
		}
		runtime_procUnpin()
	}
	runtime_cgocall(ctrampPC, unsafe.Pointer(a))
	return a.r1
}

const (
	// cStackSize is the usable size of each C stack: many times what
	// the data path's C functions use (a post or a poll, maybe a system
	// call; the providers' functions have frames of a few hundred
	// bytes), though far less than the thread stack of megabytes that
	// runtime.cgocall runs C on.
	cStackSize = 64 << 10
	// cStackCount is the number of stacks: the Ps numbered from it up
	// (under the race detector, the pool's calls beyond it) go through
	// runtime.cgocall.
	cStackCount = 64
)

// cStacks are the C stacks, mapped by the first call3 that finds none
// (and never unmapped: they live as long as the loaded library).
var cStacks cStackPool

// cStackPool holds cStackCount stacks, each above an inaccessible guard,
// in one mapping: stack i is P i's. Under the race detector they are a
// pool instead, free having a bit set for each stack not in use: every
// call3 on a stack changes free atomically before and after its C call,
// which also orders, for the race detector, Go memory written before one
// call and read after another that saw its effect in C, as
// runtime.cgocall does for cgo calls.
type cStackPool struct {
	free atomic.Uint64
	base atomic.Uintptr // the mapping; 0 until mapped
	// tops holds each stack's top (stackTop), 0 until mapped: ccall
	// loads its P's with no arithmetic.
	tops   [cStackCount]atomic.Uintptr
	mapErr atomic.Bool // mapping failed: call3 always uses runtime.cgocall
}

// take claims a free stack and returns its index.
func (p *cStackPool) take() (int, bool) {
	if p.base.Load() == 0 && !p.mapStacks() {
		return 0, false
	}
	for {
		f := p.free.Load()
		if f == 0 {
			return 0, false
		}
		i := bits.TrailingZeros64(f)
		if p.free.CompareAndSwap(f, f&^(1<<uint(i))) {
			return i, true
		}
	}
}

// put returns stack i to the pool.
func (p *cStackPool) put(i int) { p.free.Or(1 << uint(i)) }

// top is the 16-byte aligned top of stack i, cStackTopGap below its end.
func (p *cStackPool) top(i int) uintptr { return stackTop(p.base.Load(), i) }

// stackTop is top for the pool mapped at base.
func stackTop(base uintptr, i int) uintptr {
	return base + uintptr(i+1)*(cStackSize+cStackGuard) - cStackTopGap
}

// cStackTopGap is the room left above each stack's top. The runtime's
// traceback of a goroutine that faulted in C reads ccallOn's arguments
// above its frame, which would be the next stack's guard (a second fault
// while printing the first) without it.
const cStackTopGap = 64

// cStackGuard is the inaccessible space below each stack, so that an
// overflow faults instead of writing into the stack below. It is as
// large as the stack: a C function does not touch each page of its frame
// in order (C code is not always built with stack-clash probes), so an
// overflow by a frame of some KiB, written only at its far end, would
// skip a single guard page. Untouched, it costs only address space.
const cStackGuard = 64 << 10

var cStackOnce sync.Once

// mapStacks maps the pool once; it reports whether the pool is usable.
// Mapping does not allocate on the Go heap.
func (p *cStackPool) mapStacks() bool {
	cStackOnce.Do(func() {
		const each = cStackSize + cStackGuard
		m, err := unix.Mmap(-1, 0, cStackCount*each, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_STACK)
		if err != nil {
			p.mapErr.Store(true)
			return
		}
		for i := range cStackCount {
			if err := unix.Mprotect(m[i*each:i*each+cStackGuard], unix.PROT_NONE); err != nil {
				unix.Munmap(m)
				p.mapErr.Store(true)
				return
			}
		}
		p.free.Store(^uint64(0) >> (64 - cStackCount))
		base := uintptr(unsafe.Pointer(&m[0]))
		for i := range p.tops {
			p.tops[i].Store(stackTop(base, i))
		}
		p.base.Store(base)
	})
	return !p.mapErr.Load()
}

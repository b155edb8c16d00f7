package ibverbs

import "unsafe"

// On amd64 the provider calls C through its own trampoline and
// runtime.cgocall, as purego.SyscallN does, but without SyscallN's
// per-call allocation (its variadic arguments escape to the heap): the
// data path allocates nothing.

// cargs is what ctramp reads: the function, six arguments, the result.
type cargs struct {
	fn uintptr
	a  [6]uintptr
	r1 uintptr
}

// ctrampPC is the address of ctramp (callc_amd64.s).
var ctrampPC uintptr

//go:linkname runtime_cgocall runtime.cgocall
//go:noescape
func runtime_cgocall(fn uintptr, arg unsafe.Pointer) int32

// call calls the C function fn with up to six integer or pointer
// arguments and returns its integer or pointer result. An argument
// written uintptr(unsafe.Pointer(p)) in the call keeps p alive and
// where it is for the call (go:uintptrescapes moves it to the heap if
// it was on the stack, which can move); the data path passes only memory
// already on the heap, so it allocates nothing.
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

// call3 is call for the data path: three arguments and no variadic slice
// (whose backing array go:uintptrescapes would put on the heap).
//
//go:uintptrescapes
func call3(fn, a1, a2, a3 uintptr) uintptr {
	a := cargs{fn: fn, a: [6]uintptr{a1, a2, a3}}
	runtime_cgocall(ctrampPC, unsafe.Pointer(&a))
	return a.r1
}

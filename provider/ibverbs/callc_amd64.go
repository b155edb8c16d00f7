package ibverbs

import "unsafe"

// On amd64 the provider calls C through its own trampoline and
// runtime.cgocall, as purego.SyscallN does, but without SyscallN's
// per-call allocation (its variadic arguments escape to the heap): the
// data path allocates nothing.

// cargs is what ctramp reads: the function, six arguments, the result.
type cargs struct {
	fn, a1, a2, a3, a4, a5, a6, r1 uintptr
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
	var a cargs
	a.fn = fn
	switch len(args) {
	case 6:
		a.a6 = args[5]
		fallthrough
	case 5:
		a.a5 = args[4]
		fallthrough
	case 4:
		a.a4 = args[3]
		fallthrough
	case 3:
		a.a3 = args[2]
		fallthrough
	case 2:
		a.a2 = args[1]
		fallthrough
	case 1:
		a.a1 = args[0]
	case 0:
	default:
		panic("ibverbs: more than six arguments to a C function")
	}
	runtime_cgocall(ctrampPC, unsafe.Pointer(&a))
	return a.r1
}

// call3 is call for the data path: three arguments and no variadic slice
// (whose backing array go:uintptrescapes would put on the heap).
//
//go:uintptrescapes
func call3(fn, a1, a2, a3 uintptr) uintptr {
	a := cargs{fn: fn, a1: a1, a2: a2, a3: a3}
	runtime_cgocall(ctrampPC, unsafe.Pointer(&a))
	return a.r1
}

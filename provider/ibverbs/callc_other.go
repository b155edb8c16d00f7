//go:build !amd64

package ibverbs

import "github.com/ebitengine/purego"

// call calls the C function fn through purego.SyscallN and returns its
// integer or pointer result. (SyscallN allocates its argument slice; on
// amd64 callc_amd64.go avoids that.)
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// ccall calls a.fn with the first three of a.a, stores the result in a.r1
// and returns it.
func ccall(a *cargs) uintptr {
	a.r1, _, _ = purego.SyscallN(a.fn, a.a[0], a.a[1], a.a[2])
	return a.r1
}

// call3 is call with three arguments.
//
//go:uintptrescapes
func call3(fn, a1, a2, a3 uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, a1, a2, a3)
	return r
}

//go:build !amd64

package ibverbs

import "github.com/ebitengine/purego"

// call calls the C function fn through purego.SyscallN and returns its
// integer or pointer result. (SyscallN allocates its argument slice; on
// amd64 callc_amd64.go avoids that.)
func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

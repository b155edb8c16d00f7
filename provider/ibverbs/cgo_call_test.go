//go:build cgo

package ibverbs

import (
	"testing"

	"github.com/goverbs/goverbs/provider/ibverbs/internal/cheader"
)

// BenchmarkCgoCall is a call of a C function that does nothing, through
// cgo (runtime.cgocall and the syscall state): what the provider's own
// foreign calls are measured against (BenchmarkForeignCallSyscallState,
// through its trampoline and runtime.cgocall as cgo calls go, and
// BenchmarkForeignCall, the data path's call on a C stack without the
// syscall state).
func BenchmarkCgoCall(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if cheader.Identity(i) != i {
			b.Fatal("C returned another number")
		}
	}
}

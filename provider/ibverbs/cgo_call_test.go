//go:build cgo

package ibverbs

import (
	"testing"

	"github.com/goverbs/goverbs/provider/ibverbs/internal/cheader"
)

// BenchmarkCgoCall is a call of a C function that does nothing, through
// cgo: the floor the provider's own foreign call (BenchmarkForeignCall,
// through purego's trampoline and runtime.cgocall, as cgo calls go) is
// measured against.
func BenchmarkCgoCall(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if cheader.Identity(i) != i {
			b.Fatal("C returned another number")
		}
	}
}

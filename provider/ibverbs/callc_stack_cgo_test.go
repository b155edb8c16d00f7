//go:build cgo && amd64

package ibverbs

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/provider/ibverbs/internal/cheader"
)

// useStackSum is what use_stack(n, stride) returns.
func useStackSum(n, stride uintptr) uintptr {
	var sum uintptr
	for k := uintptr(0); k*stride < n; k++ {
		sum += k % 256
	}
	return sum
}

// TestCallWithDeepStack: a C function called by the data path's call may
// use most of its C stack (48 KiB of the 64, every cache line of it
// written), from many goroutines at once.
func TestCallWithDeepStack(t *testing.T) {
	if err := load(); err != nil {
		t.Skip(err)
	}
	fn := cheader.UseStackFunc()
	const n, stride = 48 << 10, 64
	want := useStackSum(n, stride)
	errs := make(chan uintptr, 4)
	for range 4 {
		go func() {
			var got uintptr
			for range 200 {
				if got = call3(fn, n, stride, 0); got != want {
					break
				}
			}
			errs <- got
		}()
	}
	for range 4 {
		if got := <-errs; got != want {
			t.Fatalf("use_stack(%d, %d) on a C stack = %d, want %d", n, stride, got, want)
		}
	}
}

// TestStackOverflowFaults: C code that overruns its C stack by a frame of
// up to 32 KiB that it writes only at its far end (as a large local
// array of which little is used) faults in the guard below the stack; it
// never writes into the stack below it, which another call may be using.
// The overrun is made in a child process (this test binary run again).
func TestStackOverflowFaults(t *testing.T) {
	if os.Getenv("GOVERBS_STACK_OVERFLOW") != "" {
		overflowStack()
		return
	}
	if err := load(); err != nil {
		t.Skip(err)
	}
	out := crashChild(t, "TestStackOverflowFaults", "GOVERBS_STACK_OVERFLOW", "overrunning its C stack")
	if !strings.Contains(string(out), "overrunning stack 1") {
		t.Fatalf("the child did not get as far as overrunning its stack:\n%s", out)
	}
	if strings.Contains(string(out), "overwrote") {
		t.Fatalf("the overrun wrote into the stack below instead of faulting:\n%s", out)
	}
}

// overflowStack holds stacks 0 and 1 of the pool, fills stack 0, and
// overruns stack 1 from C by 32 KiB writing one byte at the overrun's far
// end; it reports whether stack 0 changed.
func overflowStack() {
	if err := load(); err != nil {
		panic(err)
	}
	var held []int
	for len(held) < 2 {
		i, ok := cStacks.take()
		if !ok {
			panic("no C stack free")
		}
		held = append(held, i)
	}
	if held[0] != 0 || held[1] != 1 {
		panic(fmt.Sprint("took stacks ", held, ", want 0 and 1"))
	}
	below := unsafe.Slice((*byte)(cptr(cStacks.top(0)+cStackTopGap-cStackSize)), cStackSize)
	for i := range below {
		below[i] = 0xa5
	}
	const n = cStackSize + 32<<10
	a := cargs{fn: cheader.UseStackFunc(), a: [6]uintptr{n, n}}
	fmt.Println("overrunning stack 1")
	ccallOn(&a, cStacks.top(1))
	for i, b := range below {
		if b != 0xa5 {
			fmt.Printf("overwrote byte %d of stack 0\n", i)
			os.Exit(0)
		}
	}
	fmt.Println("returned without a fault and without overwriting stack 0")
	os.Exit(0)
}

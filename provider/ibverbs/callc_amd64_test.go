package ibverbs

import (
	"sync"
	"testing"
	"unsafe"
)

// TestCallOnCStacks checks the data path's call on the pool's C stacks:
// it returns what C returns, from many goroutines at once, gives every
// stack back, and still calls C (through runtime.cgocall) when the pool
// is exhausted.
func TestCallOnCStacks(t *testing.T) {
	if err := load(); err != nil {
		t.Skip(err)
	}
	const want = "Work Request Flushed Error"
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if got := goString(call3(lib.wcStatusStr, 5, 0, 0)); got != want {
					errs <- got
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for got := range errs {
		t.Fatalf("call3(ibv_wc_status_str, IBV_WC_WR_FLUSH_ERR) = %q, want %q", got, want)
	}
	all := ^uint64(0) >> (64 - cStackCount)
	if f := cStacks.free.Load(); f != all {
		t.Fatalf("after the calls the pool's free set is %#x, want %#x", f, all)
	}

	// Every stack taken: call3 falls back to runtime.cgocall.
	var taken []int
	for {
		i, ok := cStacks.take()
		if !ok {
			break
		}
		taken = append(taken, i)
	}
	if len(taken) != cStackCount {
		t.Fatalf("took %d stacks from the pool, want %d", len(taken), cStackCount)
	}
	if got := goString(call3(lib.wcStatusStr, 5, 0, 0)); got != want {
		t.Fatalf("with the pool exhausted, call3 = %q, want %q", got, want)
	}
	for _, i := range taken {
		cStacks.put(i)
	}
	if f := cStacks.free.Load(); f != all {
		t.Fatalf("after giving the stacks back the pool's free set is %#x, want %#x", f, all)
	}
}

// BenchmarkForeignCallSyscallState is a call through runtime.cgocall
// (the syscall state), as the provider makes its calls that may block:
// BenchmarkForeignCall, the data path's call on a C stack without it, is
// measured against it.
func BenchmarkForeignCallSyscallState(b *testing.B) {
	if err := load(); err != nil {
		b.Skip(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		a := cargs{fn: lib.wcStatusStr, a: [6]uintptr{5}}
		runtime_cgocall(ctrampPC, unsafe.Pointer(&a))
	}
}

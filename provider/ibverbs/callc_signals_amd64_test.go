package ibverbs

import (
	"bytes"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"
	"unsafe"
)

// libcFunc is the address of the C library's function name.
func libcFunc(t *testing.T, name string) uintptr {
	t.Helper()
	p, err := libcSym(name)
	if err != nil {
		t.Skip(err)
	}
	return p
}

// libcAddr is the address of the C library's function name, or a panic.
func libcAddr(name string) uintptr {
	p, err := libcSym(name)
	if err != nil {
		panic(err)
	}
	return p
}

func libcSym(name string) (uintptr, error) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return 0, err
	}
	return purego.Dlsym(h, name)
}

// TestCallUnderSignalsAndGC runs the data path's foreign call, in C
// functions long enough for signals to land in them (a scan of memory,
// a sleep in a system call), from more goroutines than there are
// processors, while the CPU profiler's SIGPROF, the scheduler's
// preemption signals and back-to-back garbage collections (which stop
// the world and scan stacks) hit them: every call returns what C
// returned, the process survives, and every C stack goes back to the
// pool.
func TestCallUnderSignalsAndGC(t *testing.T) {
	if err := load(); err != nil {
		t.Skip(err)
	}
	memchr := libcFunc(t, "memchr")
	usleep := libcFunc(t, "usleep")

	const size = 4 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	base := uintptr(unsafe.Pointer(&mem[0]))
	const at = size - 64
	mem[at] = 1

	var prof bytes.Buffer
	if err := pprof.StartCPUProfile(&prof); err != nil {
		t.Skip("CPU profiler busy:", err)
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	var gcs atomic.Int64
	bg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			runtime.GC()
			gcs.Add(1)
		}
	})
	bg.Go(func() { // garbage, so that collections have work and write barriers run
		var keep [][]byte
		for {
			select {
			case <-stop:
				return
			default:
			}
			keep = append(keep, make([]byte, 4096))
			if len(keep) > 256 {
				keep = keep[:0]
			}
		}
	})

	var wg sync.WaitGroup
	var bad atomic.Int64
	for g := range 2 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := range 300 {
				if got := call3(memchr, base, 1, size); got != base+at {
					bad.Add(1)
				}
				if got := call3(memchr, base, 2, size); got != 0 {
					bad.Add(1)
				}
				if (g+i)%16 == 0 {
					if r := int32(call3(usleep, 200, 0, 0)); r != 0 && r != -1 {
						bad.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	pprof.StopCPUProfile()

	if n := bad.Load(); n != 0 {
		t.Fatalf("%d foreign calls returned something else than the C function's result", n)
	}
	if gcs.Load() == 0 {
		t.Fatal("no garbage collection ran during the calls")
	}
	all := ^uint64(0) >> (64 - cStackCount)
	if f := cStacks.free.Load(); f != all {
		t.Fatalf("after the calls the pool's free set is %#x, want %#x", f, all)
	}
}

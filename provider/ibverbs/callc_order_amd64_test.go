package ibverbs

import (
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestCallOrdersLikeCgo: Go memory written before a foreign call is seen
// by a goroutine that learned of the call's effect only through C (as a
// receive buffer reused once its send's completion is polled), and the
// race detector agrees, as it does for cgo calls (which it orders one
// after another): here A's C call sets a flag in C memory, B's C calls
// find it set, and B then reads what A wrote before its call. Under
// -race this fails if the calls on the C stacks do not order Go memory.
func TestCallOrdersLikeCgo(t *testing.T) {
	if err := load(); err != nil {
		t.Skip(err)
	}
	memset := libcFunc(t, "memset")
	memchr := libcFunc(t, "memchr")
	flag, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(flag)
	at := uintptr(unsafe.Pointer(&flag[0]))

	for round := range 50 {
		flag[0] = 0
		buf := make([]uint64, 8) // Go memory, which the race detector watches
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := range buf {
				buf[i] = uint64(round*8 + i)
			}
			call3(memset, at, 1, 1)
		})
		var got []uint64
		wg.Go(func() {
			for call3(memchr, at, 1, 1) == 0 {
			}
			got = append(got, buf...)
		})
		wg.Wait()
		for i, v := range got {
			if v != uint64(round*8+i) {
				t.Fatalf("round %d: word %d read after C said it was written is %d", round, i, v)
			}
		}
	}
}

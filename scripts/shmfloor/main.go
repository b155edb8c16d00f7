// Command shmfloor measures the least that a 64-byte message between two
// processes over shared memory costs on this machine, with no verbs
// around it: the floor under provider/shm's latencies. Two processes map
// one memfd and ping-pong a message in one of three shapes:
//
//   - write: the shape of an RDMA Write (perftest's write_lat, UCX's
//     ucp_put_lat): the sender stores the payload into the receiver's
//     buffer, whose last word the receiver polls.
//   - send: the shape of a Send that lands in the buffer the receiver
//     posted: the sender reads the receiver's posted-receive entry,
//     stores the payload into that buffer and then a completion, which
//     the receiver polls; the receiver reads the payload and posts the
//     entry again.
//   - send-cas: send, with the two compare-and-swaps that let several
//     producers and consumers share the queues (claiming the posted
//     receive, reserving the completion slot), as provider/shm's rings do.
//
// It prints the median, 10th and 90th percentile of the one-way time
// (half a round trip, averaged over batches of 1000 round trips).
//
// Usage: go run ./scripts/shmfloor [-shape write|send|send-cas|all] [-n round trips]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Each side s (0, 1) has five words or buffers, each on its own pair of
// cache lines: its posted-receive entry, its 64-byte buffer, its
// completion, and for send-cas the receive queue's head and the
// completion queue's tail, which provider/shm keeps apart from the
// entries too.
const (
	line    = 128
	kDesc   = 0
	kData   = 1
	kCQ     = 2
	kHead   = 3
	kTail   = 4
	memSize = 4096
	batch   = 1000
)

// floor is one process's view of the shared memory.
type floor struct {
	mem     []byte
	payload [64]byte
	cas     bool
}

func off(kind, side int) int { return (kind*2 + side) * line }

func (f *floor) word(o int) *uint64 { return (*uint64)(unsafe.Pointer(&f.mem[o])) }

// sendTo sends message i (from 1) to peer in the send shape.
func (f *floor) sendTo(peer int, i uint64) {
	desc := f.word(off(kDesc, peer))
	for atomic.LoadUint64(desc) < i { // the receive for message i is posted
	}
	if f.cas {
		// Claim the receive, as a consumer among several would.
		atomic.CompareAndSwapUint64(f.word(off(kHead, peer)), i-1, i)
	}
	o := off(kData, peer)
	copy(f.mem[o:o+64], f.payload[:])
	cq := f.word(off(kCQ, peer))
	if f.cas {
		// Reserve the completion slot, as a producer among several would.
		atomic.CompareAndSwapUint64(f.word(off(kTail, peer)), i-1, i)
	}
	atomic.StoreUint64(cq, i)
}

// recvAt takes message i at side me in the send shape and posts the
// receive for message i+1.
func (f *floor) recvAt(me int, i uint64) {
	for atomic.LoadUint64(f.word(off(kCQ, me))) < i {
	}
	o := off(kData, me)
	copy(f.payload[:], f.mem[o:o+64])
	atomic.StoreUint64(f.word(off(kDesc, me)), i+1)
}

// writeTo writes message i into peer's buffer in the write shape: its
// last word carries i.
func (f *floor) writeTo(peer int, i uint64) {
	o := off(kData, peer)
	copy(f.mem[o:o+56], f.payload[:56])
	atomic.StoreUint64(f.word(o+56), i)
}

// pollAt waits at side me for message i in the write shape.
func (f *floor) pollAt(me int, i uint64) {
	o := off(kData, me)
	for atomic.LoadUint64(f.word(o+56)) < i {
	}
	copy(f.payload[:56], f.mem[o:o+56])
}

func (f *floor) ops(shape string) (send func(int, uint64), recv func(int, uint64)) {
	if shape == "write" {
		return f.writeTo, f.pollAt
	}
	f.cas = shape == "send-cas"
	return f.sendTo, f.recvAt
}

func main() {
	shape := flag.String("shape", "all", "the message's shape: write, send, send-cas, or all of them in turn")
	n := flag.Int("n", 1000000, "round trips to time (a multiple of 1000)")
	child := flag.Bool("child", false, "be the echoing process (started by the other)")
	flag.Parse()
	if *child {
		if err := echo(*shape, *n); err != nil {
			fmt.Fprintln(os.Stderr, "shmfloor child:", err)
			os.Exit(1)
		}
		return
	}
	shapes := []string{*shape}
	if *shape == "all" {
		shapes = []string{"write", "send", "send-cas"}
	}
	for _, s := range shapes {
		if s != "write" && s != "send" && s != "send-cas" {
			fmt.Fprintf(os.Stderr, "shmfloor: no shape %q: give write, send, send-cas or all\n", s)
			os.Exit(2)
		}
		if err := measure(s, max(*n/batch, 1)*batch); err != nil {
			fmt.Fprintln(os.Stderr, "shmfloor:", err)
			os.Exit(1)
		}
	}
}

// measure starts the echoing process on a new memfd and times n round
// trips.
func measure(shape string, n int) error {
	fd, err := unix.MemfdCreate("shmfloor", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	file := os.NewFile(uintptr(fd), "shmfloor")
	defer file.Close()
	if err := unix.Ftruncate(fd, memSize); err != nil {
		return err
	}
	mem, err := unix.Mmap(fd, 0, memSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	f := &floor{mem: mem}
	send, recv := f.ops(shape)
	atomic.StoreUint64(f.word(off(kDesc, 0)), 1) // this side's first receive
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "-child", "-shape", shape, "-n", fmt.Sprint(n))
	cmd.ExtraFiles = []*os.File{file} // fd 3 in the child
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	var oneWay []float64
	for i := uint64(1); i <= uint64(n); i += batch {
		t := time.Now()
		for j := i; j < i+batch; j++ {
			send(1, j)
			recv(0, j)
		}
		oneWay = append(oneWay, float64(time.Since(t).Nanoseconds())/batch/2)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("the echoing process: %w", err)
	}
	slices.Sort(oneWay)
	fmt.Printf("%-8s one way: median %4.0f ns, p10 %4.0f, p90 %4.0f (%d round trips)\n", shape,
		oneWay[len(oneWay)/2], oneWay[len(oneWay)/10], oneWay[len(oneWay)*9/10], n)
	return nil
}

// echo is the child: it maps the memfd it was given as fd 3 and answers n
// messages.
func echo(shape string, n int) error {
	mem, err := unix.Mmap(3, 0, memSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	f := &floor{mem: mem}
	send, recv := f.ops(shape)
	atomic.StoreUint64(f.word(off(kDesc, 1)), 1)
	for i := uint64(1); i <= uint64(n); i++ {
		recv(1, i)
		send(0, i)
	}
	return nil
}

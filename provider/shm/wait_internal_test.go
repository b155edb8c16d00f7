package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Blocking waits sleep in the kernel: CQ.Wait's own thread sleeps in
// futex(2) on the wake word in the CQ's shared header for up to a
// millisecond, then Wait parks its goroutine, and so does the CQ's
// notification goroutine, in Go's network poller on the CQ's
// notification socket, until the peer process, having written a
// completion into the CQ, sends it a byte.

// processCPU returns the CPU time, user and system, this process has used.
func processCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// futexSleeper returns the thread of this process that is blocked in
// futex(2) on addr, if one is.
func futexSleeper(addr uintptr) (tid int, ok bool) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, false
	}
	want := fmt.Sprintf("%d 0x%x ", unix.SYS_FUTEX, addr)
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/syscall")
		if err != nil || !strings.HasPrefix(string(b), want) {
			continue
		}
		id, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue
		}
		// tid (comm) S ...: the state follows the last parenthesis.
		s := string(st)
		if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) && s[i+2] == 'S' {
			return id, true
		}
	}
	return 0, false
}

// idleWindow is how long the idle waiter is measured, in up to
// idleWindows windows one after another.
const (
	idleWindow  = 500 * time.Millisecond
	idleWindows = 3
)

// TestWaitSleepsThenParks: a goroutine in CQ.Wait, with nothing
// arriving, first sleeps in futex(2) on the CQ's shared wake word, then
// parks, leaving no thread asleep there; over an idleWindow the whole
// process uses under 1% of a CPU; a Send from the peer process wakes the
// waiter, which returns the completion.
func TestWaitSleepsThenParks(t *testing.T) {
	p := remoteHarness().NewPair(t, verbstest.PairOptions{})
	src := newRegion(t, p.B, 64, verbs.AccessLocalWrite)
	fill(t, p.B, src, 0, pattern(7, 64))
	dst := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(9, dst.SGE(0, 64)))
	rcq := driverQP(p.A.QPs[0]).recvCQ
	wake := uintptr(unsafe.Pointer(&rcq.ring.h.wake))

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	type result struct {
		wc  verbs.WorkCompletion
		n   int
		err error
		at  time.Time
	}
	res := make(chan result, 1)
	go func() {
		wc := make([]verbs.WorkCompletion, 4)
		n, err := p.A.RecvCQ.Wait(ctx, wc)
		res <- result{wc[0], n, err, time.Now()}
	}()

	// Wait, without burning the CPU, until Wait has slept (a thread in
	// futex on the word, seen if the ticks catch it) and armed the CQ to
	// park.
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	tid := 0
	for rcq.armings.Load() == 0 {
		if id, ok := futexSleeper(wake); ok {
			tid = id
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("CQ.Wait did not arm the CQ")
		}
	}
	tick.Stop()

	// Earlier tests leave the runtime housekeeping to do — a heap to
	// sweep, memory for the background scavenger to return to the system
	// at up to 1% of a CPU — that is not the waiter's: do it now.
	debug.FreeOSMemory()
	// The least of up to idleWindows windows counts: on a loaded host
	// one window may take in work that is not the waiter's (a GC cycle,
	// another test's goroutines winding down), but a waiter that costs
	// CPU costs it in every window.
	var cpu, wall time.Duration
	for range idleWindows {
		cpu0, start := processCPU(t), time.Now()
		window := time.NewTimer(idleWindow)
		<-window.C
		c, w := processCPU(t)-cpu0, time.Since(start)
		if wall == 0 || float64(c)/float64(w) < float64(cpu)/float64(wall) {
			cpu, wall = c, w
		}
		if float64(cpu)/float64(wall) < 0.01 {
			break
		}
	}
	if id, ok := futexSleeper(wake); ok {
		t.Fatalf("after the idle window thread %d is asleep on the wake word: the wait holds a thread", id)
	}
	select {
	case r := <-res:
		t.Fatalf("CQ.Wait returned before anything arrived: %d completions, %v", r.n, r.err)
	default:
	}

	sent := time.Now()
	postSend(t, p.B, 0, send(1, src.SGE(0, 48)))
	r := <-res
	if r.err != nil || r.n != 1 {
		t.Fatalf("CQ.Wait after the peer's Send: %d completions, %v", r.n, r.err)
	}
	expectWC(t, r.wc, 9, verbs.WCSuccess)
	if r.wc.ByteLen != 48 {
		t.Fatalf("received %d bytes, want 48", r.wc.ByteLen)
	}
	expectWC(t, waitWCs(t, p.B, verbstest.SendCQ, 1)[0], 1, verbs.WCSuccess)

	share := float64(cpu) / float64(wall)
	t.Logf("idle waiter: thread %d (0: not seen) asleep in futex on %#x, then parked; process CPU %v in %v (%.3f%% of a CPU); woken %v after asking the peer to send",
		tid, wake, cpu, wall.Round(time.Millisecond), 100*share, r.at.Sub(sent))
	if share >= 0.01 {
		t.Fatalf("while a goroutine waited in CQ.Wait for %v the process used %v of CPU (%.2f%%), want under 1%%", wall, cpu, 100*share)
	}
}

// TestWaitForOwnSendCompletions: a goroutine waiting in CQ.Wait for the
// send completions of Writes that another goroutine of this process posts
// at the same moment is woken for every one of them. (A send completion
// is published with a release store, and the check of the CQ's arming
// after it can overtake it; ReqNotify notices such a completion. That
// window is a few instructions wide, and this test seldom lands in it:
// it guards the wake-up of local completions as a whole.)
func TestWaitForOwnSendCompletions(t *testing.T) {
	const rounds = 3000
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	src := newRegion(t, p.A, 8, verbs.AccessLocalWrite)
	dst := newRegion(t, p.B, 8, verbs.AccessLocalWrite|verbs.RemoteAccess)
	wr := rdma(0, verbs.OpRDMAWrite, src.SGE(0, 8), dst, 0)
	wr.Flags = verbs.SendSignaled
	cq := p.A.SendCQ
	post := make(chan uint64)
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		wrs := []verbs.SendWR{wr}
		for id := range post {
			wrs[0].WRID = id
			if _, err := p.A.QPs[0].PostSend(wrs); err != nil {
				errs <- err
				return
			}
		}
	}()
	wc := make([]verbs.WorkCompletion, 1)
	for i := range uint64(rounds) {
		post <- i
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		n, err := cq.Wait(ctx, wc)
		cancel()
		if err != nil || n != 1 {
			t.Fatalf("round %d: Wait returned %d completions, %v", i, n, err)
		}
		expectWC(t, wc[0], i, verbs.WCSuccess)
	}
	close(post)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestWaitReturnsWhenCancelled: a Wait whose context is cancelled while
// its thread sleeps in futex(2), or once it has parked, returns the
// context's error, and the CQ still works afterwards.
func TestWaitReturnsWhenCancelled(t *testing.T) {
	p := remoteHarness().NewPair(t, verbstest.PairOptions{})
	rcq := driverQP(p.A.QPs[0]).recvCQ
	wake := uintptr(unsafe.Pointer(&rcq.ring.h.wake))
	for _, parked := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		armings := rcq.armings.Load()
		go func() {
			_, err := p.A.RecvCQ.Wait(ctx, make([]verbs.WorkCompletion, 1))
			res <- err
		}()
		limit, stop := context.WithTimeout(context.Background(), waitLimit)
		tick := time.NewTicker(100 * time.Microsecond)
		// Until Wait sleeps in futex (not parked) or has armed the CQ
		// to park (parked; or if the ticks missed the sleep).
		for {
			if _, ok := futexSleeper(wake); ok && !parked {
				break
			}
			if rcq.armings.Load() != armings {
				break
			}
			select {
			case <-tick.C:
			case <-limit.Done():
				t.Fatalf("CQ.Wait neither slept in futex on the CQ's wake word %#x nor armed the CQ", wake)
			}
		}
		tick.Stop()
		cancel()
		select {
		case err := <-res:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait cancelled (parked: %v) returned %v, want context.Canceled", parked, err)
			}
		case <-limit.Done():
			t.Fatalf("Wait did not return within %v of its context's cancellation", waitLimit)
		}
		stop()
	}
	src := newRegion(t, p.B, 64, verbs.AccessLocalWrite)
	dst := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(3, dst.SGE(0, 64)))
	postSend(t, p.B, 0, send(4, src.SGE(0, 16)))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	if n, err := p.A.RecvCQ.Wait(ctx, wc); n != 1 || err != nil {
		t.Fatalf("Wait after the cancelled ones: %d, %v", n, err)
	}
	expectWC(t, wc[0], 3, verbs.WCSuccess)
}

// notifiers returns the notification goroutines of this process's CQs,
// by goroutine id, with their states ("chan receive", "syscall", ...).
func notifiers() map[string]string {
	buf := make([]byte, 1<<20)
	out := map[string]string{}
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, "startWaiter.func1") {
			continue
		}
		header, _, _ := strings.Cut(g, "\n")
		id, state, _ := strings.Cut(strings.TrimPrefix(header, "goroutine "), " [")
		state, _, _ = strings.Cut(state, "]")
		state, _, _ = strings.Cut(state, ",")
		out[id] = state
	}
	return out
}

// notifierState returns the state of the one notification goroutine not
// in before, once it has come to rest, or fails.
func notifierState(t *testing.T, before map[string]string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
		for id, state := range notifiers() {
			// (In a system call for a moment: the non-blocking read
			// before it parks.)
			if _, old := before[id]; !old && state != "runnable" && state != "running" && state != "syscall" {
				return state
			}
		}
	}
	t.Fatal("no new notification goroutine came to rest")
	return ""
}

// TestSleepersLeaveNotifierAlone: the wake-ups CQ.Wait's own sleep asks
// for (Arm) do not wake the CQ's notification goroutine, which Arm starts:
// until a ReqNotify it waits on a channel, not in futex(2) on the wake
// word, where every such wake-up would wake its thread too. After a
// ReqNotify it parks on the CQ's notification socket, and forwards the next
// completion's notification.
func TestSleepersLeaveNotifierAlone(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	src := newRegion(t, p.B, 64, verbs.AccessLocalWrite)
	dst := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	cq := driverQP(p.A.QPs[0]).recvCQ
	before := notifiers() // other CQs' (none, unless a test left one)
	for i := range 3 {
		postRecv(t, p.A, 0, recv(uint64(i), dst.SGE(0, 64)))
		ticket, err := cq.Arm()
		if err != nil {
			t.Fatal(err)
		}
		postSend(t, p.B, 0, send(uint64(i), src.SGE(0, 8)))
		cq.Sleep(ticket, waitLimit) // returns at the Send's notification
		expectWC(t, waitWCs(t, p.A, verbstest.RecvCQ, 1)[0], uint64(i), verbs.WCSuccess)
		if st := notifierState(t, before); st != "chan receive" {
			t.Fatalf("round %d: after a notification for Arm, the notification goroutine is in state %q, want chan receive (woken by every sleeper's notification)", i, st)
		}
	}
	postRecv(t, p.A, 0, recv(9, dst.SGE(0, 64)))
	if err := p.A.RecvCQ.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	// The first arming after the sleepers' rounds may get a token at once
	// (the goroutine saw none of their wake-ups: at worst a spurious
	// token, which the arm, poll, wait loop absorbs): take it and arm
	// again, as that loop does. Then no token comes before a completion.
	notifierState(t, before) // at rest: the token, if any, is there
	select {
	case <-p.A.RecvCQ.Notify():
		if err := p.A.RecvCQ.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
	default:
	}
	if st := notifierState(t, before); st != "IO wait" {
		t.Fatalf("armed, the notification goroutine is in state %q, want IO wait (parked on the CQ's notification socket)", st)
	}
	select {
	case <-p.A.RecvCQ.Notify():
		t.Fatal("a token came for an arming that no completion followed")
	default:
	}
	postSend(t, p.B, 0, send(9, src.SGE(0, 8)))
	select {
	case <-p.A.RecvCQ.Notify():
	case <-time.After(waitLimit):
		t.Fatal("no token on the completion channel after ReqNotify and a completion")
	}
	expectWC(t, waitWCs(t, p.A, verbstest.RecvCQ, 1)[0], 9, verbs.WCSuccess)
}

package perftest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	_ "github.com/goverbs/goverbs/provider/iwarp"
	_ "github.com/goverbs/goverbs/provider/loop"
	_ "github.com/goverbs/goverbs/provider/shm"
	"github.com/goverbs/goverbs/verbs"
)

// devices are the devices these tests run on, both ends in this process
// (shm0 and tcp0 work within one process too; goverbs bench runs its
// server in another, which cmd/goverbs's tests cover). An address
// without %s is used as it is (tcp0's picks a free port).
var devices = []struct{ name, addr string }{
	{"loop0", "loop://perftest-%s"},
	{"shm0", "shm://@goverbs-perftest-%s"},
	{"tcp0", "tcp://127.0.0.1:0"},
}

// startServer serves on device for the test's life and returns the
// address and the client's device.
func startServer(t testing.TB, device, addrFmt string, o ServeOptions) (string, *verbs.Context) {
	t.Helper()
	dev, err := verbs.Open(device)
	if err != nil {
		t.Fatal(err)
	}
	addr := addrFmt
	if strings.Contains(addrFmt, "%s") {
		addr = fmt.Sprintf(addrFmt, strings.ReplaceAll(t.Name(), "/", "-"))
	}
	l, err := cm.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, dev, l, o) }()
	cli, err := verbs.Open(device)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		l.Close()
		dev.Close()
	})
	return l.Addr(), cli
}

// TestRun runs every test on every device, polling and waiting, and
// checks that the figures are all there.
func TestRun(t *testing.T) {
	for _, d := range devices {
		t.Run(d.name, func(t *testing.T) {
			addr, dev := startServer(t, d.name, d.addr, ServeOptions{})
			for _, ev := range []bool{false, true} {
				for _, tt := range Tests {
					if ev && tt == WriteLat {
						continue
					}
					for _, size := range tt.Sizes([]int{2, 4096}) {
						p := DefaultParams(tt, size, dev.QueryDevice())
						p.Iters, p.Warmup, p.Event = 40, 4, ev
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						r, err := Run(ctx, dev, addr, p)
						cancel()
						if err != nil {
							t.Fatalf("%v of %d B, event %v: %v", tt, size, ev, err)
						}
						checkResult(t, r, p, d.name)
					}
				}
			}
		})
	}
}

// TestRunPostList runs the bandwidth tests posting lists of work
// requests, with an iteration count that leaves a short last list.
func TestRunPostList(t *testing.T) {
	for _, d := range devices {
		t.Run(d.name, func(t *testing.T) {
			addr, dev := startServer(t, d.name, d.addr, ServeOptions{})
			for _, tt := range Tests {
				if tt.Latency() {
					continue
				}
				p := DefaultParams(tt, 8, dev.QueryDevice())
				p.Iters, p.Warmup, p.PostList, p.CQMod = 90, 9, 16, 10
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r, err := Run(ctx, dev, addr, p)
				cancel()
				if err != nil {
					t.Fatalf("%v with post lists of %d: %v", tt, p.PostList, err)
				}
				checkResult(t, r, p, d.name)
				if r.PostList != p.PostList {
					t.Errorf("%v: result says post lists of %d, want %d", tt, r.PostList, p.PostList)
				}
			}
		})
	}
}

// TestSendBWCreditStall: on a device without RNR retry (tcp0), send_bw
// keeps the receiver's credits; with few receives (RxDepth 16) and a
// signaled Send only every 100, the sender runs out of credits with
// nothing but unsignaled Sends outstanding, and must wait for credits,
// not for completions that never come.
func TestSendBWCreditStall(t *testing.T) {
	dev, err := verbs.Open("tcp0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srvCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Serve(srvCtx, dev, l, ServeOptions{}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		l.Close()
		dev.Close()
	}()
	cli, err := verbs.Open("tcp0")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	p := DefaultParams(SendBW, 8, cli.QueryDevice())
	p.Iters, p.Warmup, p.RxDepth, p.CQMod = 2000, 0, 16, 100
	r, err := Run(ctx, cli, l.Addr(), p)
	if err != nil {
		t.Fatalf("send_bw with %d receives and one signaled Send in %d: %v", p.RxDepth, p.CQMod, err)
	}
	checkResult(t, r, p, "tcp0")
}

func checkResult(t *testing.T, r *Result, p Params, device string) {
	t.Helper()
	if r.Stack != "goverbs" || r.Device != device || r.Test != p.Test || r.Size != p.Size || r.Iters != p.Iters || r.Event != p.Event {
		t.Errorf("result %+v does not describe the run %+v on %s", r, p, device)
	}
	if p.Test.Latency() {
		l := r.Lat
		if l == nil || r.BW != nil || !(l.Min > 0 && l.Min <= l.Typical && l.Typical <= l.Max && l.Min <= l.Avg && l.P99 <= l.Max) {
			t.Errorf("%v: latency %+v is not ordered min <= typical <= max", p.Test, l)
		}
	} else if b := r.BW; b == nil || r.Lat != nil || !(b.AvgMiBps > 0 && b.PeakMiBps >= b.AvgMiBps && b.Mpps > 0) {
		t.Errorf("%v: bandwidth %+v: want average > 0, peak >= average", p.Test, b)
	}
	if c := r.CPU; c == nil || !c.SameProcess || c.ClientUs < 0 {
		t.Errorf("%v: CPU %+v: want the client's time, the server in the same process", p.Test, c)
	}
}

// TestServeOnly: a server started for some tests refuses others with a
// reason that says what to do.
func TestServeOnly(t *testing.T) {
	addr, dev := startServer(t, "loop0", devices[0].addr, ServeOptions{Only: []Test{WriteBW}})
	p := DefaultParams(ReadLat, 8, dev.QueryDevice())
	p.Iters = 10
	_, err := Run(context.Background(), dev, addr, p)
	var rej *RejectedError
	if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "runs only write_bw") {
		t.Fatalf("Run = %v, want a refusal naming write_bw", err)
	}
	p = DefaultParams(WriteBW, 8, dev.QueryDevice())
	p.Iters = 10
	if _, err := Run(context.Background(), dev, addr, p); err != nil {
		t.Fatalf("the server refused the test it serves: %v", err)
	}
}

// TestRunRefused: nothing listens.
func TestRunRefused(t *testing.T) {
	dev, err := verbs.Open("shm0")
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	p := DefaultParams(ReadLat, 8, dev.QueryDevice())
	if _, err := Run(context.Background(), dev, "shm://@goverbs-perftest-nobody", p); !errors.Is(err, cm.ErrRefused) {
		t.Fatalf("Run = %v, want cm.ErrRefused", err)
	}
}

// loopFuncs are the measured loops; allocations made anywhere below them
// (in the verbs calls they make too) count against them.
var loopFuncs = []string{"sendLat", "writeLat", "opLat", "bw", "recvBW"}

// loopAllocs returns how many allocations the process made, since the
// profile started, in calls that came from a measured loop, on any
// goroutine: the client's loop or the server's. Its own allocations do
// not count.
func loopAllocs() (int64, map[string]int64) {
	runtime.GC()
	runtime.GC() // the profile lags up to two cycles
	n, _ := runtime.MemProfile(nil, true)
	recs := make([]runtime.MemProfileRecord, n+64)
	n, _ = runtime.MemProfile(recs, true)
	var total int64
	where := make(map[string]int64)
	for _, r := range recs[:n] {
		frames := runtime.CallersFrames(r.Stack())
		var stack strings.Builder
		for {
			f, more := frames.Next()
			fmt.Fprintf(&stack, "\t%s:%d\n", f.Function, f.Line)
			if strings.HasSuffix(f.Function, "perftest.loopAllocs") {
				break
			}
			if f.Function == "runtime.acquireSudog" {
				// A goroutine that blocks in a select (CQ.Wait) takes a
				// waiter record from its processor's cache, refilled
				// from a central one that every GC empties — and this
				// function runs two. Those refills, more of them the
				// more goroutines move between processors (up to 4% of
				// operations on a loaded 2-CPU machine), are the
				// runtime's, not the loops'.
				break
			}
			if fn, ok := strings.CutPrefix(f.Function, "github.com/goverbs/goverbs/internal/perftest.(*endpoint)."); ok && slices.Contains(loopFuncs, fn) {
				total += r.AllocObjects
				where[stack.String()] += r.AllocObjects
				break
			}
			if !more {
				break
			}
		}
	}
	return total, where
}

// TestLoopsAllocateNothing: the measured loops allocate nothing per
// operation, on either side, polling or waiting, once warmed up. Every
// allocation is profiled, and those made below a loop function between
// the end of the warm-up and the end of the loop are counted. A few
// one-time events may fall in the measured part — shm maps a segment the
// peer pushed when it arrives, the runtime allocates a waiter the first
// time a provider's mutex is contended — so the test allows one
// allocation per hundred operations; an allocation per operation would
// show a thousand.
func TestLoopsAllocateNothing(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	for _, d := range devices {
		for _, ev := range []bool{false, true} {
			for _, tt := range Tests {
				if ev && tt == WriteLat {
					continue
				}
				name := fmt.Sprintf("%s/%v/event=%v", d.name, tt, ev)
				t.Run(name, func(t *testing.T) {
					addr, dev := startServer(t, d.name, d.addr, ServeOptions{})
					p := DefaultParams(tt, 64, dev.QueryDevice())
					p.Iters, p.Warmup, p.Event = 1000, 50, ev
					e, preposted, err := dial(context.Background(), dev, addr, p)
					if err != nil {
						t.Fatal(err)
					}
					defer e.close()
					var at [2]int64
					var where [2]map[string]int64
					marks := 0
					e.hook = func() {
						at[marks], where[marks] = loopAllocs()
						marks++
					}
					res, err := e.measure(preposted)
					if err == nil {
						err = e.finish(res)
					}
					if err != nil {
						t.Fatal(err)
					}
					if marks != 2 {
						t.Fatalf("the loop marked %d times, want 2", marks)
					}
					if n := at[1] - at[0]; n*100 > int64(p.Iters) {
						t.Errorf("%d allocations in the loops' %d measured iterations", n, p.Iters)
						for stack, k := range where[1] {
							if d := k - where[0][stack]; d > 0 {
								t.Logf("%d allocated at\n%s", d, stack)
							}
						}
					} else if n > 0 {
						t.Logf("%d allocations in %d iterations", n, p.Iters)
					}
				})
			}
		}
	}
}

// benchLoop measures one iteration of test tt's loop at size bytes on
// device d: b.N iterations after the connection is made.
func benchLoop(b *testing.B, device, addrFmt string, tt Test, size int) {
	addr, dev := startServer(b, device, addrFmt, ServeOptions{})
	p := DefaultParams(tt, size, dev.QueryDevice())
	p.Iters, p.Warmup = max(b.N, 5), 0
	e, preposted, err := dial(context.Background(), dev, addr, p)
	if err != nil {
		b.Fatal(err)
	}
	defer e.close()
	posted, completed := make([]int64, p.total()), make([]int64, p.total())
	b.ReportAllocs()
	b.ResetTimer()
	switch tt {
	case SendLat:
		err = e.sendLat(true, posted, preposted)
	case WriteLat:
		err = e.writeLat(true, posted)
	case ReadLat, AtomicLat:
		err = e.opLat(posted)
	default:
		err = e.bw(p.Iters, posted, completed)
	}
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if err := e.finish(&Result{}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLoop is one iteration of each test's measured loop (a round
// trip for send_lat and write_lat, one operation otherwise) at 8 bytes,
// both ends in this process.
func BenchmarkLoop(b *testing.B) {
	for _, d := range devices {
		for _, tt := range Tests {
			b.Run(d.name+"/"+tt.String(), func(b *testing.B) { benchLoop(b, d.name, d.addr, tt, 8) })
		}
	}
}

// TestRunAllBudget: with a budget, a run whose iterations would take
// longer runs fewer of them, never fewer than MinBudgetIters; without,
// it runs what it was asked.
func TestRunAllBudget(t *testing.T) {
	addr, dev := startServer(t, "loop0", devices[0].addr, ServeOptions{})
	s := Suite{Tests: []Test{ReadLat, WriteBW}, Sizes: []int{8}, Overrides: NoOverrides}
	s.Overrides.Iters = 400
	ps := s.Params(dev.QueryDevice())
	rs, err := RunAll(context.Background(), dev, addr, ps, RunOptions{Timeout: time.Minute, Budget: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Iters != MinBudgetIters {
			t.Errorf("%v ran %d iterations within a budget of 1ns, want the minimum %d", r.Test, r.Iters, MinBudgetIters)
		}
	}
	var seen []Test
	rs, err = RunAll(context.Background(), dev, addr, ps, RunOptions{Timeout: time.Minute,
		Progress: func(i int, p Params) { seen = append(seen, p.Test) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || rs[0].Iters != 400 || rs[1].Iters != 400 {
		t.Errorf("without a budget: progress %v, iterations %d and %d, want 400", seen, rs[0].Iters, rs[1].Iters)
	}
}

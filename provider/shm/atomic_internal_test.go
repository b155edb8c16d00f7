package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Atomics are CPU atomic instructions on the shared word: two processes,
// each with four QPs, each QP issuing FetchAndAdds of 1 on one counter
// that lives in a third process (this one), which meanwhile adds to the
// same word with CPU atomics of its own. Every add lands exactly once:
// the counter ends at the number of adds, and the values fetched — each
// the counter's value just before one add — are exactly 0, 1, ..., total-1
// (their count and sum say so; each QP also sees its own values strictly
// increase).

const (
	envFAAAddr = "GOVERBS_SHM_FAA_ADDR"
	envFAAOps  = "GOVERBS_SHM_FAA_OPS"
	faaQPs     = 4
	faaWindow  = 16 // FetchAndAdds per PostSend, the last one signaled
)

func init() { childModes["faa"] = faaChild }

// faaChild is the child mode "faa": faaQPs QPs connect to the counter's
// owner and each does GOVERBS_SHM_FAA_OPS FetchAndAdds of 1 on it; the
// child reports "done COUNT SUMHI SUMLO", the 128-bit sum of the values
// it fetched.
func faaChild() int {
	ops, err := strconv.Atoi(os.Getenv(envFAAOps))
	if err != nil || ops%faaWindow != 0 {
		return childFail("bad %s", envFAAOps)
	}
	ctx, err := verbs.Open(DeviceName)
	if err != nil {
		return childFail("open: %v", err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		return childFail("%v", err)
	}
	res, err := pd.AllocMR(faaQPs*faaWindow*8, verbs.AccessLocalWrite)
	if err != nil {
		return childFail("%v", err)
	}
	type lane struct {
		qp   *verbs.QP
		cq   *verbs.CQ
		conn *cm.Conn
	}
	lanes := make([]lane, faaQPs)
	dctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var counterAddr uint64
	var counterKey uint32
	for i := range lanes {
		l := &lanes[i]
		if l.cq, err = ctx.CreateCQ(64); err != nil {
			return childFail("%v", err)
		}
		if l.qp, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: l.cq, RecvCQ: l.cq,
			Cap: verbs.QPCap{MaxSendWR: faaWindow, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
			return childFail("%v", err)
		}
		if l.conn, err = cm.Dial(dctx, os.Getenv(envFAAAddr), l.qp, nil); err != nil {
			return childFail("dial: %v", err)
		}
		defer l.conn.Close()
		pdata := l.conn.PrivateData()
		counterAddr, counterKey = binary.LittleEndian.Uint64(pdata), binary.LittleEndian.Uint32(pdata[8:])
	}
	say("connected")
	var wg sync.WaitGroup
	var count, sumHi, sumLo atomic.Uint64
	var failed atomic.Value
	for i := range lanes {
		wg.Go(func() {
			l := &lanes[i]
			out := res.Bytes()[i*faaWindow*8 : (i+1)*faaWindow*8]
			wrs := make([]verbs.SendWR, faaWindow)
			for j := range wrs {
				wrs[j] = verbs.SendWR{WRID: uint64(j), Opcode: verbs.OpAtomicFetchAndAdd, CompareAdd: 1,
					SGList: []verbs.SGE{res.SGE(i*faaWindow*8+j*8, 8)}, RemoteAddr: counterAddr, RKey: counterKey}
			}
			wrs[faaWindow-1].Flags = verbs.SendSignaled
			wc := make([]verbs.WorkCompletion, 1)
			var hi, lo, last uint64
			first := true
			for range ops / faaWindow {
				if _, err := l.qp.PostSend(wrs); err != nil {
					failed.Store(fmt.Sprintf("QP %d: post: %v", i, err))
					return
				}
				deadline := time.Now().Add(waitLimit)
				for l.cq.Poll(wc) == 0 {
					if time.Now().After(deadline) {
						failed.Store(fmt.Sprintf("QP %d: no completion", i))
						return
					}
				}
				if wc[0].Status != verbs.WCSuccess {
					failed.Store(fmt.Sprintf("QP %d: FetchAndAdd completed with %v", i, wc[0].Status))
					return
				}
				for j := range faaWindow {
					v := binary.NativeEndian.Uint64(out[j*8:])
					if !first && v <= last {
						failed.Store(fmt.Sprintf("QP %d fetched %d after %d: not increasing", i, v, last))
						return
					}
					first, last = false, v
					var c uint64
					lo, c = bits.Add64(lo, v, 0)
					hi += c
				}
			}
			count.Add(uint64(ops))
			// Sum the lanes' 128-bit sums.
			for {
				ol, oh := sumLo.Load(), sumHi.Load()
				nl, c := bits.Add64(ol, lo, 0)
				if sumLo.CompareAndSwap(ol, nl) {
					sumHi.Add(hi + c)
					_ = oh
					break
				}
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f != nil {
		return childFail("%s", f)
	}
	say("done %d %d %d", count.Load(), sumHi.Load(), sumLo.Load())
	return 0
}

// takeFAAReport handles a line from a child: its final report is counted
// (and its line channel set to nil); an error or an early exit fails the
// test. It returns 1 for the final report.
func takeFAAReport(t *testing.T, c *child, l string, ok bool, lines *<-chan string, count, hi, lo *uint64) int {
	t.Helper()
	switch {
	case !ok:
		<-c.exited
		t.Fatalf("child exited (%v) before its report; stderr:\n%s", c.err, c.stderr.String())
	case strings.HasPrefix(l, "error"):
		t.Fatalf("child: %s", l)
	case strings.HasPrefix(l, "done "):
		*count += parseFAAReport(t, l, hi, lo)
		*lines = nil
		return 1
	}
	return 0
}

// parseFAAReport adds a child's "done COUNT SUMHI SUMLO" to the 128-bit
// sum hi:lo and returns COUNT.
func parseFAAReport(t *testing.T, l string, hi, lo *uint64) uint64 {
	t.Helper()
	f := strings.Fields(strings.TrimPrefix(l, "done "))
	var v [3]uint64
	for i := range v {
		var err error
		if len(f) != 3 {
			err = fmt.Errorf("%d fields", len(f))
		} else {
			v[i], err = strconv.ParseUint(f[i], 10, 64)
		}
		if err != nil {
			t.Fatalf("child reported %q: %v", l, err)
		}
	}
	var c uint64
	*lo, c = bits.Add64(*lo, v[2], 0)
	*hi += v[1] + c
	return v[0]
}

// TestAtomicsExactTwoProcesses: 2 processes × 4 QPs × N FetchAndAdds
// (N = 10^6, or 10^4 with -short) on one counter in this process, which
// adds to it with CPU atomics meanwhile, give the exact total.
func TestAtomicsExactTwoProcesses(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 10_000
	}
	const procs = 2
	e, err := verbstest.NewLocal(DeviceName, verbstest.PairOptions{QPs: procs * faaQPs}.Defaults(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	counter, err := e.PD.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	word := (*uint64)(unsafe.Pointer(&counter.Bytes()[0]))
	addr := uniqueAddr("faa")
	l, err := cm.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	children := make([]*child, procs)
	for i := range children {
		children[i] = spawn(t, "faa", envFAAAddr+"="+addr, envFAAOps+"="+strconv.Itoa(n))
	}
	pdata := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint64(nil, counter.Addr()), counter.RKey())
	actx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for _, q := range e.QPs {
		req, err := l.Accept(actx)
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
		c, err := req.Accept(q, &cm.Param{PrivateData: pdata})
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
		e.Conns = append(e.Conns, c)
	}
	for _, c := range children {
		c.expect("connected", waitLimit)
	}
	// While the children run, this process adds to the same word with
	// CPU atomics, a few every half millisecond, until both are done.
	start := time.Now()
	var hi, lo, count, local uint64
	add := func(v uint64) {
		var c uint64
		lo, c = bits.Add64(lo, v, 0)
		hi += c
	}
	tick := time.NewTicker(500 * time.Microsecond)
	defer tick.Stop()
	limit := time.NewTimer(10 * time.Minute)
	defer limit.Stop()
	lines := make([]<-chan string, procs)
	for i, c := range children {
		lines[i] = c.lines
	}
	for done := 0; done < procs; {
		select {
		case <-tick.C:
			for range 64 {
				add(atomic.AddUint64(word, 1) - 1)
			}
			local += 64
			continue
		case <-limit.C:
			t.Fatal("the children did not finish within 10 minutes")
		case l, ok := <-lines[0]:
			done += takeFAAReport(t, children[0], l, ok, &lines[0], &count, &hi, &lo)
		case l, ok := <-lines[1]:
			done += takeFAAReport(t, children[1], l, ok, &lines[1], &count, &hi, &lo)
		}
	}
	for _, c := range children {
		if err := c.wait(waitLimit); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	count += local
	elapsed := time.Since(start)
	total := uint64(n)*procs*faaQPs + local
	if count != total {
		t.Fatalf("%d adds reported, want %d", count, total)
	}
	if got := atomic.LoadUint64(word); got != total {
		t.Fatalf("counter holds %d after %d adds of 1", got, total)
	}
	// The values fetched are 0..total-1 exactly once each: their sum is
	// total*(total-1)/2.
	wantHi, wantLo := bits.Mul64(total, total-1)
	wantLo = wantLo>>1 | wantHi<<63
	wantHi >>= 1
	if hi != wantHi || lo != wantLo {
		t.Fatalf("the values fetched sum to %#x%016x, want %#x%016x: some add was lost or seen twice", hi, lo, wantHi, wantLo)
	}
	t.Logf("%d FetchAndAdds from %d processes × %d QPs and %d CPU atomic adds here, in %v: counter %d",
		uint64(n)*procs*faaQPs, procs, faaQPs, local, elapsed, total)
}

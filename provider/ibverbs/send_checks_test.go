package ibverbs

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"
	"weak"

	"github.com/goverbs/goverbs/verbs/driver"
)

// checkRig is a QP, its PD with two regions and its device, for the send
// checks, which touch no C memory.
type checkRig struct {
	q       *qp
	a, b    []byte // the regions' bytes: lkeys 1 and 2
	outside []byte // registered nowhere
	regionA *mr
}

func newCheckRig(caps driver.DeviceCaps, maxSGERd int, cp driver.QPCap) *checkRig {
	r := &checkRig{a: make([]byte, 256), b: make([]byte, 64), outside: make([]byte, 64)}
	c := &devContext{name: "checks", attr: driver.DeviceAttr{Caps: caps}, maxSGERd: maxSGERd}
	d := &pd{ctx: c, byLKey: map[uint32]*mr{}}
	r.regionA = &mr{pd: d, buf: r.a, lkey: 1}
	d.addRegion(r.regionA)
	d.addRegion(&mr{pd: d, buf: r.b, lkey: 2})
	r.q = &qp{pd: d, ctx: c, cap: cp}
	r.q.prepare()
	return r
}

// sge is the SGE of n bytes at off in buf, with lkey.
func sge(buf []byte, off int, n uint32, lkey uint32) driver.SGE {
	return driver.SGE{Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))) + uint64(off), Length: n, LKey: lkey}
}

// reference is the verdict of the checks without checkSend's quick path
// and without the QP's cache of inline regions: a QP that has seen no WR.
func (r *checkRig) reference(wr *driver.SendWR) error {
	fresh := &qp{pd: r.q.pd, ctx: r.q.ctx, cap: r.q.cap}
	return fresh.checkSendAll(wr)
}

// sgLists are SGE lists that pass or fail each of the checks on an SGE
// list: count, inline length, region, lkey, an atomic's 8 bytes.
func (r *checkRig) sgLists() [][]driver.SGE {
	return [][]driver.SGE{
		nil,
		{sge(r.a, 0, 8, 1)},
		{sge(r.a, 248, 8, 1)},
		{sge(r.a, 249, 8, 1)}, // runs past region 1
		{sge(r.a, 0, 8, 2)},   // region 1's bytes, region 2's lkey
		{sge(r.a, 0, 8, 9)},   // no region has lkey 9
		{sge(r.outside, 0, 8, 1)},
		{sge(r.a, 0, 0, 9)}, // empty
		{sge(r.a, 0, 64, 1)},
		{sge(r.a, 0, 65, 1)}, // beyond MaxInlineData
		{sge(r.a, 0, 200, 1)},
		{sge(r.a, 0, 8, 1), sge(r.b, 0, 8, 2)},
		{sge(r.a, 0, 4, 1), sge(r.b, 0, 4, 2)},
		{sge(r.a, 0, 8, 1), sge(r.outside, 0, 8, 2)},
		{sge(r.a, 0, 8, 1), sge(r.b, 0, 8, 2), sge(r.b, 8, 8, 2)},
		{{Addr: ^uint64(0) - 3, Length: 8, LKey: 1}}, // wraps around
	}
}

// TestSendQuickChecksAgree: checkSend, with its quick path and its cache
// of the region an inline payload lay in, takes and refuses exactly the
// send WRs the full checks do, with the same error, on devices with and
// without immediate data, memory windows, atomics and multi-SGE Reads,
// for every opcode (and some that are none), flag and SGE list.
func TestSendQuickChecksAgree(t *testing.T) {
	devices := []struct {
		caps     driver.DeviceCaps
		maxSGERd int
	}{
		{driver.CapImmData | driver.CapAtomics | driver.CapMemoryWindows, 2},
		{0, 1},
		{driver.CapImmData, 3},
		{driver.CapMemoryWindows | driver.CapAtomics, 0},
	}
	caps := []driver.QPCap{
		{MaxSendWR: 8, MaxSendSGE: 2, MaxInlineData: 64},
		{MaxSendWR: 8, MaxSendSGE: 1, MaxInlineData: 0},
		{MaxSendWR: 8, MaxSendSGE: 3, MaxInlineData: 220},
	}
	flags := []driver.SendFlags{0, driver.SendSignaled, driver.SendInline, driver.SendInline | driver.SendSignaled | driver.SendSolicited}
	quick, checked := 0, 0
	for _, dev := range devices {
		for _, cp := range caps {
			r := newCheckRig(dev.caps, dev.maxSGERd, cp)
			for _, sg := range r.sgLists() {
				for op := driver.Opcode(0); op < 40; op++ {
					for _, f := range flags {
						wr := &driver.SendWR{Opcode: op, Flags: f, SGList: sg}
						want := r.reference(wr)
						// Twice: the first may fill the cache the second
						// reads.
						for range 2 {
							got := r.q.checkSend(wr)
							if fmt.Sprint(got) != fmt.Sprint(want) {
								t.Fatalf("device %v (%d Read SGEs), QP %+v: %v, flags %#x, SGEs %+v: checkSend says %v, the full checks %v",
									dev.caps, dev.maxSGERd, cp, op, f, sg, got, want)
							}
						}
						checked++
						if want == nil && r.q.plainOps&(1<<op) != 0 && len(sg) <= int(cp.MaxSendSGE) {
							quick++
						}
					}
				}
			}
		}
	}
	if quick == 0 || quick == checked {
		t.Fatalf("%d of %d WRs are on the quick path: the test does not exercise both paths", quick, checked)
	}
}

// TestInlineCacheFollowsRegions: an inline payload in a region the QP
// took one from before is refused once the region is deregistered, and
// checked against the new region when its lkey is another region's.
func TestInlineCacheFollowsRegions(t *testing.T) {
	r := newCheckRig(driver.CapImmData, 1, driver.QPCap{MaxSendWR: 8, MaxSendSGE: 1, MaxInlineData: 64})
	d := r.q.pd
	wr := &driver.SendWR{Opcode: driver.OpRDMAWrite, Flags: driver.SendInline, SGList: []driver.SGE{sge(r.a, 16, 8, 1)}}
	for range 2 {
		if err := r.q.checkSend(wr); err != nil {
			t.Fatalf("an inline payload in region 1: %v", err)
		}
	}
	if start := uint64(uintptr(unsafe.Pointer(&r.regionA.buf[0]))); r.q.inlineLKey != r.regionA.lkey ||
		r.q.inlineStart != start || r.q.inlineEnd != start+uint64(len(r.regionA.buf)) {
		t.Fatalf("the QP's cache holds lkey %d [%#x, %#x), want region 1's", r.q.inlineLKey, r.q.inlineStart, r.q.inlineEnd)
	}
	d.dropRegion(r.regionA)
	if err := r.q.checkSend(wr); err == nil {
		t.Fatal("an inline payload in a deregistered region was taken")
	}
	// A new region with lkey 1, smaller than the old one: the payload at
	// 16 in the old region's bytes is outside it.
	d.addRegion(&mr{pd: d, buf: r.a[:16], lkey: 1})
	if err := r.q.checkSend(wr); err == nil {
		t.Fatal("an inline payload outside the region that now has its lkey was taken")
	}
	wr.SGList[0] = sge(r.a, 8, 8, 1)
	if err := r.q.checkSend(wr); err != nil {
		t.Fatalf("an inline payload inside the new region: %v", err)
	}
}

// TestInlineCacheKeepsNoRegionAlive: what a QP keeps of the region its
// last inline payload lay in does not keep the region's memory alive
// once the region is deregistered.
func TestInlineCacheKeepsNoRegionAlive(t *testing.T) {
	r := newCheckRig(driver.CapImmData, 1, driver.QPCap{MaxSendWR: 8, MaxSendSGE: 1, MaxInlineData: 64})
	big := make([]byte, 1<<20)
	gone := weak.Make(&big[0])
	m := &mr{pd: r.q.pd, buf: big, lkey: 7}
	r.q.pd.addRegion(m)
	wr := &driver.SendWR{Opcode: driver.OpRDMAWrite, Flags: driver.SendInline, SGList: []driver.SGE{sge(big, 0, 8, 7)}}
	if err := r.q.checkSend(wr); err != nil {
		t.Fatal(err)
	}
	r.q.pd.dropRegion(m)
	m, big, wr = nil, nil, nil
	runtime.GC()
	runtime.GC()
	if gone.Value() != nil {
		t.Fatal("the memory of a deregistered region is still reachable from the QP that sent inline from it")
	}
	runtime.KeepAlive(r)
}

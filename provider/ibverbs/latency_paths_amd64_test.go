package ibverbs

import (
	"fmt"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// A latency-path case: what sets a goSide up, and the WR.
type latencyCase struct {
	name  string
	setup func(g *goSide)
}

// latencyCases are the conditions PostSend's and PostRecv's latency
// paths check in line or leave to the general path: every state, the
// QP destroyed, the device removed, a full queue.
var latencyCases = []latencyCase{
	{"RTS", func(g *goSide) {}},
	{"Reset", func(g *goSide) { g.q.state.Store(uint32(driver.QPSReset)) }},
	{"Init", func(g *goSide) { g.q.state.Store(uint32(driver.QPSInit)) }},
	{"RTR", func(g *goSide) { g.q.state.Store(uint32(driver.QPSRTR)) }},
	{"SQD", func(g *goSide) { g.q.state.Store(uint32(driver.QPSSQD)) }},
	{"gone", func(g *goSide) { g.q.gone.Store(true) }},
	{"removed", func(g *goSide) { g.q.ctx.removed.Store(true) }},
	{"sendFull", func(g *goSide) { g.q.sqPosted.Store(uint64(g.q.cap.MaxSendWR)) }},
	{"recvFull", func(g *goSide) { g.q.rqPosted.Store(uint64(g.q.cap.MaxRecvWR)) }},
}

// latencyRig is a goSide with a registered region for inline payloads.
func latencyRig(t *testing.T, setup func(*goSide)) (*goSide, []byte) {
	g := newGoSide(t)
	buf := make([]byte, 64)
	g.q.cap.MaxInlineData = 16
	g.q.pd.byLKey = map[uint32]*mr{}
	g.q.pd.addRegion(&mr{pd: g.q.pd, buf: buf, lkey: 1})
	g.q.prepare()
	setup(g)
	return g, buf
}

// TestPostSendLatencyPathAgrees: PostSend of one WR answers as the
// general path does, with the same count, error and accounting, for
// every case of latencyCases and WRs its quick checks take and refuse:
// too many SGEs, inline payloads too long or outside any region, an
// opcode the device lacks, a window bind, and post_send's failure (the
// stand-in returns nonzero for a WRID whose low byte is not 0).
func TestPostSendLatencyPathAgrees(t *testing.T) {
	wrs := func(buf []byte) map[string]driver.SendWR {
		one := []driver.SGE{sge(buf, 0, 8, 1)}
		return map[string]driver.SendWR{
			"send":            {WRID: 0x100, Opcode: driver.OpSend, SGList: one},
			"signaled":        {WRID: 0x100, Opcode: driver.OpSend, Flags: driver.SendSignaled, SGList: one},
			"write inline":    {WRID: 0x100, Opcode: driver.OpRDMAWrite, Flags: driver.SendSignaled | driver.SendInline, SGList: one, RKey: 2},
			"inline too long": {WRID: 0x100, Opcode: driver.OpSend, Flags: driver.SendInline, SGList: []driver.SGE{sge(buf, 0, 17, 1)}},
			"inline outside":  {WRID: 0x100, Opcode: driver.OpSend, Flags: driver.SendInline, SGList: []driver.SGE{sge(buf, 60, 8, 1)}},
			"two SGEs":        {WRID: 0x100, Opcode: driver.OpSend, SGList: []driver.SGE{one[0], one[0]}},
			"atomic":          {WRID: 0x100, Opcode: driver.OpAtomicFetchAndAdd, SGList: one},
			"bind":            {WRID: 0x100, Opcode: driver.OpBindMW},
			"post fails":      {WRID: 0x1ff, Opcode: driver.OpSend, Flags: driver.SendSignaled, SGList: one},
		}
	}
	for _, c := range latencyCases {
		for name := range wrs(make([]byte, 64)) {
			fast, fbuf := latencyRig(t, c.setup)
			general, gbuf := latencyRig(t, c.setup)
			fw, gw := wrs(fbuf)[name], wrs(gbuf)[name]
			fn, ferr := fast.q.PostSend([]driver.SendWR{fw})
			gn, gerr := general.q.postSendAll([]driver.SendWR{gw})
			got := fmt.Sprint(fn, ferr, fast.q.sqPosted.Load(), fast.q.sqRetired.Load(), fast.q.sqLen)
			want := fmt.Sprint(gn, gerr, general.q.sqPosted.Load(), general.q.sqRetired.Load(), general.q.sqLen)
			if got != want {
				t.Errorf("%s, %s: PostSend gives %s, the general path %s", c.name, name, got, want)
			}
		}
	}
}

// TestPostRecvLatencyPathAgrees: PostRecv of one receive answers as the
// general path does, with the same count, error and accounting, for
// every case of latencyCases, a QP of an SRQ, too many SGEs, none, and
// post_recv's failure.
func TestPostRecvLatencyPathAgrees(t *testing.T) {
	wrs := func(buf []byte) map[string]driver.RecvWR {
		one := []driver.SGE{sge(buf, 0, 8, 1)}
		return map[string]driver.RecvWR{
			"recv":       {WRID: 0x100, SGList: one},
			"no SGEs":    {WRID: 0x100},
			"two SGEs":   {WRID: 0x100, SGList: []driver.SGE{one[0], one[0]}},
			"post fails": {WRID: 0x1ff, SGList: one},
		}
	}
	cases := append([]latencyCase{{"SRQ", func(g *goSide) { g.q.srq = &srq{} }}}, latencyCases...)
	for _, c := range cases {
		for name := range wrs(make([]byte, 64)) {
			fast, fbuf := latencyRig(t, c.setup)
			general, gbuf := latencyRig(t, c.setup)
			fw, gw := wrs(fbuf)[name], wrs(gbuf)[name]
			fn, ferr := fast.q.PostRecv([]driver.RecvWR{fw})
			gn, gerr := general.q.postRecvAll([]driver.RecvWR{gw})
			got := fmt.Sprint(fn, ferr, fast.q.rqPosted.Load(), fast.q.rwr[0].numSGE, fast.q.rwr[0].sgList != 0)
			want := fmt.Sprint(gn, gerr, general.q.rqPosted.Load(), general.q.rwr[0].numSGE, general.q.rwr[0].sgList != 0)
			if got != want {
				t.Errorf("%s, %s: PostRecv gives %s, the general path %s", c.name, name, got, want)
			}
		}
	}
}

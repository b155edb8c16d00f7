//go:build !race

package shm

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestNoPeerWriteAfterDereg: a peer's RDMA Write of 64 MiB into a
// region is under way when the region is deregistered. Once Dereg has
// returned the Write touches it no more: the peer checked the key once,
// before its copy, and went on writing into memory that is no longer
// registered (the Go heap, or the rest of a live AllocMR), which the
// application may already reuse. (Without the race detector: this test
// watches memory that the peer's copy writes.)
func TestNoPeerWriteAfterDereg(t *testing.T) {
	for _, kind := range []string{"process", "segment"} {
		t.Run(kind, func(t *testing.T) {
			p := localHarness().NewPair(t, verbstest.PairOptions{})
			b := p.B.(*verbstest.Local)
			const n = 64 << 20
			var buf []byte
			if kind == "process" {
				buf = make([]byte, n)
			} else {
				buf = allocMR(t, p.A.PD, n+4096, verbs.AccessLocalWrite).Bytes()[:n]
			}
			victim, err := p.A.PD.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			src := allocMR(t, b.PD, n, verbs.AccessLocalWrite)
			for i := range src.Bytes() {
				src.Bytes()[i] = 0xff
			}
			wr := verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{{Addr: src.Addr(), Length: n, LKey: src.LKey()}}, RemoteAddr: victim.Addr(), RKey: victim.RKey()}
			posted := make(chan struct{})
			go func() {
				defer close(posted)
				b.QPs[0].PostSend([]verbs.SendWR{wr})
			}()
			for deadline := time.Now().Add(10 * time.Second); buf[0] == 0; {
				if time.Now().After(deadline) {
					t.Fatal("the Write never began")
				}
			}
			if err := victim.Dereg(); err != nil {
				t.Fatal(err)
			}
			atDereg := buf[n-1]
			waitWCs(t, p.B, verbstest.SendCQ, 1)
			<-posted
			if atDereg != buf[n-1] {
				t.Errorf("the peer's Write went on into the region after Dereg returned: its last byte was %#x then, %#x after", atDereg, buf[n-1])
			}
		})
	}
}

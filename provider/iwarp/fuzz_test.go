package iwarp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Stand-ins the fuzz inputs use for the victim region's STag and
// address, which change from run to run: the harness replaces them, so
// that the fuzzer can aim at the region.
const (
	fuzzSTag = 0x11223344
	fuzzAddr = 0x5566778800000000
)

// fuzzSeeds are streams of FPDUs a well-behaved peer sends, for the
// fuzzer to mutate.
func fuzzSeeds() [][]byte {
	h := &hostile{msn: [wire.NumQN]uint32{1, 1, 1, 1}}
	var seeds [][]byte
	seeds = append(seeds, h.write(fuzzSTag, fuzzAddr+16, []byte("fuzzing writes")))
	send := h.untagged(wire.OpSendSE, wire.QNSend, 5)
	seeds = append(seeds, h.fpdu(send, []byte("hello")))
	seeds = append(seeds, h.readRequest(64, fuzzSTag, fuzzAddr))
	a := make([]byte, wire.AtomicReqLen)
	wire.AtomicRequest(a).Set(1, wire.AtomicCmpSwap, 9, fuzzSTag, fuzzAddr+8, 1, ^uint64(0), 0x5a5a5a5a5a5a5a5a, ^uint64(0))
	seeds = append(seeds, h.fpdu(a, nil))
	imm := make([]byte, wire.ImmDataLen)
	wire.ImmData(imm).Set(false, 2, 77, 0)
	seeds = append(seeds, append(h.write(fuzzSTag, fuzzAddr, []byte("w")), h.fpdu(imm, nil)...))
	var term [wire.TerminateMaxLen]byte
	n := wire.SetTerminate(term[:], 1, wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds, wire.Hdr(h.write(fuzzSTag, 0, nil)))
	seeds = append(seeds, h.fpdu(term[:n], nil))
	return seeds
}

// aim replaces the stand-ins in a fuzz stream: fuzzSTag by the region's
// STag, and an 8-byte offset fuzzAddr+k by the region's address plus k.
func aim(stream []byte, r verbstest.Region) []byte {
	stream = append([]byte(nil), stream...)
	var stag, real [4]byte
	binary.BigEndian.PutUint32(stag[:], fuzzSTag)
	binary.BigEndian.PutUint32(real[:], r.RKey)
	stream = bytes.ReplaceAll(stream, stag[:], real[:])
	for i := 0; i+8 <= len(stream); i++ {
		if v := binary.BigEndian.Uint64(stream[i:]); v>>32 == fuzzAddr>>32 {
			binary.BigEndian.PutUint64(stream[i:], r.Addr+(v&0xffffffff))
		}
	}
	return stream
}

// FuzzReceive sends the victim a stream of arbitrary bytes after a good
// connection setup (RFC 7306 negotiated, receives posted, a region with
// every right): whatever the bytes, the victim must not panic, must not
// write outside its registered regions (the canaries around the region
// and its receive buffers stay intact), and must end with its QP in the
// error state once the stream ends, without hanging.
func FuzzReceive(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		v := newVictim(t, 4)
		g := guard(t, v, 256, verbs.AccessLocalWrite|verbs.RemoteAccess)
		rb := guard(t, v, 64, verbs.AccessLocalWrite)
		h := dialHostile(t, v, false, true, false)
		if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{rb.r.SGE(0, 32)}},
			{WRID: 2, SGList: []verbs.SGE{rb.r.SGE(32, 32)}}}); n != 2 {
			t.Fatalf("post receives: %v", err)
		}
		stream = aim(stream, g.r)
		h.pour(stream, "victim")
		expectVictimError(t, v)
		for _, r := range []guarded{g, rb} {
			if ok, err := v.e.CanariesIntact(r.r.ID); err != nil || !ok {
				t.Fatalf("a byte around the victim's region %d changed (intact %v, %v)", r.r.ID, ok, err)
			}
		}
		// Every posted receive completes, in order.
		wcs, err := v.e.Completions(verbstest.RecvCQ, 2, 5*time.Second)
		if err != nil || len(wcs) != 2 || wcs[0].WRID != 1 || wcs[1].WRID != 2 {
			t.Fatalf("receive completions %+v, %v: want WRIDs 1 and 2", wcs, err)
		}
	})
}

// FuzzMPARequest sends a listener an arbitrary MPA Request: it must not
// panic, and must either hand the request to Accept (which answers it)
// or drop the connection and keep listening.
func FuzzMPARequest(f *testing.F) {
	req := make(wire.Frame, wire.FrameHeaderLen+wire.V2Len+3)
	req.SetHeader(wire.KeyReq, wire.FlagEnhanced|wire.FlagExtOffer, wire.Revision2, wire.V2Len+3)
	wire.V2(req[wire.FrameHeaderLen:]).Set(2, 2, true, wire.RTRWrite|wire.RTRRead)
	f.Add([]byte(req))
	f.Add([]byte(wire.KeyReq + "\x80\x01\x00\x00"))
	f.Add([]byte(wire.KeyReq + "\x00\x02\x00\x02ab"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		nc, accepted := acceptRaw(t, ctx, func(r *cm.Request) error {
			var err error
			if p := r.Param(); len(p.PrivateData) > wire.MaxPrivateData {
				err = fmt.Errorf("request with %d bytes of private data", len(p.PrivateData))
			}
			r.Reject([]byte("no"))
			return err
		})
		nc.Write(b)
		nc.(*net.TCPConn).CloseWrite()
		// The listener answers (Accept rejects) or drops the
		// connection; either way the stream ends.
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, nc); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the listener neither answered nor dropped the connection: %v", err)
		}
		cancel()
		if err := <-accepted; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		nc.Close()
	})
}

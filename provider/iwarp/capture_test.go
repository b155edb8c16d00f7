package iwarp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// TestCaptureDecodes records a session that uses every RDMAP opcode
// (RFC 5040 and RFC 7306) through a recording TCP proxy, writes it as a
// pcap file, and has tshark decode it: every FPDU must decode as
// iwarp_mpa / iwarp_ddp_rdmap, with no malformed packet and no expert
// error, CRCs good when CRC is on. It needs tshark (Debian package
// tshark) and skips without it.
func TestCaptureDecodes(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (apt-get install tshark): the capture cannot be decoded")
	}
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("CRC=%v", crc), func(t *testing.T) {
			prev := iwarp.CRC()
			iwarp.SetCRC(crc)
			defer iwarp.SetCRC(prev)
			rec := recordSession(t)
			path := filepath.Join(t.TempDir(), "session.pcap")
			if d := os.Getenv("GOVERBS_CAPTURE_DIR"); d != "" {
				path = filepath.Join(d, fmt.Sprintf("iwarp-crc-%v.pcap", crc))
			}
			if err := rec.writePcap(path); err != nil {
				t.Fatalf("write pcap: %v", err)
			}
			checkCapture(t, tshark, path, crc)
		})
	}
}

// checkCapture runs tshark on the capture and checks what it decoded.
func checkCapture(t *testing.T, tshark, path string, crc bool) {
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, tshark, append([]string{"-n", "-r", path}, args...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("tshark %q: %v\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	if bad := run("-Y", "_ws.malformed || _ws.expert.severity == error"); strings.TrimSpace(bad) != "" {
		t.Fatalf("tshark finds malformed packets or expert errors:\n%s\n%s", bad, run("-q", "-z", "expert"))
	}
	t.Logf("tshark expert summary (warnings are RFC 6581 fields in the MPA Request, which the dissector checks against RFC 5044):\n%s", run("-q", "-z", "expert"))
	ops := map[int]bool{}
	for _, l := range strings.Split(run("-T", "fields", "-e", "iwarp_rdma.opcode"), "\n") {
		for _, f := range strings.Split(l, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			v, err := strconv.ParseUint(strings.TrimPrefix(f, "0x"), 16, 8)
			if err != nil {
				t.Fatalf("opcode field %q", f)
			}
			ops[int(v)] = true
		}
	}
	for op := 0; op <= 0xb; op++ {
		if !ops[op] {
			t.Errorf("no FPDU with RDMAP opcode %#x in the capture (decoded: %v)", op, ops)
		}
	}
	if n := strings.Count(run("-Y", "iwarp_mpa.req"), "\n"); n != 1 {
		t.Errorf("%d MPA Request frames decoded, want 1", n)
	}
	if n := strings.Count(run("-Y", "iwarp_mpa.rep"), "\n"); n != 1 {
		t.Errorf("%d MPA Reply frames decoded, want 1", n)
	}
	verbose := run("-V")
	if crc {
		good, bad := strings.Count(verbose, "(Good CRC32)"), strings.Count(verbose, "Bad CRC32")
		if bad > 0 || good == 0 {
			t.Errorf("tshark checked %d CRCs good and %d bad", good, bad)
		}
	}
	if !strings.Contains(verbose, "Terminate") || !strings.Contains(verbose, "Atomic Request") {
		t.Errorf("the decoded capture names no Terminate or no Atomic Request")
	}
}

// recording is the byte streams of one TCP connection, in the order the
// proxy saw them.
type recording struct {
	mu     sync.Mutex
	chunks []chunk
}

type chunk struct {
	fromInitiator bool
	data          []byte
}

func (r *recording) add(fromInitiator bool, b []byte) {
	r.mu.Lock()
	r.chunks = append(r.chunks, chunk{fromInitiator, append([]byte(nil), b...)})
	r.mu.Unlock()
}

// recordSession runs a session between two QPs of this process through a
// recording proxy: Sends of every kind, Writes (one of several FPDUs),
// Reads, both atomics, immediate data, and last a Write with a bad STag,
// which the responder answers with a Terminate.
func recordSession(t *testing.T) *recording {
	rec := &recording{}
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, err := proxy.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", l.Addr()[len("tcp://"):])
		if err != nil {
			in.Close()
			return
		}
		var copies sync.WaitGroup
		pipe := func(dst, src net.Conn, fromInitiator bool) {
			defer copies.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					rec.add(fromInitiator, buf[:n])
					dst.Write(buf[:n])
				}
				if err != nil {
					dst.(*net.TCPConn).CloseWrite()
					return
				}
			}
		}
		copies.Add(2)
		go pipe(out, in, true)
		go pipe(in, out, false)
		copies.Wait()
		in.Close()
		out.Close()
	}()

	qpCap := verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, b := openEnd(t, 64, false, qpCap, 512<<10), openEnd(t, 64, false, qpCap, 512<<10)
	ca, cb := connectQPs(t, l, "tcp://"+proxy.Addr().String(), a.qp, b.qp, &cm.Param{PrivateData: []byte("capture")}, nil)

	const big = 200 << 10 // a Write of several FPDUs
	copy(a.mr.Bytes(), bytes.Repeat([]byte("goverbs!"), big/8))
	inv, err := b.pd.RegMR(b.mr.Bytes()[big+4096:big+8192], verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	b.recv(t, 6)
	steps := []verbs.SendWR{
		{Opcode: verbs.OpSend, SGList: []verbs.SGE{a.mr.SGE(0, 100)}},
		{Opcode: verbs.OpSend, Flags: verbs.SendSolicited, SGList: []verbs.SGE{a.mr.SGE(0, 40)}},
		{Opcode: verbs.OpSendWithInv, InvalidateRKey: inv.RKey(), SGList: []verbs.SGE{a.mr.SGE(0, 48)}},
		{Opcode: verbs.OpSendWithInv, Flags: verbs.SendSolicited, InvalidateRKey: inv.RKey()},
		{Opcode: verbs.OpSendWithImm, Imm: 0x1234, SGList: []verbs.SGE{a.mr.SGE(0, 16)}},
		{Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSolicited, Imm: 7, SGList: []verbs.SGE{a.mr.SGE(0, 64)},
			RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		{Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{a.mr.SGE(0, big)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		{Opcode: verbs.OpRDMARead, SGList: []verbs.SGE{a.mr.SGE(big, 5000)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		{Opcode: verbs.OpAtomicFetchAndAdd, SGList: []verbs.SGE{a.mr.SGE(big+8192, 8)}, RemoteAddr: b.mr.Addr() + 4096,
			RKey: b.mr.RKey(), CompareAdd: 1},
		{Opcode: verbs.OpAtomicCmpAndSwp, SGList: []verbs.SGE{a.mr.SGE(big+8192, 8)}, RemoteAddr: b.mr.Addr() + 4096,
			RKey: b.mr.RKey(), CompareAdd: 1, Swap: 2},
	}
	for i, wr := range steps {
		wr.WRID = uint64(i)
		wr.Flags |= verbs.SendSignaled
		if wr.Opcode == verbs.OpSendWithInv && i == 3 {
			// The first Send with Invalidate invalidated the region: give
			// the second a fresh one.
			r, err := b.pd.RegMR(b.mr.Bytes()[big+8192:big+12288], verbs.AccessLocalWrite|verbs.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			wr.InvalidateRKey = r.RKey()
		}
		if st := a.do(t, wr); st != verbs.WCSuccess {
			t.Fatalf("step %d (%v): %v", i, wr.Opcode, st)
		}
	}
	// A Write with a forged STag: the responder ends the stream with a
	// Terminate, and the Write completes with a remote access error.
	bad := verbs.SendWR{WRID: 99, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() ^ 0x00ff0000}
	if st := a.do(t, bad); st != verbs.WCRemAccessErr {
		t.Fatalf("Write with a forged STag completed with %v, want %v", st, verbs.WCRemAccessErr)
	}
	select {
	case <-ca.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not end after the Terminate")
	}
	ca.Close()
	cb.Close()
	return rec
}

// recv posts n receives of 4 KiB.
func (e *pairEnd) recv(t *testing.T, n int) {
	for i := range n {
		off := 300<<10 + i*4096
		if _, err := e.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(100 + i), SGList: []verbs.SGE{e.mr.SGE(off, 4096)}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// do posts wr and returns the status of its completion.
func (e *pairEnd) do(t *testing.T, wr verbs.SendWR) verbs.WCStatus {
	t.Helper()
	if _, err := e.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatalf("post %v: %v", wr.Opcode, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := e.cq.Wait(ctx, wc); err != nil {
		t.Fatalf("completion of %v: %v", wr.Opcode, err)
	}
	if wc[0].WRID != wr.WRID {
		t.Fatalf("completion of WR %d, want %d", wc[0].WRID, wr.WRID)
	}
	return wc[0].Status
}

// writePcap writes the recording as a pcap file of IPv4 packets: a TCP
// handshake, each chunk as one data segment answered by an ACK, and the
// closing FINs.
func (r *recording) writePcap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	var hdr [24]byte
	binary.LittleEndian.PutUint32(hdr[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(hdr[4:], 2)
	binary.LittleEndian.PutUint16(hdr[6:], 4)
	binary.LittleEndian.PutUint32(hdr[16:], 262144)
	binary.LittleEndian.PutUint32(hdr[20:], 228) // LINKTYPE_IPV4
	w.Write(hdr[:])
	p := &pcapTCP{w: w, ts: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), seq: [2]uint32{1000, 5000}}
	const syn, ack, fin, psh = 0x02, 0x10, 0x01, 0x08
	p.packet(0, syn, nil)
	p.seq[0]++
	p.packet(1, syn|ack, nil)
	p.seq[1]++
	p.packet(0, ack, nil)
	for _, c := range r.chunks {
		from := 1
		if c.fromInitiator {
			from = 0
		}
		for b := c.data; len(b) > 0; {
			n := min(len(b), 60000)
			p.packet(from, psh|ack, b[:n])
			p.seq[from] += uint32(n)
			p.packet(1-from, ack, nil)
			b = b[n:]
		}
	}
	p.packet(0, fin|ack, nil)
	p.seq[0]++
	p.packet(1, fin|ack, nil)
	p.seq[1]++
	p.packet(0, ack, nil)
	return w.Flush()
}

// pcapTCP writes the packets of one TCP connection between 10.0.0.1:40001
// (the initiator, side 0) and 10.0.0.2:7174 (side 1).
type pcapTCP struct {
	w   io.Writer
	ts  time.Time
	seq [2]uint32
	id  uint16
}

func (p *pcapTCP) packet(from int, flags byte, payload []byte) {
	var ip [20]byte
	var tcp [20]byte
	total := len(ip) + len(tcp) + len(payload)
	src, dst := [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}
	sport, dport := uint16(40001), uint16(7174)
	if from == 1 {
		src, dst, sport, dport = dst, src, dport, sport
	}
	p.id++
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(total))
	binary.BigEndian.PutUint16(ip[4:], p.id)
	ip[6] = 0x40 // don't fragment
	ip[8] = 64
	ip[9] = 6
	copy(ip[12:], src[:])
	copy(ip[16:], dst[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip[:]))
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	binary.BigEndian.PutUint32(tcp[4:], p.seq[from])
	if flags&0x10 != 0 {
		binary.BigEndian.PutUint32(tcp[8:], p.seq[1-from])
	}
	tcp[12] = 5 << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	var pseudo [12]byte
	copy(pseudo[0:], src[:])
	copy(pseudo[4:], dst[:])
	pseudo[9] = 6
	binary.BigEndian.PutUint16(pseudo[10:], uint16(len(tcp)+len(payload)))
	binary.BigEndian.PutUint16(tcp[16:], checksum(slices.Concat(pseudo[:], tcp[:], payload)))
	var rec [16]byte
	p.ts = p.ts.Add(10 * time.Microsecond)
	binary.LittleEndian.PutUint32(rec[0:], uint32(p.ts.Unix()))
	binary.LittleEndian.PutUint32(rec[4:], uint32(p.ts.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(rec[8:], uint32(total))
	binary.LittleEndian.PutUint32(rec[12:], uint32(total))
	p.w.Write(rec[:])
	p.w.Write(ip[:])
	p.w.Write(tcp[:])
	p.w.Write(payload)
}

// checksum is the Internet checksum of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

package rsock

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// hostile is a peer built on the verbs API that speaks rsock's
// connection setup and then sends whatever a test makes it.
type hostile struct {
	ctx    *verbs.Context
	pd     *verbs.PD
	cq     *verbs.CQ
	qp     *verbs.QP
	mr     *verbs.MR // its ring and source of its writes
	cmc    *cm.Conn
	victim hello // the victim's hello
}

// dialHostile connects a hostile peer to the rsock listener at addr.
func dialHostile(t *testing.T, addr string) *hostile {
	t.Helper()
	dev, err := cm.Device(addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostile{}
	if h.ctx, err = verbs.Open(dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	if h.pd, err = h.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if h.cq, err = h.ctx.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if h.qp, err = h.pd.CreateQP(verbs.QPInitAttr{SendCQ: h.cq, RecvCQ: h.cq,
		Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}}); err != nil {
		t.Fatal(err)
	}
	if err := h.qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteWrite},
		verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	if h.mr, err = h.pd.AllocMR(4*MaxRingSize/8, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		if _, err := h.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{h.mr.SGE(i*ctrlLen, ctrlLen)}}}); err != nil {
			t.Fatal(err)
		}
	}
	var b [helloLen]byte
	hl := putHello(b[:], h.mr.Addr(), h.mr.RKey(), MinRingSize, 63, flagAcceptsImm)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if h.cmc, err = cm.Dial(ctx, addr, h.qp, &cm.Param{PrivateData: hl}); err != nil {
		t.Fatal(err)
	}
	if h.victim, err = parseHello(h.cmc.PrivateData()); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *hostile) close() {
	if h.cmc != nil {
		h.cmc.Close()
	}
	if h.qp != nil {
		h.qp.Destroy()
	}
	if h.cq != nil {
		h.cq.Destroy()
	}
	if h.mr != nil {
		h.mr.Dereg()
	}
	if h.pd != nil {
		h.pd.Dealloc()
	}
	h.ctx.Close()
}

// write RDMA-Writes n bytes of its memory (filled with fill) to the
// victim's address addr with rkey, with immediate imm. It returns the
// hostile side's completion status.
func (h *hostile) write(t *testing.T, addr uint64, rkey uint32, n int, imm uint32) verbs.WCStatus {
	t.Helper()
	src := h.mr.Bytes()[4096 : 4096+n]
	for i := range src {
		src[i] = 'X'
	}
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: imm, RemoteAddr: addr, RKey: rkey}
	if n > 0 {
		wr.SGList = []verbs.SGE{h.mr.SGE(4096, n)}
	}
	if _, err := h.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return verbs.WCLocQPOpErr
	}
	return h.waitSend(t)
}

// send Sends b inline.
func (h *hostile) send(t *testing.T, b []byte) verbs.WCStatus {
	t.Helper()
	copy(h.mr.Bytes()[4096:], b)
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{h.mr.SGE(4096, len(b))}}
	if _, err := h.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return verbs.WCLocQPOpErr
	}
	return h.waitSend(t)
}

// waitSend returns the status of the next send completion, skipping
// receives.
func (h *hostile) waitSend(t *testing.T) verbs.WCStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	for {
		if _, err := h.cq.Wait(ctx, wc); err != nil {
			t.Fatalf("hostile peer's send: %v", err)
		}
		if wc[0].Opcode != verbs.WCRecv && wc[0].Opcode != verbs.WCRecvRDMAWithImm {
			return wc[0].Status
		}
	}
}

// attackSetup listens, connects a healthy pair and a hostile peer, and
// returns the victim (the hostile peer's accepted end) and the healthy
// pair, whose connection must survive the attack.
func attackSetup(t *testing.T, scheme string) (victim *Conn, h *hostile, healthy [2]*Conn, l net.Listener) {
	t.Helper()
	cfg := &Config{RingSize: MinRingSize}
	l, err := cfg.Listen(listenAddr(t, scheme))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	a, d, err := connectVia(l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); d.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	h = dialHostile(t, l.Addr().String())
	c := <-accepted
	if c == nil {
		t.Fatal("the hostile peer was not accepted")
	}
	victim = c.(*Conn)
	t.Cleanup(func() { victim.Close() })
	return victim, h, [2]*Conn{a, d}, l
}

// checkHealthy checks that the healthy pair still carries bytes both
// ways.
func checkHealthy(t *testing.T, p [2]*Conn) {
	t.Helper()
	for _, dir := range [][2]*Conn{{p[0], p[1]}, {p[1], p[0]}} {
		if _, err := dir[0].Write([]byte("still fine")); err != nil {
			t.Fatalf("healthy connection: %v", err)
		}
		buf := make([]byte, 10)
		dir[1].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(dir[1], buf); err != nil || string(buf) != "still fine" {
			t.Fatalf("healthy connection: %q, %v", buf, err)
		}
	}
}

// readUntilErr reads the victim until an error, with a deadline that
// fails the test rather than hang it, and returns the bytes and error.
func readUntilErr(t *testing.T, c *Conn) ([]byte, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var got []byte
	buf := make([]byte, 1024)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the victim's Read hung until its deadline")
			}
			return got, err
		}
	}
}

// TestAttackWritePastCredits: a peer that announces more bytes than the
// ring it was given holds is dropped with ErrProtocol after the bytes
// within its credits; no other connection notices.
func TestAttackWritePastCredits(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			victim, h, healthy, _ := attackSetup(t, scheme)
			size := int(h.victim.ringSize())
			if st := h.write(t, h.victim.ringAddr(), h.victim.ringKey(), size, makeCtrl(opData, 0, uint32(size))); st != verbs.WCSuccess {
				t.Fatalf("the write within the credits failed: %v", st)
			}
			// The ring is full and nothing was freed: one byte more is
			// past the credits.
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 1, makeCtrl(opData, 0, 1))
			got, err := readUntilErr(t, victim)
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("victim's Read: %v, want ErrProtocol", err)
			}
			if len(got) > size {
				t.Errorf("victim read %d bytes, more than the %d of the credits", len(got), size)
			}
			checkHealthy(t, healthy)
		})
	}
}

// TestAttackInlinePastCredits: a peer that fills the ring and then sends
// bytes inside a data message's Send is dropped with ErrProtocol after
// the bytes within its credits.
func TestAttackInlinePastCredits(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			victim, h, healthy, _ := attackSetup(t, scheme)
			size := int(h.victim.ringSize())
			if st := h.write(t, h.victim.ringAddr(), h.victim.ringKey(), size, makeCtrl(opData, 0, uint32(size))); st != verbs.WCSuccess {
				t.Fatalf("the write within the credits failed: %v", st)
			}
			h.send(t, append(ctrlBytes(makeCtrl(opData, 0, 8)), "past end"...))
			got, err := readUntilErr(t, victim)
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("victim's Read: %v, want ErrProtocol", err)
			}
			if len(got) > size || bytes.Contains(got, []byte("past end")) {
				t.Errorf("victim read %d bytes (the inline ones among them: %v), the credits were %d",
					len(got), bytes.Contains(got, []byte("past end")), size)
			}
			checkHealthy(t, healthy)
		})
	}
}

// ctrlBytes is control word w as the bytes of a Send.
func ctrlBytes(w uint32) []byte {
	var b [ctrlLen]byte
	ctrlWord(w, &b)
	return b[:]
}

// TestAttackForgedRingOffset: a peer that writes outside the ring it was
// given (past its end, before it, or with another connection's rkey)
// fails at its own side; the healthy connection's ring is untouched and
// the victim's connection ends with an error.
func TestAttackForgedRingOffset(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			victim, h, healthy, _ := attackSetup(t, scheme)
			other := healthy[0]
			before := bytes.Clone(other.ringBuf)
			ring, size := h.victim.ringAddr(), uint64(h.victim.ringSize())
			for _, target := range []struct {
				addr uint64
				rkey uint32
			}{
				{ring + size - 8, h.victim.ringKey()},  // straddles the end
				{ring - 64, h.victim.ringKey()},        // before the ring
				{other.ring.Addr(), other.ring.RKey()}, // another connection's ring
			} {
				if st := h.write(t, target.addr, target.rkey, 64, makeCtrl(opData, 0, 64)); st == verbs.WCSuccess {
					t.Errorf("a write of 64 bytes at %#x (ring %#x, %d bytes) succeeded", target.addr, ring, size)
				}
				if h.qp.State() == verbs.QPSErr {
					break // later writes flush
				}
			}
			if !bytes.Equal(before, other.ringBuf) {
				t.Error("the healthy connection's ring changed")
			}
			if _, err := readUntilErr(t, victim); err == nil || errors.Is(err, io.EOF) {
				t.Errorf("victim's Read after the attack: %v, want an error", err)
			}
			checkHealthy(t, healthy)
		})
	}
}

// TestAttackMalformedControl: control messages with a bad op, an empty
// data message, acks for receives the victim never posted, credits for
// bytes never sent, a Send of the wrong length, or inline data that its
// control message does not announce drop the connection
// with an error.
func TestAttackMalformedControl(t *testing.T) {
	cases := []struct {
		name string
		send func(t *testing.T, h *hostile)
	}{
		{"bad op", func(t *testing.T, h *hostile) {
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 0, makeCtrl(opBad, 0, 0))
		}},
		{"empty data", func(t *testing.T, h *hostile) {
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 0, makeCtrl(opData, 0, 0))
		}},
		{"fin with count", func(t *testing.T, h *hostile) {
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 0, makeCtrl(opFin, 0, 9))
		}},
		{"acks beyond receives", func(t *testing.T, h *hostile) {
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 0, makeCtrl(opCredit, maxAcks, 0))
		}},
		{"credit never sent", func(t *testing.T, h *hostile) {
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 0, makeCtrl(opCredit, 0, 1000))
		}},
		{"data after fin", func(t *testing.T, h *hostile) {
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 0, makeCtrl(opFin, 0, 0))
			h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 8, makeCtrl(opData, 0, 8))
		}},
		{"send of 3 bytes", func(t *testing.T, h *hostile) { h.send(t, []byte{0x40, 0, 1}) }},
		{"send of 64 bytes", func(t *testing.T, h *hostile) { h.send(t, make([]byte, 64)) }},
		{"inline data of another count", func(t *testing.T, h *hostile) {
			h.send(t, append(ctrlBytes(makeCtrl(opData, 0, 9)), "12345678"...))
		}},
		{"inline bytes behind a credit", func(t *testing.T, h *hostile) {
			h.send(t, append(ctrlBytes(makeCtrl(opCredit, 0, 0)), "12345678"...))
		}},
		{"send longer than a receive", func(t *testing.T, h *hostile) {
			h.send(t, append(ctrlBytes(makeCtrl(opData, 0, inlineMax+1)), make([]byte, inlineMax+1)...))
		}},
	}
	for _, scheme := range providers {
		for _, c := range cases {
			t.Run(scheme+"/"+c.name, func(t *testing.T) {
				victim, h, healthy, _ := attackSetup(t, scheme)
				c.send(t, h)
				// Read may end in io.EOF when the attack comes after an
				// end of stream; Write goes on until it sees the attack.
				if _, err := readUntilErr(t, victim); !errors.Is(err, ErrProtocol) && !errors.Is(err, io.EOF) {
					t.Errorf("victim's Read: %v, want ErrProtocol", err)
				}
				victim.SetWriteDeadline(time.Now().Add(20 * time.Second))
				for {
					_, err := victim.Write([]byte("x"))
					if err == nil {
						continue
					}
					if !errors.Is(err, ErrProtocol) {
						t.Errorf("victim's Write after the attack: %v, want ErrProtocol", err)
					}
					break
				}
				checkHealthy(t, healthy)
			})
		}
	}
}

// TestAttackPeerStopsReading: a peer that never reads nor frees the ring
// makes the victim's Write block until its deadline, then fail with
// os.ErrDeadlineExceeded; Close then returns at once.
func TestAttackPeerStopsReading(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			victim, _, healthy, _ := attackSetup(t, scheme)
			victim.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			n, err := victim.Write(make([]byte, 4*MinRingSize))
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("Write to a peer that does not read: %d bytes, %v", n, err)
			}
			if n > MinRingSize {
				t.Errorf("Write sent %d bytes into a %d-byte ring", n, MinRingSize)
			}
			if err := victim.Close(); err != nil {
				t.Error(err)
			}
			checkHealthy(t, healthy)
		})
	}
}

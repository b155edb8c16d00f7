package rlog

import (
	"bytes"
	"crypto/hmac"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 100, 4096} {
		payload := bytes.Repeat([]byte{0xa5}, n)
		b := make([]byte, frameLen(n)+16)
		size := putFrame(b, 9, 3, payload)
		f, got, err := parseFrame(b, n)
		if err != nil || got != size || size%frameAlign != 0 || f.seq() != 9 || f.epoch() != 3 || !bytes.Equal(f.payload(), payload) {
			t.Fatalf("%d bytes: %v %d %v", n, f, got, err)
		}
		if n > 0 {
			if _, _, err := parseFrame(b, n-1); err != errFrameLen {
				t.Fatalf("a record over the limit: %v", err)
			}
		}
		for i := range frameHeader + n {
			c := bytes.Clone(b)
			c[i] ^= 0x10
			if _, _, err := parseFrame(c, n); err == nil {
				t.Fatalf("%d bytes: a flipped bit at %d passed", n, i)
			}
		}
		if _, _, err := parseFrame(b[:size-1], n); err == nil && n > 0 {
			t.Fatalf("%d bytes: a cut frame passed", n)
		}
	}
	if _, _, err := parseFrame(make([]byte, 64), 64); err == nil {
		t.Fatal("zeros passed as a frame")
	}
}

func TestMessages(t *testing.T) {
	b := make([]byte, ctrlSize)
	hist := []epochStart{{1, 1}, {3, 40}}
	m, err := parseMsg(putHello(b, 5, 1, 50, 45, hist))
	if err != nil {
		t.Fatal(err)
	}
	if h, err := m.helloHistory(); err != nil || len(h) != 2 || h[1] != hist[1] || m.helloEpoch() != 5 || m.helloLast() != 50 {
		t.Fatalf("HELLO: %v %v", h, err)
	}
	if m, err := parseMsg(putStart(b, 33, 2, 50)); err != nil || m.startTruncate() != 33 || m.startGen() != 2 || m.startLast() != 50 {
		t.Fatalf("START: %v", err)
	}
	if m, err := parseMsg(putData(b, 4, 1, 4096, 3, 10, 12, 9, false)); err != nil || m.dataBuf() != 1 || m.dataFirst() != 10 || m.dataCount() != 3 {
		t.Fatalf("DATA: %v", err)
	}
	if _, err := parseMsg(putData(b, 4, 1, 4096, 3, 10, 13, 9, false)); err == nil {
		t.Fatal("DATA whose records do not add up passed")
	}
	if m, err := parseMsg(putStatus(b, 7, 99, true, 90, 3)); err != nil || !m.statusNack() || m.statusExpect() != 90 || m.statusReleased() != 7 {
		t.Fatalf("STATUS: %v", err)
	}
	if m, err := parseMsg(putError(b, codeStorage, "disk full")); err != nil || m.errCode() != codeStorage || m.errText() != "disk full" {
		t.Fatalf("ERROR: %v", err)
	}
	a := startAppend(b[:200], 77)
	var ok bool
	for _, r := range []string{"one", "", "three"} {
		if a, ok = addAppend(b[:200], a, []byte(r)); !ok {
			t.Fatal("addAppend")
		}
	}
	if _, ok := addAppend(b[:200], a, make([]byte, 200)); ok {
		t.Fatal("an APPEND grew past its buffer")
	}
	m, err = parseMsg(a)
	var got []string
	if err != nil || m.appendRecords(10, func(r []byte) { got = append(got, string(r)) }) != codeOK || len(got) != 3 || got[2] != "three" {
		t.Fatalf("APPEND: %v %q", err, got)
	}
	if m.appendRecords(4, nil) != codeTooLarge {
		t.Fatal("a record over the limit passed")
	}
	if m, err := parseMsg(putReply(b, 77, 10, 3, codeOK, "")); err != nil || m.replyFirst() != 10 || m.replyCount() != 3 {
		t.Fatalf("REPLY: %v", err)
	}
	c := newConnMsg(kindFetch)
	c.setRing(ringInfo{addr: 0x1000, rkey: 9, buffers: 2, bufSize: 4096})
	c.setEpoch(3)
	if !c.valid() || c.ring().rkey != 9 || c.ring().buffers != 2 || c.epoch() != 3 {
		t.Fatal("connMsg round trip")
	}
}

// FuzzFrame feeds parseFrame arbitrary bytes: it never panics, and what
// it accepts is a frame that lays out again byte for byte.
func FuzzFrame(f *testing.F) {
	b := make([]byte, 64)
	putFrame(b, 1, 1, []byte("hello"))
	f.Add(b)
	f.Add(make([]byte, 24))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, size, err := parseFrame(b, 1<<20)
		if err != nil {
			return
		}
		if size > len(b) || size != frameLen(fr.length()) || fr.crc() != fr.sum() {
			t.Fatalf("accepted a frame of %d bytes in %d: %v", size, len(b), fr)
		}
		again := make([]byte, size)
		putFrame(again, fr.seq(), fr.epoch(), fr.payload())
		if !bytes.Equal(again[:frameHeader+fr.length()], b[:frameHeader+fr.length()]) {
			t.Fatalf("frame %v does not lay out again the same", fr)
		}
	})
}

// FuzzMessage feeds the control and client message decoders arbitrary
// bytes: they never panic, and every accessor of an accepted message
// stays within it.
func FuzzMessage(f *testing.F) {
	b := make([]byte, ctrlSize)
	f.Add(bytes.Clone(putHello(b, 5, 1, 50, 45, []epochStart{{1, 1}, {3, 40}})))
	f.Add(bytes.Clone(putStart(b, 33, 2, 50)))
	f.Add(bytes.Clone(putData(b, 4, 1, 4096, 3, 10, 12, 9, false)))
	f.Add(bytes.Clone(putStatus(b, 7, 99, true, 90, 3)))
	f.Add(bytes.Clone(putError(b, codeStorage, "disk full")))
	a, _ := addAppend(b, startAppend(b, 1), []byte("rec"))
	f.Add(bytes.Clone(a))
	f.Add(bytes.Clone(putReply(b, 77, 10, 3, codeOK, "")))
	f.Add(bytes.Clone(putAuth(b, make([]byte, macLen), 1<<40, 7)))
	f.Add(bytes.Clone(putAnswer(b, newConnMsg(kindFence), make([]byte, macLen))))
	f.Add(make([]byte, connMsgLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := connMsg(b)
		if c.valid() {
			_ = c.ring()
			_, _, _, _ = c.epoch(), c.member(), c.cluster(), c.b()
			_, _, _ = c.nonce(), c.index(), c.mode()
			if len(c.acceptNonce()) != nonceLen || len(c.acceptMAC()) != macLen {
				t.Fatalf("accept reply of %d bytes gives a nonce of %d and a MAC of %d", len(c), len(c.acceptNonce()), len(c.acceptMAC()))
			}
		}
		m, err := parseMsg(b)
		if err != nil {
			return
		}
		switch m.typ() {
		case msgHello:
			if h, err := m.helloHistory(); err == nil {
				for i := 1; i < len(h); i++ {
					if h[i].epoch <= h[i-1].epoch || h[i].first <= h[i-1].first {
						t.Fatalf("history accepted out of order: %v", h)
					}
				}
			}
		case msgStart:
			_, _, _ = m.startTruncate(), m.startGen(), m.startLast()
		case msgData:
			if m.dataLast()-m.dataFirst()+1 != uint64(m.dataCount()) || m.dataFirst() == 0 {
				t.Fatalf("DATA accepted with records %d..%d as %d", m.dataFirst(), m.dataLast(), m.dataCount())
			}
			if len(m) != dataLen && len(m) != dataLen+m.dataBytes() {
				t.Fatalf("DATA accepted with %d bytes for %d", len(m), m.dataBytes())
			}
		case msgStatus:
			_, _, _, _ = m.statusReleased(), m.statusDurable(), m.statusExpect(), m.statusNackGen()
		case msgError:
			_ = m.errText()
		case msgAppend:
			total := 0
			if m.appendRecords(1<<20, func(r []byte) { total += len(r) }) == codeOK && total > len(m) {
				t.Fatalf("APPEND yields %d bytes of records from %d", total, len(m))
			}
		case msgReply:
			_ = m.replyText()
		case msgAuth:
			if len(m.authMAC()) != macLen || len(m.authGrant()) != authLen-40 {
				t.Fatalf("AUTH of %d bytes accepted", len(m))
			}
			_, _ = m.authRing()
			if hmac.Equal(m.authMAC(), authMAC(testSecret, labelDialer, newConnMsg(kindFence), make([]byte, nonceLen), 0, m.authGrant())) {
				t.Fatal("arbitrary bytes proved membership")
			}
		case msgAnswer:
			if len(m.answer()) != connMsgLen || len(m.answerMAC()) != macLen {
				t.Fatalf("ANSWER of %d bytes accepted", len(m))
			}
			_ = m.answer().valid()
		}
	})
}

package rsock

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseHello checks that any private data either parses into a hello
// whose fields are within the limits, or fails with errHello, and that a
// parsed hello re-encodes to the same bytes.
func FuzzParseHello(f *testing.F) {
	var b [helloLen]byte
	f.Add([]byte(putHello(b[:], 0x1000, 7, DefaultRingSize, ctrlRecvs, flagAcceptsImm)))
	f.Add([]byte(putHello(b[:], 0, 0, MinRingSize, 2, 0)))
	f.Add([]byte("RSK1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := parseHello(data)
		if err != nil {
			if !errors.Is(err, errHello) {
				t.Fatalf("error %v does not wrap errHello", err)
			}
			return
		}
		if s := h.ringSize(); s < MinRingSize || s > MaxRingSize {
			t.Fatalf("accepted ring size %d", s)
		}
		if r := h.recvs(); r < 2 || r > maxAcks {
			t.Fatalf("accepted %d receives", r)
		}
		var out [helloLen]byte
		if re := putHello(out[:], h.ringAddr(), h.ringKey(), h.ringSize(), h.recvs(), h.flags()); !bytes.Equal(re, data[:helloLen]) {
			t.Fatalf("re-encoded %x, parsed from %x", re, data[:helloLen])
		}
	})
}

// FuzzParseCtrl checks that any 4 bytes either parse into a control
// message with a known op and a count that fits it, or fail with errCtrl,
// and that makeCtrl gives back the same word.
func FuzzParseCtrl(f *testing.F) {
	var b [ctrlLen]byte
	f.Add(ctrlWord(makeCtrl(opData, 5, 64), &b).word())
	f.Add(ctrlWord(makeCtrl(opCredit, 0, 0), &b).word())
	f.Add(ctrlWord(makeCtrl(opFin, maxAcks, 0), &b).word())
	f.Add(uint32(0xffffffff))
	f.Fuzz(func(t *testing.T, w uint32) {
		var b [ctrlLen]byte
		m, err := parseCtrl(ctrlWord(w, &b))
		if err != nil {
			if !errors.Is(err, errCtrl) {
				t.Fatalf("error %v does not wrap errCtrl", err)
			}
			return
		}
		switch m.op() {
		case opData:
			if m.count() == 0 {
				t.Fatal("accepted an empty data message")
			}
		case opFin:
			if m.count() != 0 {
				t.Fatal("accepted an end of stream with a count")
			}
		case opCredit:
		default:
			t.Fatalf("accepted op %d", m.op())
		}
		if m.acks() > maxAcks || m.count() > maxCount {
			t.Fatalf("fields out of range: %d acks, count %d", m.acks(), m.count())
		}
		if got := makeCtrl(m.op(), m.acks(), m.count()); got != w {
			t.Fatalf("makeCtrl gives %#x for %#x", got, w)
		}
	})
}

// TestParseCtrlRejectsWrongLength checks the Send path's length check.
func TestParseCtrlRejectsWrongLength(t *testing.T) {
	for _, n := range []int{0, 1, 3, 5, 64} {
		if _, err := parseCtrl(make([]byte, n)); !errors.Is(err, errCtrl) {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
}

// FuzzParseSend checks that any Send payload either parses into a
// control message, with inline data only where the receiver takes it,
// only behind a data message that announces exactly its length, and at
// most inlineMax bytes, or fails with errCtrl.
func FuzzParseSend(f *testing.F) {
	f.Add(ctrlBytes(makeCtrl(opCredit, 3, 100)), false)
	f.Add(append(ctrlBytes(makeCtrl(opData, 1, 5)), "hello"...), true)
	f.Add(append(ctrlBytes(makeCtrl(opData, 0, inlineMax)), make([]byte, inlineMax)...), true)
	f.Add(append(ctrlBytes(makeCtrl(opData, 0, inlineMax+1)), make([]byte, inlineMax+1)...), true)
	f.Add(append(ctrlBytes(makeCtrl(opFin, 0, 0)), 'x'), true)
	f.Add([]byte{0x40, 0, 1}, true)
	f.Fuzz(func(t *testing.T, b []byte, inline bool) {
		var word [ctrlLen]byte
		m, data, err := parseSend(b, inline, &word)
		if err != nil {
			if !errors.Is(err, errCtrl) {
				t.Fatalf("error %v does not wrap errCtrl", err)
			}
			return
		}
		if len(m) != ctrlLen || !bytes.Equal(m, b[:ctrlLen]) || &m[0] != &word[0] {
			t.Fatalf("control message %x from %x, not a copy in word", m, b)
		}
		if len(data) == 0 {
			if len(b) != ctrlLen {
				t.Fatalf("a Send of %d bytes parsed as a control message alone", len(b))
			}
			return
		}
		switch {
		case !inline:
			t.Fatalf("inline data taken by a receiver that does not take it: %x", b)
		case m.op() != opData || int(m.count()) != len(data):
			t.Fatalf("%d inline bytes behind op %d, count %d", len(data), m.op(), m.count())
		case len(data) > inlineMax:
			t.Fatalf("%d inline bytes, more than %d", len(data), inlineMax)
		case !bytes.Equal(data, b[ctrlLen:]):
			t.Fatalf("inline data %x from %x", data, b)
		}
	})
}

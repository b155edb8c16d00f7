package perftest

import (
	"errors"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	// The post list is the client's alone: the server gets 1.
	p := Params{Test: WriteBW, Size: 1 << 20, Iters: 5000, Warmup: 500, TxDepth: 128, RxDepth: 512, CQMod: 100, Inline: 220, PostList: 1, Event: true}
	rb := remoteBuf{addr: 0x7f0012345678, rkey: 0xabcdef}
	r := encodeRequest(p, rb, true)
	if len(r) > 56 {
		t.Errorf("a request is %d bytes; every provider carries only 56 of private data", len(r))
	}
	gp, grb, credits, err := decodeRequest(r)
	if err != nil || gp != p || grb != rb || !credits {
		t.Fatalf("decode(encode) = %+v %+v %v %v, want %+v %+v true", gp, grb, credits, err, p, rb)
	}
	if _, _, credits, _ := decodeRequest(encodeRequest(p, rb, false)); credits {
		t.Error("credits asked for without the flag")
	}
	r[0] ^= 1
	if _, _, _, err := decodeRequest(r); !errors.Is(err, errNotBench) {
		t.Errorf("bad magic: %v", err)
	}
	if _, _, _, err := decodeRequest(r[:10]); !errors.Is(err, errNotBench) {
		t.Errorf("short request: %v", err)
	}
}

func TestReplyAndCtrl(t *testing.T) {
	rb := remoteBuf{addr: 1 << 40, rkey: 7}
	if got, err := decodeReply(encodeReply(rb)); err != nil || got != rb {
		t.Errorf("reply round trip: %+v %v", got, err)
	}
	if _, err := decodeReply([]byte("hello")); err == nil {
		t.Error("a short reply decoded")
	}
	b := make([]byte, ctrlLen)
	m := ctrlMsg{cpu: -1, pid: 4242}
	encodeCtrl(b, ctrlReport, m)
	if got, err := decodeCtrl(b, ctrlReport); err != nil || got != m {
		t.Errorf("ctrl round trip: %+v %v", got, err)
	}
	if _, err := decodeCtrl(b, ctrlDone); err == nil {
		t.Error("a report decoded as a done message")
	}
}

// FuzzWire: the bench protocol's decoders (the server's of a client's
// request, the client's of the server's reply and of control messages)
// never panic, and what they accept re-encodes to the same fields; a
// request the server's Check accepts describes a run it can set up.
func FuzzWire(f *testing.F) {
	p := DefaultParams(WriteBW, 4096, attr)
	f.Add([]byte(encodeRequest(p, remoteBuf{addr: 1 << 40, rkey: 7}, true)), byte(ctrlDone))
	f.Add(encodeReply(remoteBuf{addr: 4096, rkey: 1}), byte(ctrlReport))
	b := make([]byte, ctrlLen)
	encodeCtrl(b, ctrlReport, ctrlMsg{cpu: 5, pid: 9})
	f.Add(b, byte(ctrlReport))
	f.Fuzz(func(t *testing.T, data []byte, kind byte) {
		if p, rb, credits, err := decodeRequest(data); err == nil {
			q, grb, gcredits, err := decodeRequest(encodeRequest(p, rb, credits))
			if err != nil || q != p || grb != rb || gcredits != credits {
				t.Fatalf("request %+v re-decodes as %+v, %v", p, q, err)
			}
			if p.Check("fuzz", attr) == nil {
				if p.Size < 1 || p.Iters < 1 || p.TxDepth < 1 || p.RxDepth < 1 || p.cqMod() < 1 ||
					uint64(p.regionLen()) > attr.MaxMRSize || p.total() < p.Iters {
					t.Fatalf("Check accepted %+v", p)
				}
			}
		}
		if rb, err := decodeReply(data); err == nil {
			if got, err := decodeReply(encodeReply(rb)); err != nil || got != rb {
				t.Fatalf("reply %+v re-decodes as %+v, %v", rb, got, err)
			}
		}
		if m, err := decodeCtrl(data, kind); err == nil {
			out := make([]byte, ctrlLen)
			encodeCtrl(out, kind, m)
			if got, err := decodeCtrl(out, kind); err != nil || got != m {
				t.Fatalf("control message %+v re-decodes as %+v, %v", m, got, err)
			}
		}
	})
}

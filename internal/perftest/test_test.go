package perftest

import (
	"errors"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// attr is a device like shm0.
var attr = verbs.DeviceAttr{Transport: "shm", MaxMRSize: 1 << 36, MaxQPWR: 1 << 14, MaxCQE: 1 << 20,
	MaxInlineData: 1024, MaxMsgSize: 1 << 31, MaxPrivateData: 56, Caps: verbs.CapAtomics}

func TestParseTest(t *testing.T) {
	for _, tt := range Tests {
		got, err := ParseTest(tt.String())
		if err != nil || got != tt {
			t.Errorf("ParseTest(%q) = %v, %v", tt, got, err)
		}
	}
	_, err := ParseTest("write_latency")
	if err == nil || !strings.Contains(err.Error(), "send_lat, write_lat") {
		t.Errorf("an unknown test: %v, want the list of tests", err)
	}
}

func TestDefaultParams(t *testing.T) {
	p := DefaultParams(WriteLat, 2, attr)
	want := Params{Test: WriteLat, Size: 2, Iters: 1000, Warmup: 100, TxDepth: 1, RxDepth: 512, CQMod: 100, Inline: 220, PostList: 1}
	if p != want {
		t.Errorf("write_lat defaults %+v, want perftest's %+v", p, want)
	}
	p = DefaultParams(SendBW, 65536, verbs.DeviceAttr{MaxInlineData: 64})
	if p.Iters != 5000 || p.TxDepth != 128 || p.Inline != 64 {
		t.Errorf("send_bw defaults %+v: want 5000 iterations, window 128, inline capped to the device's 64", p)
	}
	if p := DefaultParams(AtomicBW, 4096, attr); p.Size != 8 || p.Inline != 0 {
		t.Errorf("atomics are 8 bytes and never inline: %+v", p)
	}
}

func TestOverrides(t *testing.T) {
	o := NoOverrides
	o.Iters, o.TxDepth, o.Inline, o.Event = 200, 16, 0, true
	p := o.Params(SendBW, 64, attr)
	if p.Iters != 200 || p.Warmup != 20 || p.TxDepth != 16 || p.Inline != 0 || !p.Event || p.RxDepth != 512 {
		t.Errorf("overridden send_bw: %+v", p)
	}
	if p := o.Params(ReadLat, 8, attr); p.TxDepth != 1 {
		t.Errorf("the window is for bandwidth tests; read_lat got %d", p.TxDepth)
	}
	o.Warmup = 0
	if p := o.Params(ReadLat, 8, attr); p.Warmup != 0 {
		t.Errorf("--warmup 0 is no warm-up, got %d", p.Warmup)
	}
	s := Suite{Tests: []Test{ReadLat, AtomicBW}, Sizes: []int{8, 4096}, Overrides: NoOverrides}
	ps := s.Params(attr)
	if len(ps) != 3 || ps[2].Test != AtomicBW || ps[2].Size != 8 {
		t.Errorf("suite runs %+v: want read_lat at two sizes, atomic_bw at 8 bytes", ps)
	}
}

func TestCheck(t *testing.T) {
	noAtomics := attr
	noAtomics.Caps = 0
	ok := DefaultParams(WriteBW, 4096, attr)
	if err := ok.Check("shm0", attr); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	tests := []struct {
		name string
		p    func(p *Params)
		attr verbs.DeviceAttr
		want string
	}{
		{"atomics missing", func(p *Params) { *p = DefaultParams(AtomicLat, 8, attr) }, noAtomics, "has no RDMA atomics"},
		{"size beyond the device", func(p *Params) { p.Size = 1 << 32 }, attr, "max_msg_sz"},
		{"size zero", func(p *Params) { p.Size = 0 }, attr, "at least 1 byte"},
		{"atomic size", func(p *Params) { *p = DefaultParams(AtomicBW, 8, attr); p.Size = 16 }, attr, "leave -s out"},
		{"write_lat with events", func(p *Params) { *p = DefaultParams(WriteLat, 8, attr); p.Event = true }, attr, "without --event"},
		{"inline beyond the device", func(p *Params) { p.Inline = 4096 }, attr, "inline"},
		{"latency with 4 iterations", func(p *Params) { *p = DefaultParams(ReadLat, 8, attr); p.Iters = 4 }, attr, "at least 5"},
		{"window beyond the device", func(p *Params) { p.TxDepth = 1 << 15 }, attr, "tx depth"},
		{"cq-mod zero", func(p *Params) { p.CQMod = 0 }, attr, "cq-mod"},
	}
	for _, tt := range tests {
		p := ok
		tt.p(&p)
		err := p.Check("shm0", tt.attr)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ErrUnsupported saying %q", tt.name, err, tt.want)
		}
	}
}

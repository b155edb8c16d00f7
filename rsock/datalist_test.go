package rsock

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// planData plans a window's data messages for one post: chunks of at
// most maxChunk that follow each other around the peer's ring, within
// the free window and the bytes left, each leaving a credit for a credit
// message and fitting in the send queue, at most maxList of them.
func TestDataMessagesOfAWindowArePlannedAsOneList(t *testing.T) {
	const ring = 64 << 10
	const step = ring / 4
	cases := []struct {
		name                 string
		sent, freed          uint64
		rest, credits, sends int
		useImm               bool
		maxList              int
		want                 []chunk
	}{
		{name: "whole ring", rest: 1 << 20, credits: 8, useImm: true, maxList: listMax,
			want: []chunk{{0, step}, {step, step}, {2 * step, step}, {3 * step, step}}},
		{name: "bytes left", rest: step + 10, credits: 8, useImm: true, maxList: listMax,
			want: []chunk{{0, step}, {step, 10}}},
		{name: "window", sent: 3 * step, freed: step, rest: 1 << 20, credits: 8, useImm: true, maxList: listMax,
			want: []chunk{{3 * step, step}, {0, step}}},
		{name: "wrap", sent: ring + step/2, freed: ring, rest: 1 << 20, credits: 8, useImm: true, maxList: listMax,
			want: []chunk{{step / 2, step}, {3 * step / 2, step}, {5 * step / 2, step}, {7 * step / 2, step / 2}}},
		{name: "credits", rest: 1 << 20, credits: 3, useImm: true, maxList: listMax,
			want: []chunk{{0, step}, {step, step}}},
		{name: "no credit to spare", rest: 1 << 20, credits: 1, useImm: true, maxList: listMax},
		{name: "send queue, Sends", rest: 1 << 20, credits: 8, sends: 2*signalEvery + 8 - 5, maxList: listMax,
			want: []chunk{{0, step}, {step, step}}},
		{name: "send queue, immediates", rest: 1 << 20, credits: 8, sends: 2*signalEvery + 8 - 4, useImm: true, maxList: listMax,
			want: []chunk{{0, step}, {step, step}, {2 * step, step}}},
		{name: "list", rest: 1 << 20, credits: 8, maxList: 2,
			want: []chunk{{0, step}, {step, step}}},
		{name: "ring full", sent: ring, rest: 1 << 20, credits: 8, useImm: true, maxList: listMax},
	}
	if maxChunk(ring) != step {
		t.Fatalf("maxChunk(%d) = %d, not %d", ring, maxChunk(ring), step)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &Conn{peerSize: ring, txSent: tc.sent, txFreed: tc.freed, credits: tc.credits, sendsOut: tc.sends,
				sqDepth: 2*signalEvery + 8, useImm: tc.useImm, maxList: tc.maxList}
			k := c.planData(tc.rest)
			if got := c.plan[:k]; !equalChunks(got, tc.want) {
				t.Errorf("planned %v, want %v", got, tc.want)
			}
		})
	}
}

// On a device that frames bytes in segments (iWARP's FPDUs), a data
// message is a whole number of them where it can be, so that a receiver
// reads no frame of a message's last few bytes: only the message that
// ends at the ring's end is shorter.
func TestDataMessagesAreWholeSegments(t *testing.T) {
	const seg = iwarpSegment
	cases := []struct {
		ring uint64
		want []chunk
	}{
		{256 << 10, []chunk{{0, seg}, {seg, seg}, {2 * seg, seg}, {3 * seg, seg}, {4 * seg, 256<<10 - 4*seg}}},
		{1 << 20, []chunk{{0, 4 * seg}, {4 * seg, 4 * seg}, {8 * seg, 4 * seg}, {12 * seg, 4 * seg}, {16 * seg, 1<<20 - 16*seg}}},
		{64 << 10, []chunk{{0, 16 << 10}, {16 << 10, 16 << 10}, {32 << 10, 16 << 10}, {48 << 10, 16 << 10}}},
	}
	for _, tc := range cases {
		c := &Conn{peerSize: tc.ring, credits: 16, sqDepth: 2*signalEvery + 8, maxList: listMax, segment: seg}
		k := c.planData(1 << 30)
		if got := c.plan[:k]; !equalChunks(got, tc.want) {
			t.Errorf("ring of %d: planned %v, want %v", tc.ring, got, tc.want)
		}
	}
}

func equalChunks(a, b []chunk) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Writes whose windows go out as lists of data messages, copied and
// zero-copy, with the data messages as RDMA Writes with immediate or
// RDMA Writes and Sends (whose control words share the send buffer),
// deliver the stream whole and in order across many wraps of a small
// ring.
func TestWindowListsDeliverTheStreamInOrder(t *testing.T) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{
			{"copy", Config{RingSize: MinRingSize, ZeroCopyMin: -1}},
			{"zerocopy", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize}},
			{"copy-send", Config{RingSize: MinRingSize, ZeroCopyMin: -1, noImm: true}},
			{"zerocopy-send", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize, noImm: true}},
		} {
			t.Run(scheme+"/"+mode.name, func(t *testing.T) {
				d, a := pair(t, scheme, &mode.cfg)
				defer d.Close()
				defer a.Close()
				// A stream the lists garble stalls: it fails at the deadline.
				dl := time.Now().Add(time.Minute)
				d.SetDeadline(dl)
				a.SetDeadline(dl)
				want := make([]byte, 300*MinRingSize+123)
				for i := range want {
					want[i] = byte(i*7 + i>>12)
				}
				errc := make(chan error, 1)
				go func() {
					// Writes of several windows, of one, and of less.
					for at, i := 0, 0; at < len(want); i++ {
						n := min(len(want)-at, []int{5 * MinRingSize, MinRingSize + 1, 700}[i%3])
						if _, err := d.Write(want[at : at+n]); err != nil {
							errc <- err
							return
						}
						at += n
					}
					errc <- d.CloseWrite()
				}()
				expectStream(t, a, errc, want)
			})
		}
	}
}

// expectStream reads a to its end, takes the writer's result from errc,
// and checks that both succeeded and that the bytes read are want.
func expectStream(t *testing.T, a io.Reader, errc <-chan error, want []byte) {
	t.Helper()
	got, err := io.ReadAll(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes that differ from the %d written", len(got), len(want))
	}
}

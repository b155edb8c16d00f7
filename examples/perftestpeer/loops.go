package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/verbs"
)

// The test loops busy-poll, as perftest's do, and every pollCheck polls
// see whether the run is over (ctx) or the peer gone.
const pollCheck = 1 << 12

// errPeerGone: the test's connection ended during the test.
var errPeerGone = errors.New("the peer disconnected")

// alive returns an error once ctx is done or the test's connection has
// ended.
func (s *session) alive(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-s.data.conn.Done():
		return errPeerGone
	default:
		return nil
	}
}

// poll waits for one completion of cq in wc[0] and checks that it is a
// successful completion of op.
func (s *session) poll(ctx context.Context, cq *verbs.CQ, wc []verbs.WorkCompletion, op verbs.WCOpcode) error {
	for spins := 1; cq.Poll(wc[:1]) == 0; spins++ {
		if spins%pollCheck == 0 {
			if err := s.alive(ctx); err != nil {
				return err
			}
		}
	}
	return checkWC(&wc[0], op)
}

// sendLat is ib_send_lat's loop: the client sends first, and each side
// sends its next message once the peer's has arrived.
func (s *session) sendLat(ctx context.Context) error {
	d, n, size := s.data, s.cfg.iters, s.cfg.size
	swr := []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{s.mr.SGE(0, size)}}}
	scnt, rcnt := 0, 0
	for scnt < n || rcnt < n {
		if rcnt < n && !(s.client && scnt == 0) {
			if err := s.poll(ctx, d.rcq, d.wc, verbs.WCRecv); err != nil {
				return fmt.Errorf("message %d of %d: %w", rcnt+1, n, err)
			}
			if got := d.wc[0].ByteLen; got != uint32(size) {
				return fmt.Errorf("message %d of %d has %d bytes, want %d", rcnt+1, n, got, size)
			}
			rcnt++
			if d.posted < n {
				if err := d.postRecv(); err != nil {
					return err
				}
			}
		}
		if scnt < n {
			swr[0].WRID = uint64(scnt)
			if _, err := d.ep.QP().PostSend(swr); err != nil {
				return fmt.Errorf("post send %d: %w", scnt+1, err)
			}
			if err := s.poll(ctx, d.scq, d.wc, verbs.WCSend); err != nil {
				return fmt.Errorf("send %d of %d: %w", scnt+1, n, err)
			}
			scnt++
		}
	}
	return nil
}

// writeLat is ib_write_lat's loop: the server writes first; each side
// writes its next message, whose last byte is its number, once the last
// byte of its own area has changed to the peer's next number.
func (s *session) writeLat(ctx context.Context) error {
	d, n, size := s.data, s.cfg.iters, s.cfg.size
	src := s.mr.Bytes()[:size]
	word, shift, err := s.lastByte()
	if err != nil {
		return err
	}
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, SGList: []verbs.SGE{s.mr.SGE(0, size)},
		RemoteAddr: s.peer.vaddr, RKey: s.peer.rkey}}
	scnt, rcnt := 0, 0
	for scnt < n || rcnt < n {
		if rcnt < n && !(!s.client && scnt == 0) {
			got, err := s.change(ctx, word, shift, byte(rcnt))
			if err != nil {
				return fmt.Errorf("waiting for Write %d of %d: %w", rcnt+1, n, err)
			}
			rcnt++
			if got != byte(rcnt) {
				return fmt.Errorf("Write %d of %d ends in %d, want %d", rcnt, n, got, byte(rcnt))
			}
		}
		if scnt < n {
			scnt++
			src[size-1] = byte(scnt)
			wr[0].WRID = uint64(scnt)
			if _, err := d.ep.QP().PostSend(wr); err != nil {
				return fmt.Errorf("post RDMA Write %d: %w", scnt, err)
			}
			if err := s.poll(ctx, d.scq, d.wc, verbs.WCRDMAWrite); err != nil {
				return fmt.Errorf("RDMA Write %d of %d: %w", scnt, n, err)
			}
		}
	}
	return nil
}

// lastByte is the last byte of this side's area, where the peer's Writes
// end, as the aligned 32-bit word that holds it (loaded atomically while
// the device writes it) and the byte's shift in it.
func (s *session) lastByte() (*uint32, uint, error) {
	off := s.area() + s.cfg.size - 1
	p := unsafe.Pointer(&s.mr.Bytes()[off&^3])
	if uintptr(p)%4 != 0 {
		return nil, 0, errors.New("the region is not 4-byte aligned")
	}
	var probe [4]byte
	binary.NativeEndian.PutUint32(probe[:], 1)
	shift := uint(off&3) * 8
	if probe[0] != 1 {
		shift = 24 - shift
	}
	return (*uint32)(p), shift, nil
}

// Once a wait for memory has taken progressAfter loads, it polls the send
// CQ for no completion every progressEvery loads: a provider that moves
// data in software (tcp0) then places the peer's Write in this goroutine.
const (
	progressAfter = 1 << 10
	progressEvery = 1 << 6
)

// change waits until the byte at word>>shift differs from old and
// returns it.
func (s *session) change(ctx context.Context, word *uint32, shift uint, old byte) (byte, error) {
	for spins := 1; ; spins++ {
		if b := byte(atomic.LoadUint32(word) >> shift); b != old {
			return b, nil
		}
		if spins >= progressAfter && spins%progressEvery == 0 {
			s.data.scq.Poll(nil)
		}
		if spins%pollCheck == 0 {
			if err := s.alive(ctx); err != nil {
				return 0, err
			}
		}
	}
}

// readLat is ib_read_lat's loop, the client's alone: read the server's
// area, wait for the Read's completion, again.
func (s *session) readLat(ctx context.Context) error {
	d, n, size := s.data, s.cfg.iters, s.cfg.size
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled, SGList: []verbs.SGE{s.mr.SGE(0, size)},
		RemoteAddr: s.peer.vaddr, RKey: s.peer.rkey}}
	for i := range n {
		wr[0].WRID = uint64(i)
		if _, err := d.ep.QP().PostSend(wr); err != nil {
			return fmt.Errorf("post RDMA Read %d: %w", i+1, err)
		}
		if err := s.poll(ctx, d.scq, d.wc, verbs.WCRDMARead); err != nil {
			return fmt.Errorf("RDMA Read %d of %d: %w", i+1, n, err)
		}
	}
	return nil
}

package perftest

import (
	"fmt"
	"sync/atomic"

	"github.com/goverbs/goverbs/verbs"
)

// The measured loops, after perftest's run_iter_lat_send,
// run_iter_lat_write, run_iter_lat and run_iter_bw. The client records
// the time of each post in posted (in bandwidth tests, of the first post
// of each signaled group, and of each signaled completion in completed);
// the server passes nil. Each side
// marks its CPU time when the warm-up ends and when the loop does. The
// loops allocate nothing.

// sendLat is the Send ping-pong; both sides run it. The client sends
// first; each side then waits for the peer's message before sending the
// next. The receives were pre-posted; each side keeps posting until it
// has posted one per message.
func (e *endpoint) sendLat(client bool, posted []int64, preposted int) error {
	p := e.p
	total, cqMod := p.total(), p.cqMod()
	swr := e.swr
	base := e.baseFlags()
	rwc, swc := e.wc[:1], e.wc[1:2]
	scnt, rcnt := 0, 0
	for scnt < total || rcnt < total {
		if rcnt < total && !(client && scnt < 1) {
			if _, err := e.waitCQ(e.rcq, rwc, p.Event); err != nil {
				return err
			}
			if err := check(&rwc[0], verbs.WCRecv); err != nil {
				return err
			}
			if e.isCtrl(&rwc[0]) {
				return fmt.Errorf("the peer ended the run after %d of %d messages", rcnt, total)
			}
			rcnt++
			switch {
			case preposted >= total:
			case !e.ctrlAfterData || preposted+1 < total:
				// One receive, posted here rather than through
				// postRecvs: the loop pays no call of its own.
				if _, err := e.qp.PostRecv(e.rwrs[:1]); err != nil {
					return fmt.Errorf("post receive %d: %w", preposted, err)
				}
				preposted++
			default:
				var err error
				if preposted, err = e.postRecvs(preposted, 1); err != nil {
					return err
				}
			}
		}
		if scnt < total {
			if scnt == p.Warmup {
				e.mark()
			}
			if posted != nil {
				posted[scnt] = e.now()
			}
			scnt++
			signaled := scnt%cqMod == 0 || scnt == total
			swr[0].Flags = base
			if signaled {
				swr[0].Flags |= verbs.SendSignaled
			}
			if _, err := e.qp.PostSend(swr); err != nil {
				return fmt.Errorf("post send: %w", err)
			}
			if signaled {
				if _, err := e.waitCQ(e.scq, swc, p.Event); err != nil {
					return err
				}
				if err := check(&swc[0], verbs.WCSend); err != nil {
					return err
				}
			}
		}
	}
	e.markEnd()
	return nil
}

// writeLat is the RDMA Write ping-pong; both sides run it. Each side
// writes its message into the peer's target area with a new value in its
// last byte, and then polls the last byte of its own target area until
// the peer's reply changes it. The client writes first.
func (e *endpoint) writeLat(client bool, posted []int64) error {
	p := e.p
	total := p.total()
	pb, err := e.lastTargetByte()
	if err != nil {
		return err
	}
	wr := e.swr
	wr[0].Flags = e.baseFlags() | verbs.SendSignaled
	src := e.buf.Bytes()[:p.Size]
	swc := e.wc[:1]
	scnt, rcnt := 0, 0
	for scnt < total || rcnt < total {
		if rcnt < total && !(client && scnt < 1) {
			rcnt++
			if err := e.spin(pb, byte(rcnt)); err != nil {
				return err
			}
		}
		if scnt < total {
			if scnt == p.Warmup {
				e.mark()
			}
			if posted != nil {
				posted[scnt] = e.now()
			}
			scnt++
			src[p.Size-1] = byte(scnt)
			if _, err := e.qp.PostSend(wr); err != nil {
				return fmt.Errorf("post RDMA Write: %w", err)
			}
			if _, err := e.waitCQ(e.scq, swc, p.Event); err != nil {
				return err
			}
			if err := check(&swc[0], verbs.WCRDMAWrite); err != nil {
				return err
			}
		}
	}
	e.markEnd()
	return nil
}

// opLat is read_lat and atomic_lat, run by the client alone: post one
// operation, wait for its completion, again.
func (e *endpoint) opLat(posted []int64) error {
	p := e.p
	wr := e.swr
	wr[0].Flags = verbs.SendSignaled
	op := p.Test.Opcode().CompletionOpcode()
	swc := e.wc[:1]
	for i := range p.total() {
		if i == p.Warmup {
			e.mark()
		}
		posted[i] = e.now()
		if _, err := e.qp.PostSend(wr); err != nil {
			return fmt.Errorf("post %v: %w", p.Test.Opcode(), err)
		}
		if _, err := e.waitCQ(e.scq, swc, p.Event); err != nil {
			return err
		}
		if err := check(&swc[0], op); err != nil {
			return err
		}
	}
	e.markEnd()
	return nil
}

// bw posts n operations keeping up to TxDepth outstanding, PostList at a
// time, signaling every cqMod-th and the last, and records when the first
// of each signaled group (every cqMod-th from the first) was posted (a
// list's work requests all when the list was) and when each signaled
// completion was polled. (A time for every post, as perftest takes,
// cost shm0's 8 B write_bw a store to a new cache line every eight
// messages, which the next locked instruction waited for: the lock of
// the next PostSend.) With credits (send_bw on a device
// without RNR retry) it also keeps fewer than RxDepth messages beyond the
// count the receiver last wrote into its target area.
func (e *endpoint) bw(n int, posted, completed []int64) error {
	p := e.p
	cqMod := p.cqMod()
	wr := e.swr
	base := e.baseFlags()
	op := p.Test.Opcode().CompletionOpcode()
	var credit *uint32
	if e.credits {
		var err error
		if credit, err = e.word32(p.area()); err != nil {
			return err
		}
	}
	scnt, ccnt := 0, 0
	lastSig := -1 // the last signaled work request posted
	phase := 0    // scnt % cqMod, kept without dividing per work request
	for scnt < n || ccnt < n {
		for scnt < n && scnt-ccnt < p.TxDepth {
			// A list of up to PostList work requests, as many as the
			// window (and the receiver's credits) leave room for.
			k := min(len(wr), n-scnt, p.TxDepth-(scnt-ccnt))
			if credit != nil {
				if k = min(k, p.RxDepth-(e.sent+scnt-int(atomic.LoadUint32(credit)))); k <= 0 {
					break
				}
			}
			var t int64
			for j := range k {
				i := scnt + j
				w := &wr[j]
				w.WRID = uint64(i)
				w.Flags = base
				if phase == 0 {
					// The first of a signaled group: bandwidthStats
					// reads no other post time.
					if t == 0 {
						t = e.now()
					}
					posted[i] = t
				}
				if phase++; phase == cqMod {
					phase = 0
				}
				if phase == 0 || i+1 == n {
					w.Flags |= verbs.SendSignaled
					lastSig = i
				}
			}
			if _, err := e.qp.PostSend(wr[:k]); err != nil {
				return fmt.Errorf("post %v %d: %w", p.Test.Opcode(), scnt, err)
			}
			scnt += k
		}
		if ccnt == n {
			break
		}
		if lastSig < ccnt {
			// No signaled work request is outstanding (nothing is, or
			// only unsignaled ones, whose completions never come): the
			// posting stopped for want of credits, which the receiver
			// owes. (Without credits the window, at least cqMod wide,
			// always holds a signaled one.)
			if err := e.spinCredit(credit, e.sent+scnt-p.RxDepth+1); err != nil {
				return err
			}
			continue
		}
		k, err := e.waitCQ(e.scq, e.wc, p.Event)
		if err != nil {
			return err
		}
		t := e.now()
		for i := range k {
			wc := &e.wc[i]
			if err := check(wc, op); err != nil {
				return err
			}
			j := int(wc.WRID)
			if j < 0 || j >= n {
				return fmt.Errorf("completion of unknown work request %d", wc.WRID)
			}
			completed[j] = t
			ccnt = j + 1
		}
	}
	e.sent += n
	return nil
}

// recvBW is the server of send_bw: it takes every message, reposting a
// receive for each until it has posted one per message, and with
// credits tells the sender every RxDepth/3 messages how far it got.
func (e *endpoint) recvBW(preposted int) error {
	p := e.p
	total := p.total()
	every := max(1, p.RxDepth/3)
	lastCredit, outstanding := 0, 0
	if p.Warmup == 0 {
		e.mark()
	}
	for rcnt := 0; rcnt < total; {
		k, err := e.waitCQ(e.rcq, e.wc, p.Event)
		if err != nil {
			return err
		}
		for i := range k {
			if err := check(&e.wc[i], verbs.WCRecv); err != nil {
				return err
			}
			if e.isCtrl(&e.wc[i]) {
				// The sender finished and said so before the last
				// messages were counted here.
				continue
			}
			rcnt++
			if rcnt == p.Warmup {
				e.mark()
			}
		}
		if preposted < total {
			if preposted, err = e.postRecvs(preposted, min(k, total-preposted)); err != nil {
				return err
			}
		}
		if e.credits && rcnt-lastCredit >= every {
			if err := e.sendCredit(rcnt, &outstanding); err != nil {
				return err
			}
			lastCredit = rcnt
		}
	}
	for outstanding > 0 {
		if err := e.reapCredits(&outstanding, true); err != nil {
			return err
		}
	}
	e.markEnd()
	return nil
}

package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Kernel bypass: the data path makes no system call. The mix workload
// below runs between two processes, each issuing rounds of RDMA Writes,
// RDMA Reads, FetchAndAdds and Sends against the other, receiving the
// other's Sends and reposting the receives, all with busy polling.
// TestKernelBypassMix runs it between this process and a child to check
// that it works; scripts/syscalls.sh runs it in two processes, each under
// its own strace -c, with a million operations a side, and checks that
// each process makes fewer than one system call per 100 operations.

// The child mode "bypass" runs one side, configured by these variables.
const (
	envMixRole   = "GOVERBS_SHM_MIX_ROLE"   // "listen" or "dial"
	envMixAddr   = "GOVERBS_SHM_MIX_ADDR"   // the cm address
	envMixRounds = "GOVERBS_SHM_MIX_ROUNDS" // rounds of mixPerRound operations
)

func init() { childModes["bypass"] = mixChild }

// A round is mixGroups groups of Write, Read, FetchAndAdd and Send, in
// that order, so that once a side has received the peer's last Send of a
// round, every operation of the peer's round has been carried out.
const (
	mixGroups   = 16
	mixPerRound = 4 * mixGroups
	mixRecvs    = 128 // receives kept posted: two rounds of Sends, with room
	mixMsg      = 32
	mixChunk    = 64
)

// The target region a side exposes to its peer: a counter the peer adds
// to, an area the peer writes, and an area the peer reads.
const (
	mixCounter   = 0
	mixWriteArea = 1024
	mixReadArea  = 2048
	mixTargetLen = 4096
)

// mixBytes is the deterministic content of a side's read area (seed 1)
// and of the data it writes (seed 2).
func mixBytes(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed*0x5b
	}
	return b
}

// mixSide is one side of the workload.
type mixSide struct {
	e                      *verbstest.Local
	src, dst, rbuf, target *verbs.MR
	peerAddr               uint64
	peerKey                uint32
	sends                  []verbs.SendWR
	recv                   [1]verbs.RecvWR
	recvSGE                [1]verbs.SGE
	wc                     []verbs.WorkCompletion
}

// mixStats is what a side did.
type mixStats struct {
	ops     int // send-queue operations posted and completed
	recvs   int // receives completed
	elapsed time.Duration
}

func newMixSide() (*mixSide, error) {
	opts := verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: mixPerRound, MaxRecvWR: mixRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}, CQDepth: 512}.Defaults()
	e, err := verbstest.NewLocal(DeviceName, opts, false)
	if err != nil {
		return nil, err
	}
	s := &mixSide{e: e, wc: make([]verbs.WorkCompletion, 64)}
	for _, r := range []struct {
		mr     **verbs.MR
		size   int
		access verbs.AccessFlags
	}{
		{&s.src, 2048, verbs.AccessLocalWrite},
		{&s.dst, 2048, verbs.AccessLocalWrite},
		{&s.rbuf, mixRecvs * mixMsg, verbs.AccessLocalWrite},
		{&s.target, mixTargetLen, verbs.AccessLocalWrite | verbs.RemoteAccess},
	} {
		if *r.mr, err = e.PD.AllocMR(r.size, r.access); err != nil {
			e.Close()
			return nil, err
		}
	}
	if err := toInit(e.QPs[0]); err != nil {
		e.Close()
		return nil, err
	}
	copy(s.target.Bytes()[mixReadArea:], mixBytes(1, mixGroups*mixChunk))
	copy(s.src.Bytes(), mixBytes(2, mixGroups*mixChunk))
	for i := range mixRecvs {
		if err := s.postRecv(i); err != nil {
			e.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *mixSide) postRecv(i int) error {
	s.recvSGE[0] = s.rbuf.SGE(i*mixMsg, mixMsg)
	s.recv[0] = verbs.RecvWR{WRID: uint64(i), SGList: s.recvSGE[:]}
	_, err := s.e.QPs[0].PostRecv(s.recv[:])
	return err
}

// privateData describes the side's target region to the peer.
func (s *mixSide) privateData() []byte {
	b := binary.LittleEndian.AppendUint64(nil, s.target.Addr())
	return binary.LittleEndian.AppendUint32(b, s.target.RKey())
}

func (s *mixSide) connect(role, addr string, ready func()) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := &cm.Param{PrivateData: s.privateData()}
	var c *cm.Conn
	var err error
	if role == "listen" {
		l, lerr := cm.Listen(addr)
		if lerr != nil {
			return lerr
		}
		defer l.Close()
		ready()
		req, aerr := l.Accept(ctx)
		if aerr != nil {
			return aerr
		}
		c, err = req.Accept(s.e.QPs[0], p)
	} else {
		c, err = cm.Dial(ctx, addr, s.e.QPs[0], p)
	}
	if err != nil {
		return err
	}
	s.e.Conns = append(s.e.Conns, c)
	pd := c.PrivateData()
	if len(pd) != 12 {
		return fmt.Errorf("peer sent %d bytes of private data, want 12", len(pd))
	}
	s.peerAddr, s.peerKey = binary.LittleEndian.Uint64(pd), binary.LittleEndian.Uint32(pd[8:])
	s.buildRound()
	return nil
}

// buildRound prepares the work requests of a round once; each round
// posts the same ones, with new sequence numbers in the messages.
func (s *mixSide) buildRound() {
	sges := make([]verbs.SGE, mixPerRound)
	s.sends = make([]verbs.SendWR, 0, mixPerRound)
	for j := range mixGroups {
		k := len(s.sends)
		sges[k] = s.src.SGE(j*mixChunk, mixChunk)
		sges[k+1] = s.dst.SGE(j*mixChunk, mixChunk)
		sges[k+2] = s.dst.SGE(1024+j*8, 8)
		sges[k+3] = s.src.SGE(1024+j*mixMsg, mixMsg)
		s.sends = append(s.sends,
			verbs.SendWR{WRID: uint64(k), SGList: sges[k : k+1], Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				RemoteAddr: s.peerAddr + mixWriteArea + uint64(j*mixChunk), RKey: s.peerKey},
			verbs.SendWR{WRID: uint64(k + 1), SGList: sges[k+1 : k+2], Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
				RemoteAddr: s.peerAddr + mixReadArea + uint64(j*mixChunk), RKey: s.peerKey},
			verbs.SendWR{WRID: uint64(k + 2), SGList: sges[k+2 : k+3], Opcode: verbs.OpAtomicFetchAndAdd, Flags: verbs.SendSignaled,
				RemoteAddr: s.peerAddr + mixCounter, RKey: s.peerKey, CompareAdd: 1},
			verbs.SendWR{WRID: uint64(k + 3), SGList: sges[k+3 : k+4], Opcode: verbs.OpSend, Flags: verbs.SendSignaled},
		)
	}
}

var errMixTimeout = errors.New("mix: no progress for 10 s")

// run carries out rounds rounds with busy polling and checks every
// result: the data read, the values fetched, the messages received in
// order, and at the end what the peer wrote and added here.
func (s *mixSide) run(rounds int) (mixStats, error) {
	qp, scq, rcq := s.e.QPs[0], s.e.SendCQ, s.e.RecvCQ
	want := mixBytes(1, mixGroups*mixChunk)
	src, dst, rbuf := s.src.Bytes(), s.dst.Bytes(), s.rbuf.Bytes()
	start := time.Now()
	recvd := 0
	for r := range rounds {
		for j := range mixGroups {
			binary.LittleEndian.PutUint64(src[1024+j*mixMsg:], uint64(r*mixGroups+j))
		}
		if n, err := qp.PostSend(s.sends); err != nil {
			return mixStats{}, fmt.Errorf("round %d: post: %d posted: %v", r, n, err)
		}
		done, spins, last := 0, 0, time.Now()
		for done < mixPerRound || recvd < (r+1)*mixGroups {
			progress := false
			if n := scq.Poll(s.wc); n > 0 {
				progress = true
				for _, wc := range s.wc[:n] {
					if wc.Status != verbs.WCSuccess {
						return mixStats{}, fmt.Errorf("round %d: WR %d completed with %v", r, wc.WRID, wc.Status)
					}
				}
				done += n
			}
			// Poll for the peer's Sends of this round and no more: once
			// the peer is done it disconnects, and the receives still
			// posted here are flushed.
			if need := (r+1)*mixGroups - recvd; need > 0 {
				n := rcq.Poll(s.wc[:min(need, len(s.wc))])
				progress = progress || n > 0
				for _, wc := range s.wc[:n] {
					if wc.Status != verbs.WCSuccess || wc.ByteLen != mixMsg {
						return mixStats{}, fmt.Errorf("receive %d: status %v, %d bytes", recvd, wc.Status, wc.ByteLen)
					}
					if seq := binary.LittleEndian.Uint64(rbuf[int(wc.WRID)*mixMsg:]); seq != uint64(recvd) {
						return mixStats{}, fmt.Errorf("receive %d carries message %d", recvd, seq)
					}
					recvd++
					if err := s.postRecv(int(wc.WRID)); err != nil {
						return mixStats{}, fmt.Errorf("repost receive: %v", err)
					}
				}
			}
			if progress {
				spins = 0
			} else if spins++; spins%(1<<16) == 0 {
				if time.Since(last) > 10*time.Second {
					return mixStats{}, errMixTimeout
				}
			} else if spins == 1 {
				last = time.Now()
			}
		}
		if !bytes.Equal(dst[:mixGroups*mixChunk], want) {
			return mixStats{}, fmt.Errorf("round %d: RDMA Reads returned wrong bytes", r)
		}
		for j := range mixGroups {
			if old := binary.NativeEndian.Uint64(dst[1024+j*8:]); old != uint64(r*mixGroups+j) {
				return mixStats{}, fmt.Errorf("round %d: FetchAndAdd %d returned %d, want %d", r, j, old, r*mixGroups+j)
			}
		}
	}
	st := mixStats{ops: rounds * mixPerRound, recvs: recvd, elapsed: time.Since(start)}
	// The peer's last Send follows its last Write and FetchAndAdd.
	tb := s.target.Bytes()
	if got := binary.NativeEndian.Uint64(tb[mixCounter:]); got != uint64(rounds*mixGroups) {
		return st, fmt.Errorf("counter the peer added to holds %d, want %d", got, rounds*mixGroups)
	}
	if rounds > 0 && !bytes.Equal(tb[mixWriteArea:mixWriteArea+mixGroups*mixChunk], mixBytes(2, mixGroups*mixChunk)) {
		return st, errors.New("the peer's RDMA Writes did not arrive")
	}
	return st, nil
}

// mixChild is the child mode "bypass": one side of the workload, which
// reports "listening" when it listens and "ops N" when it is done.
func mixChild() int {
	rounds, err := strconv.Atoi(os.Getenv(envMixRounds))
	if err != nil {
		return childFail("bad %s: %v", envMixRounds, err)
	}
	s, err := newMixSide()
	if err != nil {
		return childFail("setup: %v", err)
	}
	defer s.e.Close()
	if err := s.connect(os.Getenv(envMixRole), os.Getenv(envMixAddr), func() { say("listening") }); err != nil {
		return childFail("connect: %v", err)
	}
	st, err := s.run(rounds)
	if err != nil {
		return childFail("%v", err)
	}
	say("ops %d recvs %d elapsed %v", st.ops, st.recvs, st.elapsed)
	return 0
}

// TestKernelBypassMix runs the mix workload between this process and a
// child, both busy polling, and checks every result on both sides. The
// system-call count is measured by scripts/syscalls.sh, which runs the
// same workload under strace.
func TestKernelBypassMix(t *testing.T) {
	rounds := 400
	if testing.Short() {
		rounds = 50
	}
	addr := uniqueAddr("mix")
	c := spawn(t, "bypass", envMixRole+"=listen", envMixAddr+"="+addr, envMixRounds+"="+strconv.Itoa(rounds))
	c.expect("listening", 10*time.Second)
	s, err := newMixSide()
	if err != nil {
		t.Fatal(err)
	}
	defer s.e.Close()
	if err := s.connect("dial", addr, nil); err != nil {
		t.Fatal(err)
	}
	st, err := s.run(rounds)
	if err != nil {
		t.Fatal(err)
	}
	peer := c.expect("ops", 30*time.Second)
	if err := c.wait(10 * time.Second); err != nil {
		t.Fatalf("child: %v", err)
	}
	t.Logf("%d operations and %d receives here in %v; child: ops %s", st.ops, st.recvs, st.elapsed, peer)
}

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Peer death. The survivor — this process — connects to a child, in
// either role (it listens and the child dials, or it dials and the child
// listens), leaves work outstanding (receives, a Send stalled on RNR
// because the child posts no receive, and RDMA operations queued behind
// it), and then the child ends: killed with SIGKILL, exiting without
// closing anything, closing everything in order, or panicking. Within a
// second the survivor's QP is in the error state and every outstanding WR
// has completed with WCWRFlushErr; closing the survivor's endpoint
// returns; and nothing is left behind: no file in the child's temporary
// directory or in /dev/shm, no goverbs memfd mapped or open here.

const (
	envDeathRole = "GOVERBS_SHM_DEATH_ROLE" // the child's role: "listen" or "dial"
	envDeathAddr = "GOVERBS_SHM_DEATH_ADDR"
	deathBound   = time.Second
)

func init() { childModes["death"] = deathChild }

// deathOpts are the endpoints' options: no default receives anywhere.
func deathOpts() verbstest.PairOptions { return verbstest.PairOptions{}.Defaults() }

// deathParam describes target (its address and rkey) to the peer and asks
// senders to wait 2.56 ms before an RNR retry.
func deathParam(target *verbs.MR) *cm.Param {
	b := binary.LittleEndian.AppendUint64(nil, target.Addr())
	return &cm.Param{PrivateData: binary.LittleEndian.AppendUint32(b, target.RKey()), MinRNRTimer: 16}
}

// connectRole connects e's first QP at addr, listening or dialling; ready
// is called once a listener listens.
func connectRole(e *verbstest.Local, role, addr string, p *cm.Param, ready func()) (*cm.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var c *cm.Conn
	var err error
	if role == "listen" {
		l, lerr := cm.Listen(addr)
		if lerr != nil {
			return nil, lerr
		}
		defer l.Close()
		ready()
		req, aerr := l.Accept(ctx)
		if aerr != nil {
			return nil, aerr
		}
		c, err = req.Accept(e.QPs[0], p)
	} else {
		c, err = cm.Dial(ctx, addr, e.QPs[0], p)
	}
	if err == nil {
		e.Conns = append(e.Conns, c)
	}
	return c, err
}

// deathChild is the child mode "death": it connects, says "ready", and
// then ends as its input commands: "exit" (at once, closing nothing),
// "close" (everything in order), "panic"; or it waits to be killed.
func deathChild() int {
	e, err := verbstest.NewLocal(DeviceName, deathOpts(), false)
	if err != nil {
		return childFail("%v", err)
	}
	target, err := e.PD.AllocMR(4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		return childFail("%v", err)
	}
	cmds := commands()
	if _, err := connectRole(e, os.Getenv(envDeathRole), os.Getenv(envDeathAddr), deathParam(target), func() { say("listening") }); err != nil {
		return childFail("connect: %v", err)
	}
	say("ready")
	switch <-cmds {
	case "exit":
		os.Exit(0)
	case "close":
		e.Close()
		return 0
	case "panic":
		panic("shm test child: the peer panics, as asked")
	}
	// Input closed: the parent is done with us.
	e.Close()
	return 0
}

// goverbsMemfds counts this process's mappings and descriptors of goverbs
// memfds.
func goverbsMemfds(t testing.TB) (maps, fds int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	maps = strings.Count(string(b), "/memfd:goverbs-")
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "/memfd:goverbs-") {
			fds++
		}
	}
	return maps, fds
}

// devShm lists /dev/shm.
func devShm(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// expectNothingLeft checks that dir is empty and /dev/shm holds no entry
// it did not hold before.
func expectNothingLeft(t testing.TB, dir string, shmBefore []string) {
	t.Helper()
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the child's temporary directory holds %q (%v)", names, err)
	}
	for _, n := range devShm(t) {
		if !slices.Contains(shmBefore, n) {
			t.Errorf("/dev/shm/%s appeared", n)
		}
	}
}

func TestPeerDeath(t *testing.T) {
	for _, childRole := range []string{"listen", "dial"} {
		for _, how := range []string{"kill", "exit", "close", "panic"} {
			t.Run("child-"+childRole+"s/"+how, func(t *testing.T) { testPeerDeath(t, childRole, how) })
		}
	}
}

func testPeerDeath(t *testing.T, childRole, how string) {
	shmBefore := devShm(t)
	maps0, fds0 := goverbsMemfds(t)
	tmp := t.TempDir()
	addr := uniqueAddr("death")
	var c *child
	start := func() { c = spawn(t, "death", envDeathRole+"="+childRole, envDeathAddr+"="+addr, "TMPDIR="+tmp) }

	e, err := verbstest.NewLocal(DeviceName, deathOpts(), false)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()
	local, err := e.PD.AllocMR(4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		t.Fatal(err)
	}
	if err := toInit(e.QPs[0]); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := e.QPs[0].PostRecv([]verbs.RecvWR{{WRID: uint64(100 + i), SGList: []verbs.SGE{local.SGE(i*64, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	role := "dial"
	if childRole == "dial" {
		role = "listen"
	}
	if childRole == "listen" {
		start()
		c.expect("listening", waitLimit)
	}
	// When this process listens, the child starts once it does.
	conn, err := connectRole(e, role, addr, deathParam(local), start)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	c.expect("ready", waitLimit)
	pd := conn.PrivateData()
	remote := verbstest.Region{Addr: binary.LittleEndian.Uint64(pd), RKey: binary.LittleEndian.Uint32(pd[8:])}

	// A Send the child never receives (RNR, retried forever) and, queued
	// behind it, a Write, a Read and a FetchAndAdd.
	wrs := []verbs.SendWR{
		send(1, local.SGE(1024, 8)),
		rdma(2, verbs.OpRDMAWrite, local.SGE(1024, 64), remote, 0),
		rdma(3, verbs.OpRDMARead, local.SGE(2048, 64), remote, 64),
		atomicWR(4, verbs.OpAtomicFetchAndAdd, local.SGE(3072, 8), remote, 128, 1, 0),
	}
	if n, err := e.QPs[0].PostSend(wrs); err != nil || n != len(wrs) {
		t.Fatalf("post: %d, %v", n, err)
	}
	wc := make([]verbs.WorkCompletion, 16)
	if n := e.SendCQ.Poll(wc); n != 0 {
		t.Fatalf("completions before the peer died: %v", wc[:n])
	}

	died := time.Now()
	if how == "kill" {
		c.kill()
	} else {
		c.send(how)
	}
	deadline, cancel := context.WithDeadline(context.Background(), died.Add(deathBound))
	defer cancel()
	select {
	case <-conn.Done():
	case <-deadline.Done():
		t.Fatalf("the connection did not end within %v of the peer's %s", deathBound, how)
	}
	if s := e.QPs[0].State(); s != verbs.QPSErr {
		t.Fatalf("QP in %v after the peer's %s, want ERR", s, how)
	}
	flushed := map[uint64]bool{}
	for _, cq := range []*verbs.CQ{e.SendCQ, e.RecvCQ} {
		for want := 4; want > 0; {
			n, err := cq.Wait(deadline, wc[:want])
			if err != nil {
				t.Fatalf("%d WRs not flushed within %v of the peer's %s: %v", want, deathBound, how, err)
			}
			for _, w := range wc[:n] {
				if w.Status != verbs.WCWRFlushErr || flushed[w.WRID] {
					t.Fatalf("completion of WR %d with %v, want each outstanding WR flushed once", w.WRID, w.Status)
				}
				flushed[w.WRID] = true
			}
			want -= n
		}
	}
	latency := time.Since(died)
	if n := e.SendCQ.Poll(wc) + e.RecvCQ.Poll(wc); n != 0 {
		t.Fatalf("%d completions more than the outstanding WRs", n)
	}

	// Nothing hangs: the survivor closes its endpoint.
	closeDone := make(chan error, 1)
	go func() { closeDone <- e.Close() }()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case err := <-closeDone:
		closed = true
		if err != nil {
			t.Fatalf("close the survivor's endpoint: %v", err)
		}
	case <-timer.C:
		t.Fatal("closing the survivor's endpoint hangs")
	}

	err = c.wait(waitLimit)
	var ee *exec.ExitError
	switch how {
	case "kill", "panic":
		if !errors.As(err, &ee) {
			t.Fatalf("child exit after %s: %v, want a failure", how, err)
		}
	default:
		if err != nil {
			t.Fatalf("child exit after %s: %v", how, err)
		}
	}
	if maps, fds := goverbsMemfds(t); maps != maps0 || fds != fds0 {
		t.Errorf("goverbs memfds here: %d mappings and %d descriptors, %d and %d before the test", maps, fds, maps0, fds0)
	}
	expectNothingLeft(t, tmp, shmBefore)
	t.Logf("peer's %s → QP in ERR and 8 WRs flushed in %v", how, latency.Round(10*time.Microsecond))
}

// TestPathListenerKilled: a listener on a path (shm:///path.sock) killed
// with SIGKILL leaves its socket file behind — the kernel does not remove
// it — but nothing else; the next Listen on the path takes the file over,
// and closing that listener removes it. Abstract addresses (shm://@name)
// leave nothing at all.
func TestPathListenerKilled(t *testing.T) {
	shmBefore := devShm(t)
	tmp := t.TempDir()
	path := filepath.Join(tmp, "l.sock")
	c := spawn(t, "death", envDeathRole+"=listen", envDeathAddr+"=shm://"+path, "TMPDIR="+tmp)
	c.expect("listening", waitLimit)
	c.kill()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("after SIGKILL of the listener its socket file: %v (the kernel leaves it; the package doc says so)", err)
	}
	l, err := cm.Listen("shm://" + path)
	if err != nil {
		t.Fatalf("listen on the path a killed listener left: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	expectNothingLeft(t, tmp, shmBefore)
}

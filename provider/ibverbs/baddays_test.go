package ibverbs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The bad-day cases make, break and remove a Soft-RoCE device of their
// own, on a veth pair, so that the devices other tests use are left
// alone. They need root, the `ip` and `rdma` commands and the rdma_rxe
// module; interop/ibverbs.sh runs them in its VM:
//
//	GOVERBS_IBVERBS_BADDAYS=1
const envBadDays = "GOVERBS_IBVERBS_BADDAYS"

// badBound bounds every wait of these cases: what has not happened by
// then is a hang. The VM is slow, so it is generous; no case asserts
// that anything happens quickly.
const badBound = 90 * time.Second

var badIndex atomic.Int32

// badDevice is an rxe device on one end of a veth pair, with the
// address host.
type badDevice struct {
	name, netdev, host string
	// table, for a device of a pair, is the routing table that makes
	// host local to packets arriving on netdev only.
	table string
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// newBadDevice makes an rxe device of its own; the test's cleanup
// removes it and its veth pair.
func newBadDevice(t *testing.T) *badDevice {
	if os.Getenv(envBadDays) == "" {
		t.Skipf("the bad-day cases remove and break RDMA devices: set %s=1 to run them (interop/ibverbs.sh does, in a VM)", envBadDays)
	}
	for _, c := range []string{"ip", "rdma"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("no %s command: %v", c, err)
		}
	}
	i := badIndex.Add(1)
	d := &badDevice{
		name:   fmt.Sprintf("rxe_bad%d", i),
		netdev: fmt.Sprintf("gvbad%da", i),
		host:   fmt.Sprintf("10.99.%d.1", i),
	}
	peer := fmt.Sprintf("gvbad%db", i)
	run(t, "ip", "link", "add", d.netdev, "type", "veth", "peer", "name", peer)
	run(t, "ip", "addr", "add", d.host+"/24", "dev", d.netdev)
	run(t, "ip", "link", "set", d.netdev, "up")
	run(t, "ip", "link", "set", peer, "up")
	run(t, "rdma", "link", "add", d.name, "type", "rxe", "netdev", d.netdev)
	t.Cleanup(func() {
		// librdmacm keeps a context open on each device the process's
		// rdma_cm ids were bound to, until the process exits (or the
		// device is removed while an id is bound to it): a removal
		// started here completes only then, and the veth pair goes
		// after it. interop/ibverbs.sh checks that both are gone once
		// the process has exited.
		exec.Command("sh", "-c", "rdma link delete "+d.name+"; ip link delete "+d.netdev).Start()
	})
	return d
}

// newBadPair makes two rxe devices, one on each end of a veth pair,
// that reach each other over the pair: each end's address is made local
// to packets arriving on that end only (an ip rule per end), so that
// traffic between them crosses the link, as between two hosts, rather
// than the kernel's loopback. Taking one end down cuts the devices off
// from each other. The test's cleanup removes both.
func newBadPair(t *testing.T) (a, b *badDevice) {
	a = newBadDevice(t)
	i := badIndex.Load()
	b = &badDevice{name: a.name + "b", netdev: fmt.Sprintf("gvbad%db", i), host: fmt.Sprintf("10.99.%d.2", i)}
	a.table, b.table = fmt.Sprint(1000+2*i), fmt.Sprint(1001+2*i)
	t.Cleanup(func() {
		for _, d := range []*badDevice{a, b} {
			exec.Command("ip", "rule", "del", "lookup", d.table).Run()
		}
		exec.Command("sh", "-c", "rdma link delete "+b.name).Start()
	})
	run(t, "ip", "addr", "add", b.host+"/24", "dev", b.netdev)
	for _, d := range []*badDevice{a, b} {
		d.routeOverLink(t)
		run(t, "ip", "rule", "add", "iif", d.netdev, "lookup", d.table)
		run(t, "sysctl", "-q", "-w", "net.ipv4.conf."+d.netdev+".accept_local=1", "net.ipv4.conf."+d.netdev+".rp_filter=0")
	}
	run(t, "sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0")
	run(t, "rdma", "link", "add", b.name, "type", "rxe", "netdev", b.netdev)
	return a, b
}

// routeOverLink moves the local route of a pair's device's address from
// the main local table to the device's own. The kernel puts it back
// each time the link comes up.
func (d *badDevice) routeOverLink(t *testing.T) {
	t.Helper()
	if d.table == "" {
		return
	}
	exec.Command("ip", "route", "del", "local", d.host, "table", "local").Run()
	run(t, "ip", "route", "replace", "local", d.host, "dev", d.netdev, "table", d.table)
}

// badRig is two QPs connected through rdma_cm, A dialled and B
// accepted: on one context of one bad device, or each on a device of
// its own (ctxB, pdB).
type badRig struct {
	ctx          *verbs.Context
	pd           *verbs.PD
	ctxB         *verbs.Context
	pdB          *verbs.PD
	cqA, cqB     *verbs.CQ
	qpA, qpB     *verbs.QP
	connA, connB *cm.Conn
}

var badPort atomic.Int32

func connectBad(t *testing.T, d *badDevice) *badRig { return connectBetween(t, d, d) }

// connectBetween connects a QP on dA (A, dialling) to one on dB (B,
// listening at dB's address).
func connectBetween(t *testing.T, dA, dB *badDevice) *badRig {
	vctx, err := verbs.Open(dA.name)
	if err != nil {
		t.Fatalf("open %s: %v", dA.name, err)
	}
	r := &badRig{ctx: vctx, ctxB: vctx}
	if r.pd, err = vctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	r.pdB = r.pd
	if dB != dA {
		if r.ctxB, err = verbs.Open(dB.name); err != nil {
			t.Fatalf("open %s: %v", dB.name, err)
		}
		if r.pdB, err = r.ctxB.AllocPD(); err != nil {
			t.Fatal(err)
		}
	}
	if r.cqA, err = vctx.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	if r.cqB, err = r.ctxB.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	qpCap := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	if r.qpA, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cqA, RecvCQ: r.cqA, Cap: qpCap}); err != nil {
		t.Fatal(err)
	}
	if r.qpB, err = r.pdB.CreateQP(verbs.QPInitAttr{SendCQ: r.cqB, RecvCQ: r.cqB, Cap: qpCap}); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("rdma://%s:%d", dB.host, 19000+os.Getpid()%500*4+int(badPort.Add(1)))
	l, err := cm.Listen(addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), badBound)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			r.connB, err = req.Accept(r.qpB, nil)
		}
		accepted <- err
	}()
	// The device's GIDs follow its address a moment after it is made:
	// until then rdma_cm finds no route.
	for {
		r.connA, err = cm.Dial(ctx, addr, r.qpA, nil)
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("accept at %s: %v", addr, err)
	}
	return r
}

// waitEvent waits for an asynchronous event of type typ, logging the
// others it sees.
func (r *badRig) waitEvent(t *testing.T, typ verbs.EventType) {
	t.Helper()
	bound := time.NewTimer(badBound)
	defer bound.Stop()
	for {
		select {
		case ev := <-r.ctx.Events():
			t.Logf("async event %v", ev.Type)
			if ev.Type == typ {
				return
			}
		case <-bound.C:
			t.Fatalf("no %v within %v", typ, badBound)
		}
	}
}

// close tears the rig down, each call bounded; it returns the errors
// the calls returned, which a removed device may make.
func (r *badRig) close(t *testing.T) []error {
	t.Helper()
	var errs []error
	step := func(what string, f func() error) {
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("%s: %v", what, err)
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
			}
		case <-time.After(badBound):
			dumpStacks(t)
			t.Fatalf("%s did not return within %v", what, badBound)
		}
	}
	for _, c := range []*cm.Conn{r.connA, r.connB} {
		if c != nil {
			step("close a connection", c.Close)
		}
	}
	step("destroy QP A", r.qpA.Destroy)
	step("destroy QP B", r.qpB.Destroy)
	step("destroy CQ A", r.cqA.Destroy)
	step("destroy CQ B", r.cqB.Destroy)
	step("dealloc PD", r.pd.Dealloc)
	step("close the context", r.ctx.Close)
	if r.ctxB != r.ctx {
		step("dealloc PD B", r.pdB.Dealloc)
		step("close context B", r.ctxB.Close)
	}
	return errs
}

// uverbsNode is the path of the character device of the device name.
func uverbsNode(t *testing.T, name string) string {
	t.Helper()
	nodes, _ := os.ReadDir("/sys/class/infiniband_verbs")
	for _, n := range nodes {
		if b, err := os.ReadFile("/sys/class/infiniband_verbs/" + n.Name() + "/ibdev"); err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/infiniband/" + n.Name()
		}
	}
	t.Fatalf("no uverbs node names %s", name)
	return ""
}

// rdmaFDs lists the process's descriptors and mappings of node.
func rdmaFDs(t *testing.T, node string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, f := range fds {
		if to, err := os.Readlink("/proc/self/fd/" + f.Name()); err == nil && strings.HasPrefix(to, node) {
			held = append(held, f.Name()+" -> "+to)
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, node) {
			held = append(held, "mapping "+strings.Join(strings.Fields(l), " "))
		}
	}
	return held
}

// TestBadDayDeviceRemoved removes the device under a context with a
// connection, receives outstanding and a goroutine in CQ.Wait. rxe has
// no disassociation: the kernel's removal waits until the process has
// closed what it holds of the device, and tells the process through
// rdma_cm. The provider then raises EventDeviceFatal, CQ.Wait returns
// ErrNoDevice (the outstanding receives complete flushed, before or
// after), posting is refused with ErrNoDevice, every destroy and Close
// returns, and with the context closed the removal completes (librdmacm
// has let go of the device too) and no descriptor or mapping of the
// device is left in the process.
func TestBadDayDeviceRemoved(t *testing.T) {
	d := newBadDevice(t)
	r := connectBad(t, d)
	mr, err := r.pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := r.qpA.PostRecv([]verbs.RecvWR{{WRID: uint64(100 + i), SGList: []verbs.SGE{mr.SGE(64*i, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	type waitResult struct {
		wcs []verbs.WorkCompletion
		err error
	}
	waited := make(chan waitResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*badBound)
		defer cancel()
		var res waitResult
		wc := make([]verbs.WorkCompletion, 4)
		for {
			n, err := r.cqA.Wait(ctx, wc)
			res.wcs = append(res.wcs, wc[:n]...)
			if err != nil {
				res.err = err
				waited <- res
				return
			}
		}
	}()

	node := uverbsNode(t, d.name)
	if held := rdmaFDs(t, node); len(held) == 0 {
		t.Fatalf("no descriptor of %s (%s) is open with the context open: the check below would prove nothing", d.name, node)
	}
	remove := exec.Command("rdma", "link", "delete", d.name)
	var out bytes.Buffer
	remove.Stdout, remove.Stderr = &out, &out
	if err := remove.Start(); err != nil {
		t.Fatal(err)
	}
	removed := make(chan error, 1)
	go func() { removed <- remove.Wait() }()

	r.waitEvent(t, verbs.EventDeviceFatal)
	var res waitResult
	select {
	case res = <-waited:
	case <-time.After(badBound):
		t.Fatalf("CQ.Wait did not return within %v of the device's removal", badBound)
	}
	if !errors.Is(res.err, verbs.ErrNoDevice) {
		t.Errorf("CQ.Wait on a removed device returned %v, want ErrNoDevice", res.err)
	}
	for _, wc := range res.wcs {
		if wc.Status != verbs.WCWRFlushErr {
			t.Errorf("completion WRID %d status %v on a removed device, want flushed", wc.WRID, wc.Status)
		}
	}
	t.Logf("CQ.Wait: %d flushed completions, then %v", len(res.wcs), res.err)
	if _, err := r.qpA.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{mr.SGE(0, 8)}}}); !errors.Is(err, verbs.ErrNoDevice) {
		t.Errorf("PostSend on a removed device: %v, want ErrNoDevice", err)
	}
	if _, err := r.qpB.PostRecv([]verbs.RecvWR{{WRID: 2, SGList: []verbs.SGE{mr.SGE(0, 8)}}}); !errors.Is(err, verbs.ErrNoDevice) {
		t.Errorf("PostRecv on a removed device: %v, want ErrNoDevice", err)
	}
	// The flushes may come after Wait has returned: Poll takes them.
	wc := make([]verbs.WorkCompletion, 8)
	for n := r.cqA.Poll(wc); n > 0; n = r.cqA.Poll(wc) {
		t.Logf("Poll after the removal: %d completions", n)
		for _, c := range wc[:n] {
			if c.Status != verbs.WCWRFlushErr {
				t.Errorf("completion WRID %d status %v on a removed device, want flushed", c.WRID, c.Status)
			}
		}
	}
	if err := r.cqA.Err(); !errors.Is(err, verbs.ErrNoDevice) {
		t.Errorf("CQ.Err on a removed device: %v, want ErrNoDevice", err)
	}
	select {
	case err := <-removed:
		t.Logf("rdma link delete returned (%v) before the context was closed", err)
	default:
		t.Logf("rdma link delete waits for the context to close")
	}
	if err := mr.Dereg(); err != nil {
		t.Logf("dereg: %v", err)
	}
	r.close(t)
	if held := rdmaFDs(t, node); len(held) > 0 {
		t.Errorf("descriptors or mappings of %s left after the context was closed: %v", node, held)
	}
	select {
	case err := <-removed:
		if err != nil {
			t.Errorf("rdma link delete %s: %v: %s", d.name, err, out.Bytes())
		}
	case <-time.After(badBound):
		t.Fatalf("rdma link delete %s still waits %v after the context was closed: something holds the device", d.name, badBound)
	}
}

// waitSend waits for one completion on cq, bounded.
func waitSend(t *testing.T, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), badBound)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := cq.Wait(ctx, wc); err != nil {
		t.Fatalf("no completion: %v", err)
	}
	return wc[0]
}

// TestBadDayPortDown takes the device's network link down under a
// connection: the device raises EventPortErr; a Send then either still
// completes (rxe loops a packet to its own address back without the
// link) or fails (WCRetryExcErr, or WCLocQPOpErr from a device that
// cannot send the packet at all), never hangs; with the link up again the
// device raises EventPortActive, and the connection closes.
func TestBadDayPortDown(t *testing.T) {
	d := newBadDevice(t)
	r := connectBad(t, d)
	defer r.close(t)
	mr, err := r.pd.RegMR(make([]byte, 128), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Dereg()
	if _, err := r.qpB.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{mr.SGE(64, 64)}}}); err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "link", "set", d.netdev, "down")
	r.waitEvent(t, driver.EventPortErr)
	copy(mr.Bytes(), "sent with the link down")
	if _, err := r.qpA.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{mr.SGE(0, 23)}}}); err != nil {
		t.Fatalf("PostSend with the link down: %v", err)
	}
	switch wc := waitSend(t, r.cqA); wc.Status {
	case verbs.WCSuccess:
		got := waitSend(t, r.cqB)
		if got.Status != verbs.WCSuccess || got.WRID != 7 || string(mr.Bytes()[64:64+got.ByteLen]) != "sent with the link down" {
			t.Fatalf("the Send completed, its receive %+v", got)
		}
		t.Logf("with the link down the Send completed: the device loops its own traffic back")
	case verbs.WCRetryExcErr, verbs.WCLocQPOpErr:
		// Retries ran out, or the device could not send at all (rxe
		// finds no route for the packet).
		t.Logf("with the link down the Send failed: %v", wc.Status)
		if s := r.qpA.State(); s != verbs.QPSErr {
			t.Errorf("QP A in %v after its Send failed, want ERR", s)
		}
	default:
		t.Errorf("a Send with the link down completed %v, want success, %v or %v", wc.Status, verbs.WCRetryExcErr, verbs.WCLocQPOpErr)
	}
	run(t, "ip", "link", "set", d.netdev, "up")
	r.waitEvent(t, driver.EventPortActive)
}

// deregUnderTransfer posts a large transfer, deregisters the region it
// lands in at once, fills that memory with a pattern and waits for the
// transfer's completion. The verbs allow the deregistration to fail
// (ErrBusy) or to succeed with the transfer then ending either way; in
// no case may a byte land in the memory after the deregistration
// returned, so the pattern must be intact.
func deregUnderTransfer(t *testing.T, read bool) {
	d := newBadDevice(t)
	r := connectBad(t, d)
	defer r.close(t)
	size := 8 << 20
	if m := r.ctx.QueryDevice().MaxMsgSize; m > 0 && uint64(size) > m {
		size = int(m)
	}
	src, err := r.pd.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Dereg()
	for i := range src.Bytes() {
		src.Bytes()[i] = 0xab
	}
	// The landing memory is Go memory (RegMR): the region pins it.
	landing := make([]byte, size)
	access := verbs.AccessLocalWrite
	if !read {
		access |= verbs.AccessRemoteWrite
	}
	dst, err := r.pd.RegMR(landing, access)
	if err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{dst.SGE(0, size)}, RemoteAddr: src.Addr(), RKey: src.RKey()}
	what := "Read into"
	if !read {
		wr = verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
		what = "Write to"
	}
	if _, err := r.qpA.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if err := dst.Dereg(); err != nil {
		if !errors.Is(err, verbs.ErrBusy) {
			t.Fatalf("deregistering the region under a pending %s it: %v, want success or ErrBusy", what, err)
		}
		wc := waitSend(t, r.cqA)
		t.Logf("deregistration refused (%v); the %s it completed %v", err, what, wc.Status)
		if err := dst.Dereg(); err != nil {
			t.Fatalf("deregistering after the completion: %v", err)
		}
		return
	}
	for i := range landing {
		landing[i] = 0x5c
	}
	wc := waitSend(t, r.cqA)
	t.Logf("the region was deregistered under a pending %s it, which completed %v", what, wc.Status)
	// Whatever the completion, nothing may have landed since.
	for i, b := range landing {
		if b != 0x5c {
			t.Fatalf("byte %d of the deregistered memory changed to %#x after the deregistration", i, b)
		}
	}
}

// TestBadDayDeregUnderRead deregisters the region a pending RDMA Read
// scatters into.
func TestBadDayDeregUnderRead(t *testing.T) { deregUnderTransfer(t, true) }

// TestBadDayDeregUnderWrite has the responder deregister the region a
// pending RDMA Write targets.
func TestBadDayDeregUnderWrite(t *testing.T) { deregUnderTransfer(t, false) }

// dumpStacks logs every goroutine's stack and, for each thread of the
// process, the kernel's stack and wait channel: what a hung call waits
// on.
func dumpStacks(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		dir := "/proc/self/task/" + task.Name()
		comm, _ := os.ReadFile(dir + "/comm")
		wchan, _ := os.ReadFile(dir + "/wchan")
		stack, _ := os.ReadFile(dir + "/stack")
		if len(stack) == 0 && string(wchan) == "0" {
			continue
		}
		t.Logf("thread %s (%s) wchan %s:\n%s", task.Name(), strings.TrimSpace(string(comm)), wchan, stack)
	}
}

// closeOrder is the order in which a case tears its rig down.
type closeOrder int

const (
	// connsFirst closes the connections, then destroys the QPs, the
	// CQs, the region and the PD, and closes the context.
	connsFirst closeOrder = iota
	// peerLater closes A's connection and QP with the link down, and
	// B's only once the link is up again.
	peerLater
	// qpsFirst destroys the QPs before closing their connections.
	qpsFirst
	// contextFirst closes the context, which destroys what is made on
	// it, and then the connections.
	contextFirst
	// together closes both connections at once, from two goroutines.
	together
)

// closeDownCase is one way a user ends a connection whose link is down.
type closeDownCase struct {
	name string
	// load posts what is outstanding when the link goes down; post
	// runs after the link went down.
	load, post func(t *testing.T, r *badRig, mrA, mrB *verbs.MR)
	// upFirst brings the link up before anything is closed.
	upFirst bool
	order   closeOrder
	// oneDevice runs the case on one device only: the two-device rig
	// is slow in the VM, and its link down cuts the same paths.
	oneDevice bool
}

// postRecvs posts two receives on each QP, in its own region (mrA
// and mrB may be one region).
func postRecvs(t *testing.T, r *badRig, mrA, mrB *verbs.MR) {
	for i := range 4 {
		q, mr := r.qpA, mrA
		if i >= 2 {
			q, mr = r.qpB, mrB
		}
		if _, err := q.PostRecv([]verbs.RecvWR{{WRID: uint64(10 + i), SGList: []verbs.SGE{mr.SGE(4096*i, 4096)}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// postSends posts Sends from A to B; with the link down they are
// retried, completed or failed, whatever the device does.
func postSends(t *testing.T, r *badRig, mrA, _ *verbs.MR) {
	for i := range 4 {
		if _, err := r.qpA.PostSend([]verbs.SendWR{{WRID: uint64(20 + i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{mrA.SGE(64*i, 64)}}}); err != nil {
			t.Fatalf("PostSend with the link down: %v", err)
		}
	}
}

// postRead posts an RDMA Read of the second half of B's region into
// the first half of A's: large enough to be under way when the link goes
// down.
func postRead(t *testing.T, r *badRig, mrA, mrB *verbs.MR) {
	half := mrA.Len() / 2
	if _, err := r.qpA.PostSend([]verbs.SendWR{{WRID: 30, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{mrA.SGE(0, half)}, RemoteAddr: mrB.Addr() + uint64(half), RKey: mrB.RKey()}}); err != nil {
		t.Fatal(err)
	}
}

var closeDownCases = []closeDownCase{
	{name: "Idle"},
	{name: "Outstanding", load: postRecvs, post: postSends, oneDevice: true},
	{name: "ReadPending", load: postRead},
	{name: "ReadPendingUpFirst", load: postRead, upFirst: true, oneDevice: true},
	{name: "PeerLater", load: postRecvs, post: postSends, order: peerLater},
	{name: "QPsFirst", load: postRecvs, post: postSends, order: qpsFirst, oneDevice: true},
	{name: "ContextFirst", load: postRead, order: contextFirst, oneDevice: true},
	{name: "Together", load: postRecvs, post: postSends, order: together},
}

// resourceCounts is the device's line of `rdma resource show`: the
// count of each kind of kernel object on it.
func resourceCounts(t *testing.T, dev string) map[string]string {
	t.Helper()
	out, err := exec.Command("rdma", "resource", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("rdma resource show: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || strings.TrimSuffix(f[1], ":") != dev {
			continue
		}
		counts := map[string]string{}
		for i := 2; i+1 < len(f); i += 2 {
			counts[f[i]] = f[i+1]
		}
		return counts
	}
	t.Fatalf("rdma resource show lists no %s: %s", dev, out)
	return nil
}

// cmBaseline is the count of kernel objects of the devices of A (which
// reaches B's address through its own) and B (which listens on its own)
// once rdma_cm has bound an id to each and let it go: librdmacm keeps a
// context of its own on each device it has bound ids to, for the life
// of the process.
func cmBaseline(t *testing.T, dA, dB *badDevice) []map[string]string {
	t.Helper()
	deadline := time.Now().Add(badBound)
	for {
		// The device's GIDs follow its address a moment after it is
		// made: until then rdma_cm routes the address to no device.
		dev, err := cm.Device("rdma://" + dB.host + ":1")
		if err == nil && dev == dA.name {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rdma_cm does not route %s to %s within %v: %q, %v", dB.host, dA.name, badBound, dev, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	counts := []map[string]string{resourceCounts(t, dA.name)}
	if dB != dA {
		l, err := cm.Listen(fmt.Sprintf("rdma://%s:%d", dB.host, 19000+os.Getpid()%500*4+int(badPort.Add(1))))
		if err != nil {
			t.Fatalf("listen on %s: %v", dB.host, err)
		}
		l.Close()
		counts = append(counts, resourceCounts(t, dB.name))
	}
	return counts
}

// TestBadDayCloseWithPortDown takes the link down under a connection
// (idle, with receives and Sends outstanding, with an RDMA Read under
// way) and tears everything down while it is down, then brings it up:
// in a user's order (the connections, the QPs, the CQs, the regions,
// the PDs, the contexts), QPs before connections, the contexts first,
// both connections at once, or one side with the link down and the
// other once it is up; or brings the link up first. Every call returns
// within badBound (else the case prints every goroutine's and thread's
// stack), and the devices' kernel objects are back to their count
// before the connection was made.
//
// OneDevice has both QPs on one device, whose packets to its own
// address rxe loops back without the link; TwoDevices has them on the
// two ends of a veth pair, and A's end goes down: what A sends,
// rdma_cm's disconnect request included, no longer reaches B, as
// between two hosts. In Together the two disconnect requests cross: an
// rdma_cm id destroyed then can block the kernel's ib_cm for ever (Linux
// 6.1), which Close avoids by waiting for the disconnect to end first.
func TestBadDayCloseWithPortDown(t *testing.T) {
	for _, two := range []bool{false, true} {
		name := "OneDevice"
		if two {
			name = "TwoDevices"
		}
		t.Run(name, func(t *testing.T) {
			for _, c := range closeDownCases {
				if two && c.oneDevice {
					continue
				}
				t.Run(c.name, func(t *testing.T) { closeWithPortDown(t, c, two) })
			}
		})
	}
}

func closeWithPortDown(t *testing.T, c closeDownCase, two bool) {
	var dA, dB *badDevice
	if two {
		dA, dB = newBadPair(t)
	} else {
		dA = newBadDevice(t)
		dB = dA
	}
	before := cmBaseline(t, dA, dB)
	r := connectBetween(t, dA, dB)
	const access = verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	mrA, err := r.pd.AllocMR(4<<20, access)
	if err != nil {
		t.Fatal(err)
	}
	mrB := mrA
	if two {
		if mrB, err = r.pdB.AllocMR(4<<20, access); err != nil {
			t.Fatal(err)
		}
	}
	if c.load != nil {
		c.load(t, r, mrA, mrB)
	}
	run(t, "ip", "link", "set", dA.netdev, "down")
	if c.post != nil {
		c.post(t, r, mrA, mrB)
	}
	r.waitEvent(t, driver.EventPortErr)
	up := func() {
		run(t, "ip", "link", "set", dA.netdev, "up")
		dA.routeOverLink(t)
		dB.routeOverLink(t)
	}
	if c.upFirst {
		up()
		r.waitEvent(t, driver.EventPortActive)
	}
	step := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			// Once the context is closed, what was made on it is
			// gone: its own destroys find it closed.
			if err != nil && !(c.order == contextFirst && errors.Is(err, verbs.ErrClosed)) {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(badBound):
			dumpStacks(t)
			t.Fatalf("%s did not return within %v", what, badBound)
		}
	}
	switch c.order {
	case connsFirst:
		step("close connection A", r.connA.Close)
		step("close connection B", r.connB.Close)
	case together:
		step("close both connections at once", func() error {
			errB := make(chan error, 1)
			go func() { errB <- r.connB.Close() }()
			return errors.Join(r.connA.Close(), <-errB)
		})
	case peerLater:
		step("close connection A", r.connA.Close)
		step("destroy QP A", r.qpA.Destroy)
		if !c.upFirst {
			up()
			r.waitEvent(t, driver.EventPortActive)
		}
		step("close connection B", r.connB.Close)
	case contextFirst:
		step("close the context", r.ctx.Close)
		if two {
			step("close context B", r.ctxB.Close)
		}
		step("close connection A", r.connA.Close)
		step("close connection B", r.connB.Close)
	}
	if c.order != peerLater {
		step("destroy QP A", r.qpA.Destroy)
	}
	step("destroy QP B", r.qpB.Destroy)
	if c.order == qpsFirst {
		step("close connection A", r.connA.Close)
		step("close connection B", r.connB.Close)
	}
	step("destroy CQ A", r.cqA.Destroy)
	step("destroy CQ B", r.cqB.Destroy)
	step("deregister region A", mrA.Dereg)
	step("dealloc PD A", r.pd.Dealloc)
	step("close context A", r.ctx.Close)
	if two {
		step("deregister region B", mrB.Dereg)
		step("dealloc PD B", r.pdB.Dealloc)
		step("close context B", r.ctxB.Close)
	}
	if !c.upFirst && c.order != peerLater {
		up()
	}
	for i, d := range []*badDevice{dA, dB}[:len(before)] {
		after := resourceCounts(t, d.name)
		for k, v := range before[i] {
			if after[k] != v {
				t.Errorf("%s: %s %s after everything was closed, %s before the connection was made (%v, then %v)", d.name, k, after[k], v, before[i], after)
			}
		}
		t.Logf("%s: %v before, %v after", d.name, before[i], after)
	}
}

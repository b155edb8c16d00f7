package verbstest

import (
	"bufio"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Endpoints in another process. The test binary re-executes itself as the
// peer: PeerMain, called first thing from the provider's TestMain, turns
// the child into an endpoint that listens at the pair's address and obeys
// requests read from its standard input, one gob value per call.

const (
	envPeer   = "GOVERBS_VERBSTEST_PEER"
	envDevice = "GOVERBS_VERBSTEST_DEVICE"
	envAddr   = "GOVERBS_VERBSTEST_ADDR"
)

// request is one Endpoint call; only the fields its method uses are set.
type request struct {
	Method  string
	Opts    PairOptions
	I       int
	ID      int
	Off     int
	N       int
	Access  verbs.AccessFlags
	Data    []byte
	Send    []verbs.SendWR
	Recv    []verbs.RecvWR
	CQ      CQKind
	Timeout time.Duration
	Limit   uint32
	Event   verbs.EventType
	State   verbs.QPState
	Addr    string
	MWType  verbs.MWType
}

// response is an Endpoint call's result.
type response struct {
	Err      string
	Sentinel int // 1 + index in sentinels, or 0
	N        int
	Bool     bool
	Data     []byte
	Region   Region
	WCs      []verbs.WorkCompletion
	State    verbs.QPState
	Attr     verbs.DeviceAttr
	QPNums   []uint32
}

// sentinels are the errors that keep their identity across the process
// boundary, so that errors.Is works on a remote endpoint's errors.
var sentinels = []error{
	verbs.ErrInvalidArg, verbs.ErrUnsupported, verbs.ErrQueueFull, verbs.ErrInvalidState,
	verbs.ErrBusy, verbs.ErrClosed, verbs.ErrCQOverrun, verbs.ErrNoResources,
}

func encodeErr(err error, r *response) {
	if err == nil {
		return
	}
	r.Err = err.Error()
	for i, s := range sentinels {
		if errors.Is(err, s) {
			r.Sentinel = i + 1
			return
		}
	}
}

func (r *response) err() error {
	switch {
	case r.Err == "":
		return nil
	case r.Sentinel > 0 && r.Sentinel <= len(sentinels):
		return fmt.Errorf("peer: %s: %w", r.Err, sentinels[r.Sentinel-1])
	}
	return fmt.Errorf("peer: %s", r.Err)
}

// PeerMain makes this process a remote endpoint if it was started as one
// by SpawnPeer, and then exits; otherwise it returns at once. Call it
// first in the provider's TestMain.
func PeerMain() {
	if os.Getenv(envPeer) != "1" {
		return
	}
	os.Exit(servePeer(os.Getenv(envDevice), os.Getenv(envAddr), os.Stdin, os.Stdout))
}

// servePeer creates the endpoint from the first request (Method "new"),
// accepts its connections at addr, and serves requests until its input ends.
func servePeer(device, addr string, in io.Reader, out io.Writer) int {
	dec := gob.NewDecoder(bufio.NewReader(in))
	bw := bufio.NewWriter(out)
	enc := gob.NewEncoder(bw)
	reply := func(r *response) bool {
		return enc.Encode(r) == nil && bw.Flush() == nil
	}
	var first request
	if err := dec.Decode(&first); err != nil || first.Method != "new" {
		fmt.Fprintln(os.Stderr, "verbstest peer: expected a new request:", err)
		return 2
	}
	ep, err := NewLocal(device, first.Opts, true)
	if err != nil {
		reply(&response{Err: err.Error()})
		return 1
	}
	defer ep.Close()
	l, err := cm.Listen(addr)
	if err != nil {
		reply(&response{Err: err.Error()})
		return 1
	}
	accepted := make(chan error, 1)
	go func() {
		defer l.Close()
		accepted <- ep.Accept(l, first.Opts)
	}()
	// Tell the parent the listener is up, so that it may dial.
	if !reply(&response{}) {
		return 1
	}
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			return 0 // the parent closed our input: we are done
		}
		var resp response
		if req.Method == "accepted" {
			encodeErr(<-accepted, &resp)
		} else {
			call(ep, &req, &resp)
		}
		if !reply(&resp) {
			return 1
		}
	}
}

// call runs one request against a local endpoint.
func call(ep *Local, q *request, r *response) {
	var err error
	switch q.Method {
	case "attr":
		r.Attr = ep.Attr()
		for i := range ep.QPs {
			r.QPNums = append(r.QPNums, ep.QPNum(i))
		}
	case "newRegion":
		r.Region, err = ep.NewRegion(q.N, q.Access)
	case "newOtherPDRegion":
		r.Region, err = ep.NewOtherPDRegion(q.N, q.Access)
	case "qpEvent":
		r.N, r.Bool, err = ep.QPEvent(q.Event, q.Timeout)
	case "setQPState":
		err = ep.SetQPState(q.I, q.State)
	case "relisten":
		err = ep.Relisten(q.I, q.Addr)
	case "reaccepted":
		err = ep.Reaccepted()
	case "setQPAccess":
		err = ep.SetQPAccess(q.I, q.Access)
	case "writeRegion":
		err = ep.WriteRegion(q.ID, q.Off, q.Data)
	case "readRegion":
		r.Data, err = ep.ReadRegion(q.ID, q.Off, q.N)
	case "canaries":
		r.Bool, err = ep.CanariesIntact(q.ID)
	case "dereg":
		err = ep.DeregRegion(q.ID)
	case "deregContainer":
		err = ep.DeregContainer(q.ID)
	case "allocMW":
		r.N, err = ep.AllocMW(q.MWType)
	case "mwRKey":
		var k uint32
		k, err = ep.MWRKey(q.ID)
		r.N = int(k)
	case "deallocMW":
		err = ep.DeallocMW(q.ID)
	case "postSend":
		r.N, err = ep.PostSend(q.I, q.Send)
	case "postRecv":
		r.N, err = ep.PostRecv(q.I, q.Recv)
	case "postSRQRecv":
		r.N, err = ep.PostSRQRecv(q.Recv)
	case "completions":
		r.WCs, err = ep.Completions(q.CQ, q.N, q.Timeout)
	case "qpState":
		r.State, err = ep.QPState(q.I)
	case "armSRQLimit":
		err = ep.ArmSRQLimit(q.Limit)
	case "srqLimitEvent":
		r.Bool, err = ep.SRQLimitEvent(q.Timeout)
	default:
		err = fmt.Errorf("unknown method %q", q.Method)
	}
	encodeErr(err, r)
}

// remote is an Endpoint in a child process.
type remote struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	enc    *gob.Encoder
	dec    *gob.Decoder
	attr   verbs.DeviceAttr
	qpNums []uint32
	dead   bool
	waited chan struct{}
}

// SpawnPeer returns a Harness.Remote that runs B in a child process: the
// test binary itself, re-executed, whose TestMain calls PeerMain.
func SpawnPeer(device string) func(t testing.TB, opts PairOptions, addr string) (Endpoint, func(), error) {
	return func(t testing.TB, opts PairOptions, addr string) (Endpoint, func(), error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		// A race-enabled child would otherwise sleep a second at exit.
		gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
		cmd.Env = append(os.Environ(), envPeer+"=1", envDevice+"="+device, envAddr+"="+addr, "GORACE="+gorace)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		r := &remote{cmd: cmd, stdin: stdin, enc: gob.NewEncoder(stdin), dec: gob.NewDecoder(bufio.NewReader(stdout)), waited: make(chan struct{})}
		go func() {
			cmd.Wait()
			close(r.waited)
		}()
		if _, err := r.do(&request{Method: "new", Opts: opts}); err != nil {
			r.kill()
			return nil, nil, err
		}
		resp, err := r.do(&request{Method: "attr"})
		if err != nil {
			r.kill()
			return nil, nil, err
		}
		r.attr, r.qpNums = resp.Attr, resp.QPNums
		return r, r.kill, nil
	}
}

// do sends a request and waits for its response.
func (r *remote) do(q *request) (*response, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead {
		return nil, errors.New("peer process is gone")
	}
	if err := r.enc.Encode(q); err != nil {
		return nil, fmt.Errorf("peer process: %w", err)
	}
	var resp response
	if err := r.dec.Decode(&resp); err != nil {
		r.dead = true
		return nil, fmt.Errorf("peer process: %w", err)
	}
	return &resp, resp.err()
}

// PeerPID returns the process ID of e's process when e is an endpoint in
// a child process started by SpawnPeer, and 0 otherwise; tests that stop
// or signal the peer process use it.
func PeerPID(e Endpoint) int {
	if r, ok := e.(*remote); ok {
		return r.cmd.Process.Pid
	}
	return 0
}

// kill ends the child abruptly, as SIGKILL does, and reaps it.
func (r *remote) kill() {
	r.cmd.Process.Kill()
	<-r.waited
	r.mu.Lock()
	r.dead = true
	r.mu.Unlock()
}

// WaitAccepted waits until the child has accepted every connection.
func (r *remote) WaitAccepted() error {
	_, err := r.do(&request{Method: "accepted"})
	return err
}

func (r *remote) Attr() verbs.DeviceAttr { return r.attr }
func (r *remote) QPNum(i int) uint32     { return r.qpNums[i] }

func (r *remote) NewRegion(size int, access verbs.AccessFlags) (Region, error) {
	resp, err := r.do(&request{Method: "newRegion", N: size, Access: access})
	if err != nil {
		return Region{}, err
	}
	return resp.Region, nil
}

func (r *remote) NewOtherPDRegion(size int, access verbs.AccessFlags) (Region, error) {
	resp, err := r.do(&request{Method: "newOtherPDRegion", N: size, Access: access})
	if err != nil {
		return Region{}, err
	}
	return resp.Region, nil
}

func (r *remote) QPEvent(typ verbs.EventType, timeout time.Duration) (int, bool, error) {
	resp, err := r.do(&request{Method: "qpEvent", Event: typ, Timeout: timeout})
	if err != nil {
		return -1, false, err
	}
	return resp.N, resp.Bool, nil
}

func (r *remote) SetQPState(i int, s verbs.QPState) error {
	_, err := r.do(&request{Method: "setQPState", I: i, State: s})
	return err
}

func (r *remote) Relisten(i int, addr string) error {
	_, err := r.do(&request{Method: "relisten", I: i, Addr: addr})
	return err
}

func (r *remote) Reaccepted() error {
	_, err := r.do(&request{Method: "reaccepted"})
	return err
}

func (r *remote) SetQPAccess(i int, access verbs.AccessFlags) error {
	_, err := r.do(&request{Method: "setQPAccess", I: i, Access: access})
	return err
}

func (r *remote) WriteRegion(id, off int, data []byte) error {
	_, err := r.do(&request{Method: "writeRegion", ID: id, Off: off, Data: data})
	return err
}

func (r *remote) ReadRegion(id, off, n int) ([]byte, error) {
	resp, err := r.do(&request{Method: "readRegion", ID: id, Off: off, N: n})
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

func (r *remote) CanariesIntact(id int) (bool, error) {
	resp, err := r.do(&request{Method: "canaries", ID: id})
	if err != nil {
		return false, err
	}
	return resp.Bool, nil
}

func (r *remote) DeregRegion(id int) error {
	_, err := r.do(&request{Method: "dereg", ID: id})
	return err
}

func (r *remote) DeregContainer(id int) error {
	_, err := r.do(&request{Method: "deregContainer", ID: id})
	return err
}

func (r *remote) AllocMW(typ verbs.MWType) (int, error) {
	resp, err := r.do(&request{Method: "allocMW", MWType: typ})
	if err != nil {
		return 0, err
	}
	return resp.N, nil
}

func (r *remote) MWRKey(id int) (uint32, error) {
	resp, err := r.do(&request{Method: "mwRKey", ID: id})
	if err != nil {
		return 0, err
	}
	return uint32(resp.N), nil
}

func (r *remote) DeallocMW(id int) error {
	_, err := r.do(&request{Method: "deallocMW", ID: id})
	return err
}

func (r *remote) PostSend(i int, wrs []verbs.SendWR) (int, error) {
	resp, err := r.do(&request{Method: "postSend", I: i, Send: wrs})
	if resp == nil {
		return 0, err
	}
	return resp.N, err
}

func (r *remote) PostRecv(i int, wrs []verbs.RecvWR) (int, error) {
	resp, err := r.do(&request{Method: "postRecv", I: i, Recv: wrs})
	if resp == nil {
		return 0, err
	}
	return resp.N, err
}

func (r *remote) PostSRQRecv(wrs []verbs.RecvWR) (int, error) {
	resp, err := r.do(&request{Method: "postSRQRecv", Recv: wrs})
	if resp == nil {
		return 0, err
	}
	return resp.N, err
}

func (r *remote) Completions(cq CQKind, n int, timeout time.Duration) ([]verbs.WorkCompletion, error) {
	resp, err := r.do(&request{Method: "completions", CQ: cq, N: n, Timeout: timeout})
	if resp == nil {
		return nil, err
	}
	return resp.WCs, err
}

func (r *remote) QPState(i int) (verbs.QPState, error) {
	resp, err := r.do(&request{Method: "qpState", I: i})
	if err != nil {
		return 0, err
	}
	return resp.State, nil
}

func (r *remote) ArmSRQLimit(limit uint32) error {
	_, err := r.do(&request{Method: "armSRQLimit", Limit: limit})
	return err
}

func (r *remote) SRQLimitEvent(timeout time.Duration) (bool, error) {
	resp, err := r.do(&request{Method: "srqLimitEvent", Timeout: timeout})
	if err != nil {
		return false, err
	}
	return resp.Bool, nil
}

// Close ends the child in order: closing its input makes it tear its
// endpoint down and exit.
func (r *remote) Close() error {
	r.stdin.Close()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.waited:
	case <-t.C:
		r.kill()
		return errors.New("peer process did not exit: killed")
	}
	return nil
}

package ibverbs_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// envImmPeer names an rdma:// address where a peer that is not goverbs
// (interop/imm_peer.py, over rdma-core's pyverbs) waits for one Send with
// immediate data and prints the number its C API reads.
const envImmPeer = "GOVERBS_IBVERBS_IMM_PEER"

// immToPeer is the immediate data TestImmediateToPeer sends; its bytes
// differ, so a peer that reads it in the wrong byte order sees another
// number.
const immToPeer = 0x11223344

// TestImmediateToPeer sends immToPeer with a Send with immediate to the
// peer $GOVERBS_IBVERBS_IMM_PEER names, on the device
// $GOVERBS_IBVERBS_DEVICE; interop/ibverbs.sh checks what the peer read.
func TestImmediateToPeer(t *testing.T) {
	device, addr := os.Getenv(envDevice), os.Getenv(envImmPeer)
	if device == "" || addr == "" {
		t.Skipf("no peer: set %s and %s (interop/ibverbs.sh runs this in a VM against interop/imm_peer.py)", envDevice, envImmPeer)
	}
	vctx, err := verbs.Open(device)
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := vctx.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	msg := "goverbs immediate"
	mr, err := pd.AllocMR(len(msg), 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(mr.Bytes(), msg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := ep.Dial(ctx, addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := ep.QP().PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSendWithImm, Imm: immToPeer,
		Flags: verbs.SendSignaled, SGList: []verbs.SGE{mr.SGE(0, len(msg))}}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	n, err := cq.Wait(ctx, wc)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || wc[0].WRID != 1 || wc[0].Status != verbs.WCSuccess {
		t.Fatalf("Send with immediate completed %+v, want WRID 1 with success", wc[:n])
	}
}

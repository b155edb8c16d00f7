package verbs_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	_ "github.com/goverbs/goverbs/provider/iwarp"
	_ "github.com/goverbs/goverbs/provider/shm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestAtomicByteOrder holds loop0, shm0 and tcp0 to what the package
// documentation says of atomics: the target word is in the byte order of
// the host that holds it (encoding/binary.NativeEndian), and the previous
// value lands in the requester's 8-byte buffer in its host's byte order,
// at any alignment.
func TestAtomicByteOrder(t *testing.T) {
	for i, dev := range []string{"loop0", "shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			addr := map[string]string{
				"loop0": fmt.Sprintf("loop://atomic-order-%d", i),
				"shm0":  fmt.Sprintf("shm://@goverbs-atomic-order-%d", os.Getpid()),
				"tcp0":  "tcp://127.0.0.1:0",
			}[dev]
			tpd, _, tqp := verbstest.QPOn(t, dev, 4)
			pd, cq, qp := verbstest.QPOn(t, dev, 4)
			target, err := tpd.AllocMR(64, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
			if err != nil {
				t.Fatal(err)
			}
			local, err := pd.AllocMR(16, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			verbstest.Connect(t, addr, tqp, qp)
			word := target.Bytes()[8:16]
			binary.NativeEndian.PutUint64(word, 0x0102030405060708)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			wc := make([]verbs.WorkCompletion, 1)
			atomic := func(op verbs.Opcode, off int, compareAdd, swap uint64) {
				t.Helper()
				clear(local.Bytes())
				if _, err := qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: op, Flags: verbs.SendSignaled,
					SGList: []verbs.SGE{local.SGE(off, 8)}, RemoteAddr: target.Addr() + 8, RKey: target.RKey(),
					CompareAdd: compareAdd, Swap: swap}}); err != nil {
					t.Fatal(err)
				}
				if _, err := cq.Wait(ctx, wc); err != nil || wc[0].Status != verbs.WCSuccess {
					t.Fatalf("%v: %+v, %v", op, wc[0], err)
				}
			}
			atomic(verbs.OpAtomicFetchAndAdd, 3, 0x10, 0) // a local buffer at an odd offset
			if got := binary.NativeEndian.Uint64(local.Bytes()[3:]); got != 0x0102030405060708 {
				t.Errorf("FetchAndAdd returned %#x, want 0x0102030405060708 in host byte order", got)
			}
			if got := binary.NativeEndian.Uint64(word); got != 0x0102030405060718 {
				t.Errorf("after FetchAndAdd of 0x10 the word is %#x, want 0x0102030405060718", got)
			}
			atomic(verbs.OpAtomicCmpAndSwp, 0, 0x0102030405060718, 0x1122334455667788)
			if got := binary.NativeEndian.Uint64(local.Bytes()); got != 0x0102030405060718 {
				t.Errorf("CompareAndSwap returned %#x, want 0x0102030405060718", got)
			}
			if got := binary.NativeEndian.Uint64(word); got != 0x1122334455667788 {
				t.Errorf("after CompareAndSwap the word is %#x, want 0x1122334455667788", got)
			}
		})
	}
}

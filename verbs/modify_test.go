package verbs_test

import (
	"errors"
	"strings"
	"testing"

	_ "github.com/goverbs/goverbs/provider/loop"
	"github.com/goverbs/goverbs/verbs"
)

// TestModifyChecksPort: a Port the device does not have (ports are
// numbered from 1; loop0 has one) is refused with ErrInvalidArg naming
// the port, on Reset to Init and on Init to Init, and leaves the QP as it
// was; port 1 is taken.
func TestModifyChecksPort(t *testing.T) {
	ctx, err := verbs.Open("loop0")
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if n := ctx.QueryDevice().PhysPortCnt; n != 1 {
		t.Fatalf("loop0 reports %d ports, want 1", n)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	const mask = verbs.QPAttrState | verbs.QPAttrPort | verbs.QPAttrAccessFlags
	refused := func(port uint8) {
		t.Helper()
		before := qp.State()
		err := qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: port, AccessFlags: verbs.AccessLocalWrite}, mask)
		if !errors.Is(err, verbs.ErrInvalidArg) || !strings.Contains(err.Error(), "port") {
			t.Fatalf("Modify to Init on port %d from %v: %v, want ErrInvalidArg naming the port", port, before, err)
		}
		if s := qp.State(); s != before {
			t.Fatalf("a refused Modify moved the QP from %v to %v", before, s)
		}
	}
	refused(0)
	refused(2)
	refused(255)
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite}, mask); err != nil {
		t.Fatalf("Modify to Init on port 1: %v", err)
	}
	refused(2)
	if a, err := qp.Query(); err != nil || a.State != verbs.QPSInit || a.Port != 1 {
		t.Fatalf("after the refused Init to Init: %+v, %v; want INIT on port 1", a, err)
	}
}

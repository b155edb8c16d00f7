package cm_test

import (
	"context"
	"errors"
	"testing"

	"github.com/goverbs/goverbs/cm"
	_ "github.com/goverbs/goverbs/provider/loop"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestAcceptRefusesQPInWrongState: Accept with a QP outside Reset and
// Init is refused with ErrInvalidState before the provider is asked,
// and the request stays pending: accepted then with a QP in Reset, the
// connection is made.
func TestAcceptRefusesQPInWrongState(t *testing.T) {
	_, _, client := verbstest.QPOn(t, "loop0", 4)
	_, _, failed := verbstest.QPOn(t, "loop0", 4)
	_, _, server := verbstest.QPOn(t, "loop0", 4)
	if err := failed.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	l, err := cm.Listen("loop://accept-wrong-state")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed := make(chan error, 1)
	go func() {
		c, err := cm.Dial(context.Background(), "loop://accept-wrong-state", client, nil)
		if err == nil {
			defer c.Close()
		}
		dialed <- err
	}()
	req, err := l.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := req.Accept(failed, nil); !errors.Is(err, verbs.ErrInvalidState) {
		t.Fatalf("Accept with a QP in Err returned %v, want an error wrapping %q", err, verbs.ErrInvalidState)
	}
	if s := failed.State(); s != verbs.QPSErr {
		t.Fatalf("the refused QP is in %v, want ERR", s)
	}
	c, err := req.Accept(server, nil)
	if err != nil {
		t.Fatalf("Accept with a QP in Reset after the refusal: %v", err)
	}
	defer c.Close()
	if err := <-dialed; err != nil {
		t.Fatalf("Dial: %v", err)
	}
}

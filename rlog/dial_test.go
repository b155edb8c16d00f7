package rlog

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	_ "github.com/goverbs/goverbs/provider/iwarp"
)

// TestDialRefusedFailsAtOnce: when nothing listens at any member's
// address, Dial returns at once, long before its context ends, with an
// error wrapping both cm.ErrRefused and ErrUnavailable, as cm.Dial and
// kv.Dial do.
func TestDialRefusedFailsAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	addrs := []string{
		fmt.Sprintf("shm://@goverbs-rlog-nobody-%d", os.Getpid()),
		"tcp://" + free,
		fmt.Sprintf("loop://rlog-nobody-%d", os.Getpid()),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := Dial(ctx, addrs...)
	if err == nil {
		c.Close()
		t.Fatal("Dial succeeded with nothing listening")
	}
	if !errors.Is(err, cm.ErrRefused) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Dial: %v, want an error wrapping cm.ErrRefused and ErrUnavailable", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Dial returned only when its context ended: %v", err)
	}
}

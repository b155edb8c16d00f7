package rsock

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
)

// TestMain fails the package's tests if they leave a goroutine behind.
// Run with RSOCK_DIAL_AND_HANG set, the test binary is instead a peer
// that dials that address, writes "ready" and waits to be killed.
func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	if addr := os.Getenv("RSOCK_DIAL_AND_HANG"); addr != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := Dial(ctx, addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c.Write([]byte("ready"))
		select {}
	}
	goleak.VerifyTestMain(m)
}

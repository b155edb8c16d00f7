package perftest

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
)

// TestMain fails the package's tests if they leave a goroutine behind.
func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	goleak.VerifyTestMain(m)
}

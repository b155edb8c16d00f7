package rsock

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if they leave a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

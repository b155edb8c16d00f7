package verbs_test

import (
	"os"
	"testing"

	"github.com/goverbs/goverbs/internal/listenwait"
)

func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	os.Exit(m.Run())
}

package listenwait

import (
	"testing"
	"time"
)

// TestSetRestores: Timeout is Default until Set, what Set gave after it,
// and what it was before once Set's restore has run.
func TestSetRestores(t *testing.T) {
	if got := Timeout(); got != Default {
		t.Fatalf("Timeout() = %v before any Set, want Default (%v)", got, Default)
	}
	restore := Set(TestTimeout)
	if got := Timeout(); got != TestTimeout {
		t.Fatalf("Timeout() = %v after Set(%v)", got, TestTimeout)
	}
	inner := Set(300 * time.Millisecond)
	if got := Timeout(); got != 300*time.Millisecond {
		t.Fatalf("Timeout() = %v after Set(300ms)", got)
	}
	inner()
	if got := Timeout(); got != TestTimeout {
		t.Fatalf("Timeout() = %v after the inner restore, want %v", got, TestTimeout)
	}
	restore()
	if got := Timeout(); got != Default {
		t.Fatalf("Timeout() = %v after the outer restore, want Default (%v)", got, Default)
	}
}

package verbs

import "testing"

func TestReceived(t *testing.T) {
	buf := make([]byte, 16)
	for _, tc := range []struct {
		n  uint32
		ok bool
	}{{0, true}, {16, true}, {17, false}, {^uint32(0), false}} {
		b, err := Received(&WorkCompletion{ByteLen: tc.n}, buf)
		if (err == nil) != tc.ok || (tc.ok && len(b) != int(tc.n)) {
			t.Errorf("Received(%d bytes, 16-byte buffer) = %d bytes, %v", tc.n, len(b), err)
		}
	}
}

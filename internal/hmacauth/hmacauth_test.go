package hmacauth

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// TestSumIsHMACSHA256: Sum is HMAC-SHA256 of the label and parts
// concatenated, checked against RFC 4231's test case 2, split between
// the label and two parts.
func TestSumIsHMACSHA256(t *testing.T) {
	want, _ := hex.DecodeString("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
	for _, parts := range [][][]byte{
		nil,
		{[]byte(" ya want ")},
		{[]byte(" ya"), []byte(" want ")},
	} {
		label := "what do"
		if parts == nil {
			label = "what do ya want "
		}
		got := Sum([]byte("Jefe"), label, append(parts, []byte("for nothing?"))...)
		if !bytes.Equal(got, want) {
			t.Errorf("Sum with label %q and %d parts = %x, want RFC 4231's %x", label, len(parts)+1, got, want)
		}
	}
}

// TestCheckRefusesEveryChange: Check takes the MAC Sum made and refuses
// it under another secret, label or part, and refuses a MAC that is
// truncated, extended or has any one bit flipped.
func TestCheckRefusesEveryChange(t *testing.T) {
	secret := []byte("a secret of sixteen+ bytes")
	na, nd := make([]byte, NonceLen), make([]byte, NonceLen)
	NewNonce(na)
	NewNonce(nd)
	if bytes.Equal(na, nd) {
		t.Fatalf("two nonces are equal: %x", na)
	}
	mac := Sum(secret, "label", na, nd)
	if len(mac) != MACLen {
		t.Fatalf("a MAC of %d bytes, want %d", len(mac), MACLen)
	}
	if !Check(mac, secret, "label", na, nd) {
		t.Fatal("Check refuses the MAC Sum made")
	}
	for name, ok := range map[string]bool{
		"another secret":      Check(mac, []byte("a secret of sixteen+ byteS"), "label", na, nd),
		"another label":       Check(mac, secret, "labeL", na, nd),
		"nonces swapped":      Check(mac, secret, "label", nd, na),
		"a part left out":     Check(mac, secret, "label", na),
		"truncated":           Check(mac[:MACLen-1], secret, "label", na, nd),
		"extended":            Check(append(append([]byte(nil), mac...), 0), secret, "label", na, nd),
		"empty":               Check(nil, secret, "label", na, nd),
		"secret as MAC input": Check(secret, secret, "label", na, nd),
	} {
		if ok {
			t.Errorf("%s: Check takes it", name)
		}
	}
	for i := range MACLen * 8 {
		m := append([]byte(nil), mac...)
		m[i/8] ^= 1 << (i % 8)
		if Check(m, secret, "label", na, nd) {
			t.Fatalf("Check takes the MAC with bit %d flipped", i)
		}
	}
}

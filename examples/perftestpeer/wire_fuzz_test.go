package main

import (
	"strconv"
	"testing"
)

// FuzzVersion: any 16 bytes a peer sends as its version are refused or
// give a version within the range this program speaks.
func FuzzVersion(f *testing.F) {
	f.Add(encodeVersion("6.06"))
	f.Add(encodeVersion("6.25"))
	f.Add(encodeVersion("NaN"))
	f.Add(make([]byte, versionLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := checkVersion(b)
		if err != nil {
			return
		}
		x, perr := strconv.ParseFloat(v, 64)
		if perr != nil || !(x >= minVersion && x <= maxVersion) {
			t.Fatalf("accepted version %q from %q", v, b)
		}
	})
}

// FuzzDest: a handshake decodes to what encodes to the same fields
// perftest reads.
func FuzzDest(f *testing.F) {
	f.Add(make([]byte, destLen))
	f.Add(dest{qpn: 7, rkey: 0x1234, vaddr: 1 << 40}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) != destLen {
			return
		}
		d := decodeDest(b)
		if e := decodeDest(d.encode()); !e.same(d) {
			t.Fatalf("%v decodes, encodes and decodes to %v", d, e)
		}
	})
}

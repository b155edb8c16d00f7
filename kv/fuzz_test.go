package kv

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// The decoders of what peers send or expose: requests (a client's, read
// by the server), replies, grants of keys and the index description (the
// server's, read by a client), and index slots and heap records (the server's memory,
// read by a client with RDMA Reads that may be torn). None panics on any
// input, and whatever one accepts re-encodes to the same bytes.

func FuzzRequest(f *testing.F) {
	b := make([]byte, 512)
	f.Add(b[:putRequest(b, opPut, 7, []byte("key"), []byte("value"))])
	f.Add(b[:putRequest(b, opDel, 1<<60, []byte("k"), nil)])
	f.Add([]byte{opGet, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := request(data)
		if !r.valid() {
			return
		}
		key, val := r.key(), r.val()
		if len(key) > MaxKey || requestHeader+len(key)+len(val) != len(data) {
			t.Fatalf("valid request of %d bytes has a %d-byte key and a %d-byte value", len(data), len(key), len(val))
		}
		out := make([]byte, len(data))
		n := putRequest(out, r.op(), r.id(), key, val)
		want := bytes.Clone(data)
		want[1] = 0 // reserved
		if !bytes.Equal(out[:n], want) {
			t.Fatalf("request re-encodes as %x, want %x", out[:n], want)
		}
	})
}

func FuzzReply(f *testing.F) {
	b := make([]byte, 512)
	f.Add(b[:putReply(b, statusOK, 9, []byte("value"))])
	f.Add(b[:putReply(b, statusNotFound, 1, nil)])
	f.Fuzz(func(t *testing.T, data []byte) {
		r := reply(data)
		if !r.valid() {
			return
		}
		out := make([]byte, len(data))
		n := putReply(out, r.status(), r.id(), r.val())
		want := bytes.Clone(data)
		clear(want[1:4]) // reserved
		if !bytes.Equal(out[:n], want) {
			t.Fatalf("reply re-encodes as %x, want %x", out[:n], want)
		}
	})
}

func FuzzGrant(f *testing.F) {
	b := make([]byte, grantHeader+4*maxHeapRegions)
	f.Add(b[:putGrant(b, true, 0x1234, []uint32{1, 2, 3})])
	f.Add(b[:putGrant(b, false, 7, make([]uint32, maxHeapRegions))])
	f.Add(make([]byte, grantHeader+4*(maxHeapRegions+1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := grant(data)
		if !g.valid() {
			return
		}
		if n := g.heapRegions(); n < 1 || n > maxHeapRegions {
			t.Fatalf("valid grant of %d bytes names %d heap regions", len(data), n)
		}
		heap := make([]uint32, g.heapRegions())
		for i := range heap {
			heap[i] = g.heapKey(i)
		}
		out := make([]byte, len(data))
		n := putGrant(out, g.windows(), g.indexKey(), heap)
		want := bytes.Clone(data)
		binary.LittleEndian.PutUint32(want, binary.LittleEndian.Uint32(want)&grantWindows) // other flags are reserved
		if !bytes.Equal(out[:n], want) {
			t.Fatalf("grant re-encodes as %x, want %x", out[:n], want)
		}
	})
}

func FuzzIndexInfo(f *testing.F) {
	f.Add([]byte(indexInfo{slotsPerBucket: 4, buckets: 1024, maxMsg: 1 << 16, addr: 1 << 40}.encode(9, []byte("sixteen byte nonce"))))
	f.Add(make([]byte, infoLen))
	f.Fuzz(func(t *testing.T, data []byte) {
		i, canon, err := decodeInfo(data)
		if err != nil {
			return
		}
		if i.slotsPerBucket < 1 || i.slotsPerBucket > 64 || i.buckets < 1 ||
			i.maxMsg < requestHeader+MaxKey || i.maxMsg > requestHeader+MaxKey+MaxValueLimit {
			t.Fatalf("decodeInfo accepted %+v", i)
		}
		if !bytes.Equal(canon, data[:infoLen]) {
			t.Fatalf("the canonical acceptance is %x, not the %d bytes sent, %x", canon, infoLen, data)
		}
		if got := i.encode(binary.LittleEndian.Uint32(data[28:]), data[32:infoLen]); !bytes.Equal(got, canon) {
			t.Fatalf("info re-encodes as %x, want %x", got, canon)
		}
	})
}

// FuzzHello: a connection request, as the server reads it from whatever
// a peer sent, is a prefix of what was sent that names an identity of at
// most MaxIdentity bytes, the length its header states.
func FuzzHello(f *testing.F) {
	f.Add([]byte(encodeHello(7, []byte("identity"))))
	f.Add([]byte(encodeHello(7, make([]byte, MaxIdentity))))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h := hello(data).canonical()
		if h == nil {
			return
		}
		if id := h.identity(); len(id) > MaxIdentity || len(id) != int(data[6]) {
			t.Fatalf("an identity of %d bytes from a request that states %d", len(id), data[6])
		}
		if len(h) > maxHelloLen || !bytes.Equal(h, data[:len(h)]) {
			t.Fatalf("the canonical request %x is not a prefix of what was sent, %x", h, data)
		}
	})
}

// FuzzSlotAndRecord: a slot and a record as a client reads them. One it
// takes for consistent yields its key and value inside what was read;
// the slot and record the server writes for that key and value are
// consistent.
func FuzzSlotAndRecord(f *testing.F) {
	s := slot(make([]byte, SlotSize))
	s.setInline(3, hashKey([]byte("k")), []byte("k"), []byte("v"))
	r := record(make([]byte, recordLen(1, 100)))
	r.set(3, []byte("k"), bytes.Repeat([]byte{1}, 100))
	f.Add([]byte(s), []byte(r))
	s.setHeap(4, 5, 1, 100, 1<<30, len(r), 9)
	f.Add([]byte(s), []byte(r))
	f.Add(make([]byte, SlotSize), []byte{})
	f.Fuzz(func(t *testing.T, sb, rb []byte) {
		s := slot(make([]byte, SlotSize))
		copy(s, sb)
		if s.valid() && s.kind() == kindInline {
			key, val := s.inline()
			if len(key)+len(val) > InlineCap {
				t.Fatalf("a valid inline slot holds %d bytes, more than %d", len(key)+len(val), InlineCap)
			}
		}
		rec := record(rb)
		if rec.intact() {
			key, val := rec.key(), rec.val()
			if recordHeader+len(key)+len(val) > len(rb) {
				t.Fatalf("an intact record of %d bytes holds a %d-byte key and a %d-byte value", len(rb), len(key), len(val))
			}
			if rec.valid(s) != (rec.version() == s.version() && rec.keyLen() == s.keyLen() && rec.valLen() == s.valLen()) {
				t.Fatal("an intact record's validity against a slot is not its version and lengths matching")
			}
		}

		// What the server writes for a key and value from the input is
		// consistent.
		k := sb[:min(len(sb), MaxKey)]
		v := rb
		ver := binary.LittleEndian.Uint64(append(bytes.Clone(sb), make([]byte, 8)...))
		if len(k)+len(v) <= InlineCap {
			w := slot(make([]byte, SlotSize))
			w.setInline(ver, hashKey(k), k, v)
			gk, gv := w.inline()
			if !w.valid() || !bytes.Equal(gk, k) || !bytes.Equal(gv, v) {
				t.Fatalf("an inline slot written for a %d-byte key and a %d-byte value reads back wrong", len(k), len(v))
			}
		}
		w := record(make([]byte, recordLen(len(k), len(v))))
		w.set(ver, k, v)
		h := slot(make([]byte, SlotSize))
		h.setHeap(ver, hashKey(k), len(k), len(v), 1<<30, len(w), 1)
		if !w.intact() || !h.valid() || !w.valid(h) || !bytes.Equal(w.key(), k) || !bytes.Equal(w.val(), v) {
			t.Fatalf("a record written for a %d-byte key and a %d-byte value reads back wrong", len(k), len(v))
		}
	})
}

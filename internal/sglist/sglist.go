// Package sglist holds a scatter/gather list resolved to memory, and
// copies between two such lists directly, segment by segment, with no
// staging buffer. A List is a value meant to live on the stack: it
// allocates nothing.
package sglist

// Max is the most segments a List holds.
const Max = 32

// List is a resolved scatter/gather list.
type List struct {
	n   int // first, in the line of the first segments
	seg [Max][]byte
}

// Reset empties the list.
func (l *List) Reset() { l.n = 0 }

// Add appends a segment; false if the list is full.
func (l *List) Add(b []byte) bool {
	if l.n == Max {
		return false
	}
	l.seg[l.n] = b
	l.n++
	return true
}

// One makes the list the single segment b.
func (l *List) One(b []byte) {
	l.seg[0] = b
	l.n = 1
}

// Len is the total length of the list.
func (l *List) Len() uint64 {
	var n uint64
	for i := 0; i < l.n; i++ {
		n += uint64(len(l.seg[i]))
	}
	return n
}

// Copy copies src into dst in order until either ends and returns the
// number of bytes copied.
func Copy(dst, src *List) int {
	total := 0
	di, doff := 0, 0
	for si := 0; si < src.n; si++ {
		s := src.seg[si]
		for len(s) > 0 && di < dst.n {
			n := copy(dst.seg[di][doff:], s)
			s = s[n:]
			doff += n
			total += n
			if doff == len(dst.seg[di]) {
				di, doff = di+1, 0
			}
		}
	}
	return total
}

// Fill copies b into the list in order until either ends and returns the
// number of bytes copied: Copy from a single segment, without building a
// List for it.
func (l *List) Fill(b []byte) int {
	total := 0
	for i := 0; i < l.n && len(b) > 0; i++ {
		n := copy(l.seg[i], b)
		b = b[n:]
		total += n
	}
	return total
}

// Seg returns segment i.
func (l *List) Seg(i int) []byte { return l.seg[i] }

// N is the number of segments.
func (l *List) N() int { return l.n }

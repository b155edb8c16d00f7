package mempool_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/goverbs/goverbs/mempool"
	_ "github.com/goverbs/goverbs/provider/loop"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

// countingDriver wraps the loop provider and counts memory registrations,
// so that a test can show the pool registers only at New.
type countingDriver struct{ inner driver.Driver }

var registrations atomic.Int64

type countingCtx struct{ driver.Context }
type countingPD struct{ driver.PD }

func (d countingDriver) Devices() []driver.DeviceInfo {
	return []driver.DeviceInfo{{Name: "count0", Provider: "count", Transport: "loop"}}
}

func (d countingDriver) Open(string) (driver.Context, error) {
	c, err := d.inner.Open("loop0")
	return countingCtx{c}, err
}

func (c countingCtx) AllocPD() (driver.PD, error) {
	p, err := c.Context.AllocPD()
	return countingPD{p}, err
}

func (p countingPD) AllocMR(size int, a driver.AccessFlags) (driver.MR, error) {
	registrations.Add(1)
	return p.PD.AllocMR(size, a)
}

func (p countingPD) RegMR(b []byte, a driver.AccessFlags) (driver.MR, error) {
	registrations.Add(1)
	return p.PD.RegMR(b, a)
}

func init() {
	loop, _ := verbs.LookupDriver("loop")
	verbs.Register("count", countingDriver{loop})
}

func newPool(t testing.TB, classes ...mempool.Class) (*mempool.Pool, *verbs.PD) {
	t.Helper()
	ctx, err := verbs.Open("count0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	p, err := mempool.New(pd, mempool.Config{Classes: classes, Access: verbs.AccessLocalWrite | verbs.AccessRemoteRead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, pd
}

func TestSizeClassesAndKeys(t *testing.T) {
	p, _ := newPool(t, mempool.Class{Size: 4096, Count: 2}, mempool.Class{Size: 64, Count: 4})
	small, err := p.Get(10)
	if err != nil || small.Len() != 64 {
		t.Fatalf("Get(10) = %d bytes, %v; want a 64-byte buffer", small.Len(), err)
	}
	big, err := p.Get(65)
	if err != nil || big.Len() != 4096 {
		t.Fatalf("Get(65) = %d bytes, %v; want a 4096-byte buffer", big.Len(), err)
	}
	if _, err := p.Get(4097); !errors.Is(err, mempool.ErrTooLarge) {
		t.Fatalf("Get(4097) error %v, want ErrTooLarge", err)
	}
	for _, b := range []mempool.Buf{small, big} {
		mr := b.MR()
		if b.LKey() != mr.LKey() || b.RKey() != mr.RKey() {
			t.Fatalf("buffer keys %#x/%#x, region keys %#x/%#x", b.LKey(), b.RKey(), mr.LKey(), mr.RKey())
		}
		if b.Addr() != mr.Addr()+uint64(b.Off()) || b.Off()+b.Len() > mr.Len() {
			t.Fatalf("buffer at %#x+%d outside its region %#x+%d", b.Addr(), b.Len(), mr.Addr(), mr.Len())
		}
		sge := b.SGE(b.Len())
		if sge.Addr != b.Addr() || sge.LKey != b.LKey() || int(sge.Length) != b.Len() {
			t.Fatalf("SGE %+v does not describe the buffer", sge)
		}
		copy(b.Bytes(), "x")
		if &b.Bytes()[0] != &mr.Bytes()[b.Off()] {
			t.Fatal("Bytes is not the region's memory at the buffer's offset")
		}
	}
	if err := p.Put(small); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(small); !errors.Is(err, mempool.ErrNotInUse) {
		t.Fatalf("second Put error %v, want ErrNotInUse", err)
	}
	if err := p.Put(mempool.Buf{}); !errors.Is(err, mempool.ErrNotInUse) {
		t.Fatalf("Put of the zero Buf error %v, want ErrNotInUse", err)
	}
}

func TestExhaustionFallsBackToLargerClass(t *testing.T) {
	p, _ := newPool(t, mempool.Class{Size: 64, Count: 1}, mempool.Class{Size: 128, Count: 1})
	a, err1 := p.Get(8)
	b, err2 := p.Get(8)
	if err1 != nil || err2 != nil || a.Len() != 64 || b.Len() != 128 {
		t.Fatalf("two Get(8): %d %v, %d %v; want 64 then 128", a.Len(), err1, b.Len(), err2)
	}
	if _, err := p.Get(8); !errors.Is(err, mempool.ErrExhausted) {
		t.Fatalf("third Get error %v, want ErrExhausted", err)
	}
	p.Put(a)
	if c, err := p.Get(8); err != nil || c.Off() != a.Off() || c.Len() != 64 {
		t.Fatalf("Get after Put: %v, offset %d; want the freed buffer", err, c.Off())
	}
}

// TestNoRegistrationOnDataPath: registrations happen at New only, one per
// class, however many buffers are taken and returned, concurrently.
func TestNoRegistrationOnDataPath(t *testing.T) {
	before := registrations.Load()
	p, _ := newPool(t, mempool.Class{Size: 64, Count: 64}, mempool.Class{Size: 1024, Count: 16})
	if n := registrations.Load() - before; n != 2 {
		t.Fatalf("New registered %d regions, want 2 (one per class)", n)
	}
	atNew := registrations.Load()
	var wg sync.WaitGroup
	var inUse sync.Map
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				b, err := p.Get(1 + (g*31+i)%1024)
				if err != nil {
					continue // exhausted under contention is fine
				}
				if _, dup := inUse.LoadOrStore(b.Addr(), true); dup {
					t.Errorf("buffer %#x handed out twice", b.Addr())
				}
				b.Bytes()[0] = byte(i)
				inUse.Delete(b.Addr())
				if err := p.Put(b); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if n := registrations.Load() - atNew; n != 0 {
		t.Fatalf("the data path registered %d regions, want 0", n)
	}
	for _, s := range p.Stats() {
		if s.Free != s.Count {
			t.Fatalf("class %d: %d of %d free after every buffer was put back", s.Size, s.Free, s.Count)
		}
	}
}

func TestGetPutAllocatesNothing(t *testing.T) {
	p, _ := newPool(t, mempool.Class{Size: 256, Count: 8})
	allocs := testing.AllocsPerRun(1000, func() {
		b, err := p.Get(100)
		if err != nil {
			t.Fatal(err)
		}
		_ = b.SGE(100)
		p.Put(b)
	})
	if allocs != 0 {
		t.Fatalf("Get+Put allocate %v times, want 0", allocs)
	}
}

func BenchmarkGetPut(b *testing.B) {
	p, _ := newPool(b, mempool.Class{Size: 256, Count: 8})
	b.ReportAllocs()
	for b.Loop() {
		buf, _ := p.Get(100)
		p.Put(buf)
	}
}

// TestStalePutRefused: a copy of a buffer, put after the buffer was put
// and handed out again, is refused: the buffer's new owner keeps it, and
// it is not handed out twice.
func TestStalePutRefused(t *testing.T) {
	p, _ := newPool(t, mempool.Class{Size: 64, Count: 1})
	b1, err := p.Get(64)
	if err != nil {
		t.Fatal(err)
	}
	stale := b1
	if err := p.Put(b1); err != nil {
		t.Fatal(err)
	}
	b2, err := p.Get(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Put(stale); !errors.Is(err, mempool.ErrNotInUse) {
		t.Fatalf("Put of a stale copy: %v, want ErrNotInUse", err)
	}
	if _, err := p.Get(64); !errors.Is(err, mempool.ErrExhausted) {
		t.Fatalf("Get with the only buffer in use: %v, want ErrExhausted", err)
	}
	if err := p.Put(b2); err != nil {
		t.Fatalf("Put by the buffer's owner: %v", err)
	}
}

// TestClassTooLargeRefused: a class whose bytes do not fit an int is
// refused, not registered with an overflowed size.
func TestClassTooLargeRefused(t *testing.T) {
	ctx, err := verbs.Open("loop0")
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		align int
		class mempool.Class
	}{
		{1, mempool.Class{Size: 1<<34 + 1, Count: 1 << 30}},
		{64, mempool.Class{Size: 1<<33 - 1, Count: 1 << 30}}, // fits an int until aligned
	} {
		if _, err := mempool.New(pd, mempool.Config{Align: c.align, Classes: []mempool.Class{c.class}}); !errors.Is(err, verbs.ErrInvalidArg) {
			t.Fatalf("a class of %d buffers of %d bytes aligned to %d: %v, want ErrInvalidArg", c.class.Count, c.class.Size, c.align, err)
		}
	}
}

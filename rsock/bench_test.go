package rsock

import (
	"context"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/goverbs/goverbs/internal/grpcecho"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkPingPong64 is a 64-byte request and its 64-byte response, one
// at a time (ns/op is the round trip), over rsock and over Go's TCP
// loopback for comparison.
func BenchmarkPingPong64(b *testing.B) {
	for _, scheme := range append([]string{"gotcp"}, providers...) {
		b.Run(scheme, func(b *testing.B) {
			var d, a net.Conn
			if scheme == "gotcp" {
				d, a = tcpPair(b)
			} else {
				d, a = pair(b, scheme, &Config{})
			}
			defer d.Close()
			defer a.Close()
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 64)
				for {
					if _, err := io.ReadFull(a, buf); err != nil {
						done <- nil
						return
					}
					if _, err := a.Write(buf); err != nil {
						done <- err
						return
					}
				}
			}()
			buf := make([]byte, 64)
			b.ReportAllocs()
			b.SetBytes(64)
			for b.Loop() {
				if _, err := d.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(d, buf); err != nil {
					b.Fatal(err)
				}
			}
			d.(interface{ CloseWrite() error }).CloseWrite()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// tcpPair returns both ends of a Go TCP loopback connection.
func tcpPair(b *testing.B) (dialled, accepted net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		ch <- c
	}()
	d, err := net.Dial("tcp", l.Addr().String())
	a := <-ch
	if err != nil || a == nil {
		b.Fatalf("dial: %v, accept: %v", err, a)
	}
	return d, a
}

// BenchmarkStream1MiB writes 1 MiB per op to a reader that drains it
// with Reads of up to streamReadSize bytes, over Go's TCP loopback for
// comparison, and over rsock without a copy (the default) and copied.
func BenchmarkStream1MiB(b *testing.B) {
	b.Run("gotcp", func(b *testing.B) {
		benchStream(b, tcpPair)
	})
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{{"zerocopy", Config{}}, {"copy", Config{ZeroCopyMin: -1}}} {
			b.Run(scheme+"/"+mode.name, func(b *testing.B) {
				benchStream(b, func(b *testing.B) (net.Conn, net.Conn) {
					d, a := pair(b, scheme, &mode.cfg)
					return d, a
				})
			})
		}
	}
}

// streamReadSize is the buffer of a stream benchmark's reader, as in
// goverbs sock bench.
const streamReadSize = 256 << 10

// benchStream writes 1 MiB per op over a connection that open makes.
func benchStream(b *testing.B, open func(*testing.B) (dialled, accepted net.Conn)) {
	d, a := open(b)
	defer d.Close()
	defer a.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, streamReadSize)
		for {
			if _, err := a.Read(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 1<<20)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := d.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	d.(interface{ CloseWrite() error }).CloseWrite()
	<-done
}

// BenchmarkCopy1MiB is one copy of 1 MiB between two buffers of this
// goroutine: the speed of the machine, which bounds a 1 MiB stream
// (BenchmarkStream1MiB) that copies each byte once.
func BenchmarkCopy1MiB(b *testing.B) {
	src, dst := make([]byte, 1<<20), make([]byte, 1<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkRingModel1MiB passes 1 MiB per op through a ring of
// DefaultRingSize bytes from one goroutine to another, as
// BenchmarkStream1MiB does over shm0 but with no protocol: the writer
// copies chunks of a quarter of the ring into it, the reader copies them
// out, at most streamReadSize bytes at a time, and each polls the other's
// position. It is what the ring's two copies cost on this machine, the
// ring's cache lines moving from the writer's processor to the reader's.
func BenchmarkRingModel1MiB(b *testing.B) {
	const size, chunk = DefaultRingSize, DefaultRingSize / 4
	ring := make([]byte, size)
	src := make([]byte, 1<<20)
	var written, read atomic.Uint64 // stream positions
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		dst := make([]byte, streamReadSize)
		for pos := uint64(0); ; {
			end := written.Load()
			if end == pos {
				if stop.Load() && written.Load() == pos {
					return
				}
				runtime.Gosched()
				continue
			}
			off := pos % size
			n := min(end-pos, size-off, uint64(len(dst)))
			copy(dst, ring[off:off+n])
			pos += n
			read.Store(pos)
		}
	}()
	b.SetBytes(int64(len(src)))
	pos := uint64(0)
	for b.Loop() {
		for s := 0; s < len(src); {
			free := size - (pos - read.Load())
			if free == 0 {
				runtime.Gosched()
				continue
			}
			off := pos % size
			n := min(free, uint64(len(src)-s), size-off, chunk)
			copy(ring[off:off+n], src[s:])
			s += int(n)
			pos += n
			written.Store(pos)
		}
	}
	stop.Store(true)
	<-done
}

// BenchmarkGRPCUnary64 is a gRPC unary call of 64 bytes each way over
// rsock, and over Go's TCP loopback for comparison.
func BenchmarkGRPCUnary64(b *testing.B) {
	benchGRPCUnary64(b, append([]string{"gotcp"}, providers...), &Config{})
}

// BenchmarkGRPCUnary64Parked is BenchmarkGRPCUnary64 with waits that park
// at once (Config.Spin negative): the cost of the wake-ups a connection
// pays when its peer answers later than the spin lasts.
func BenchmarkGRPCUnary64Parked(b *testing.B) {
	benchGRPCUnary64(b, providers, &Config{Spin: -1})
}

func benchGRPCUnary64(b *testing.B, schemes []string, cfg *Config) {
	for _, scheme := range schemes {
		b.Run(scheme, func(b *testing.B) {
			var l net.Listener
			var err error
			dial := cfg.Dial
			if scheme == "gotcp" {
				l, err = net.Listen("tcp", "127.0.0.1:0")
				var d net.Dialer
				dial = func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }
			} else {
				l, err = cfg.Listen(listenAddr(b, scheme))
			}
			if err != nil {
				b.Fatal(err)
			}
			s := grpcecho.NewServer()
			served := make(chan error, 1)
			go func() { served <- s.Serve(l) }()
			defer func() { s.Stop(); <-served }()
			cc, err := grpc.NewClient("passthrough:///"+l.Addr().String(),
				grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			req, resp := &grpcecho.Frame{B: make([]byte, 64)}, &grpcecho.Frame{}
			ctx := context.Background()
			for b.Loop() {
				if err := grpcecho.Call(ctx, cc, req, resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

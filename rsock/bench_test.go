package rsock

import (
	"context"
	"io"
	"net"
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

// BenchmarkStream1MiB writes 1 MiB per op to a reader that drains it,
// without a copy (the default) and copied.
func BenchmarkStream1MiB(b *testing.B) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{{"zerocopy", Config{}}, {"copy", Config{ZeroCopyMin: -1}}} {
			b.Run(scheme+"/"+mode.name, func(b *testing.B) {
				benchStream(b, scheme, &mode.cfg)
			})
		}
	}
}

// benchStream writes 1 MiB per op over a connection made with cfg.
func benchStream(b *testing.B, scheme string, cfg *Config) {
	d, a := pair(b, scheme, cfg)
	defer d.Close()
	defer a.Close()
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, a)
		done <- n
	}()
	buf := make([]byte, 1<<20)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := d.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	d.CloseWrite()
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

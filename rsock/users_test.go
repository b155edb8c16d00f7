package rsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/grpcecho"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// userSchemes are the providers the real-user tests run on.
var userSchemes = []string{"shm", "tcp"}

// TestHTTPOverRsock serves net/http over an rsock listener and fetches
// from it with an http.Client whose transport dials rsock: small and
// large bodies, many requests over kept-alive connections, from several
// goroutines.
func TestHTTPOverRsock(t *testing.T) {
	for _, scheme := range userSchemes {
		t.Run(scheme, func(t *testing.T) {
			l, err := Listen(listenAddr(t, scheme))
			if err != nil {
				t.Fatal(err)
			}
			big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
			mux := http.NewServeMux()
			mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "hello %s", r.URL.Query().Get("n"))
			})
			mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(big) })
			mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) { io.Copy(w, r.Body) })
			srv := &http.Server{Handler: mux}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(l) }()
			url := l.Addr().String()
			tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return Dial(ctx, url) }}
			client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			get := func(path string) ([]byte, error) {
				resp, err := client.Get("http://rsock" + path)
				if err != nil {
					return nil, err
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return nil, fmt.Errorf("%s: status %s", path, resp.Status)
				}
				return io.ReadAll(resp.Body)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 25 {
						b, err := get(fmt.Sprintf("/hello?n=%d-%d", g, i))
						if err != nil {
							errs <- err
							return
						}
						if want := fmt.Sprintf("hello %d-%d", g, i); string(b) != want {
							errs <- fmt.Errorf("got %q, want %q", b, want)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			b, err := get("/big")
			if err != nil || !bytes.Equal(b, big) {
				t.Errorf("GET /big: %d bytes, equal %v, err %v", len(b), bytes.Equal(b, big), err)
			}
			resp, err := client.Post("http://rsock/echo", "application/octet-stream", bytes.NewReader(big))
			if err != nil {
				t.Fatal(err)
			}
			b, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(b, big) {
				t.Errorf("POST /echo: %d bytes back, equal %v, err %v", len(b), bytes.Equal(b, big), err)
			}
			tr.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Error(err)
			}
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve returned %v", err)
			}
		})
	}
}

// TestGRPCOverRsock serves gRPC over an rsock listener and calls it
// through a context dialer: unary calls of several sizes, from several
// goroutines on one client connection.
func TestGRPCOverRsock(t *testing.T) {
	for _, scheme := range userSchemes {
		t.Run(scheme, func(t *testing.T) {
			l, err := Listen(listenAddr(t, scheme))
			if err != nil {
				t.Fatal(err)
			}
			s := grpcecho.NewServer()
			served := make(chan error, 1)
			go func() { served <- s.Serve(l) }()
			cc, err := grpc.NewClient("passthrough:///"+l.Addr().String(),
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(Dial))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i, size := range []int{0, 1, 64, 4096, 100 << 10, 1 << 20} {
						req := &grpcecho.Frame{B: bytes.Repeat([]byte{byte(g*16 + i)}, size)}
						var resp grpcecho.Frame
						if err := grpcecho.Call(ctx, cc, req, &resp); err != nil {
							errs <- fmt.Errorf("call of %d bytes: %w", size, err)
							return
						}
						if !bytes.Equal(req.B, resp.B) {
							errs <- fmt.Errorf("call of %d bytes: %d bytes back, not the same", size, len(resp.B))
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			cc.Close()
			s.Stop()
			if err := <-served; err != nil {
				t.Errorf("Serve returned %v", err)
			}
		})
	}
}

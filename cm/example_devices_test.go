package cm_test

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/goverbs/goverbs/cm"

	_ "github.com/goverbs/goverbs/provider/iwarp" // device tcp0, addresses tcp://host:port
	_ "github.com/goverbs/goverbs/provider/shm"   // device shm0, addresses shm://@name
)

// TestClientServerOnEveryDevice runs the server and client of
// Example_clientServer on every device, as the example says they run:
// the address alone decides the device.
func TestClientServerOnEveryDevice(t *testing.T) {
	for _, addr := range []string{"loop://example-every-device", "shm://@goverbs-cm-example-" + t.Name(), "tcp://127.0.0.1:0"} {
		t.Run(addr, func(t *testing.T) {
			l, err := cm.Listen(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			out := captureStdout(t, func() {
				served := make(chan struct{})
				go func() {
					defer close(served)
					server(l)
				}()
				client(l.Addr())
				<-served
			})
			const want = "client: RDMA_READ success 12 bytes: Hello, RDMA!\nserver: the client says \"thanks\"\n"
			if out != want {
				t.Errorf("on %s the example printed %q, want %q", addr, out, want)
			}
		})
	}
}

// captureStdout returns what f prints to os.Stdout.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = saved }()
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		io.Copy(&out, r)
	}()
	f()
	w.Close()
	<-copied
	r.Close()
	return out.String()
}

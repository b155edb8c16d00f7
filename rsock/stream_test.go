package rsock

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestStreamAcrossRingWraps sends a stream many times the ring's size in
// writes and reads of odd sizes, both ways at once, and checks every byte:
// writes up to one and a half rings, and small ones, which go inside
// their data message's Send where the control messages are Sends.
func TestStreamAcrossRingWraps(t *testing.T) {
	for _, scheme := range providers {
		for _, tc := range []struct {
			mode     string
			cfg      Config
			maxWrite int
		}{
			{"imm", Config{RingSize: MinRingSize}, 3 * MinRingSize / 2},
			{"send", Config{RingSize: MinRingSize, noImm: true}, 3 * MinRingSize / 2},
			{"imm/small", Config{RingSize: MinRingSize}, 2 * inlineMax},
			{"send/small", Config{RingSize: MinRingSize, noImm: true}, 2 * inlineMax},
		} {
			cfg := tc.cfg
			t.Run(scheme+"/"+tc.mode, func(t *testing.T) {
				d, a := pair(t, scheme, &cfg)
				defer d.Close()
				defer a.Close()
				for _, c := range []*Conn{d, a} {
					if inline := c.inlineMax > 0; inline == c.useImm || c.acceptInline == c.acceptImm {
						t.Fatalf("inline data sent %v, taken %v, with immediate data sent %v, taken %v: want inline data exactly where control messages are Sends",
							inline, c.acceptInline, c.useImm, c.acceptImm)
					}
				}
				const total = 1 << 20
				src := make([]byte, total)
				for i := range src {
					src[i] = byte(i * 7 / 3)
				}
				errc := make(chan error, 2)
				send := func(c net.Conn, seed uint64) {
					r := rand.New(rand.NewPCG(seed, 1))
					for off := 0; off < total; {
						n := min(1+r.IntN(tc.maxWrite), total-off)
						if _, err := c.Write(src[off : off+n]); err != nil {
							errc <- err
							return
						}
						off += n
					}
					errc <- nil
				}
				recv := func(c net.Conn, seed uint64) error {
					r := rand.New(rand.NewPCG(seed, 2))
					got := make([]byte, 0, total)
					buf := make([]byte, 2*MinRingSize)
					for len(got) < total {
						n, err := c.Read(buf[:1+r.IntN(len(buf)-1)])
						if err != nil {
							return err
						}
						got = append(got, buf[:n]...)
					}
					if !bytes.Equal(got, src) {
						return errors.New("the stream arrived changed")
					}
					return nil
				}
				go send(d, 1)
				go send(a, 2)
				if err := recv(a, 3); err != nil {
					t.Error(err)
				}
				if err := recv(d, 4); err != nil {
					t.Error(err)
				}
				for range 2 {
					if err := <-errc; err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
}

// TestCloseWriteHalfCloses checks that CloseWrite ends one direction (the
// peer reads the bytes, then io.EOF) while the other goes on, and that
// Write after it fails with ErrWriteClosed.
func TestCloseWriteHalfCloses(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			d, a := pair(t, scheme, &Config{})
			defer d.Close()
			defer a.Close()
			if _, err := d.Write([]byte("request")); err != nil {
				t.Fatal(err)
			}
			if err := d.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Write([]byte("x")); !errors.Is(err, ErrWriteClosed) {
				t.Errorf("Write after CloseWrite: %v, want ErrWriteClosed", err)
			}
			b, err := io.ReadAll(a)
			if err != nil || string(b) != "request" {
				t.Fatalf("ReadAll: %q, %v", b, err)
			}
			if _, err := a.Write([]byte("response")); err != nil {
				t.Fatal(err)
			}
			a.Close()
			b, err = io.ReadAll(d)
			if err != nil || string(b) != "response" {
				t.Fatalf("ReadAll after the peer's Close: %q, %v", b, err)
			}
		})
	}
}

// TestCloseReleasesEverything checks that closing every connection
// closes the shared device context and that calls after Close fail with
// net.ErrClosed.
func TestCloseReleasesEverything(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			d, a := pair(t, scheme, &Config{})
			// Receives and the send buffer: a control message each, or
			// one with inline data where the side takes that.
			ring := DefaultRingSize
			if d.dev.attr.Transport == "iwarp" {
				ring = DefaultRingSizeIWARP
			}
			want := 2*ring + (ctrlRecvs+1)*ctrlLen
			if d.acceptInline {
				want = 2*ring + (ctrlRecvs+1)*inlineSlot
			}
			if got := d.RegisteredBytes(); got != want {
				t.Errorf("RegisteredBytes = %d, want %d", got, want)
			}
			d.Close()
			a.Close()
			if _, err := d.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Read after Close: %v", err)
			}
			if _, err := d.Write(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Write after Close: %v", err)
			}
			if err := d.Close(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("second Close: %v", err)
			}
			devicesMu.Lock()
			n := len(devices)
			devicesMu.Unlock()
			if n != 0 {
				t.Errorf("%d device contexts open after every connection closed", n)
			}
		})
	}
}

// TestAbruptDisconnectIsReset checks that a peer that disconnects without
// ending its stream is seen as ErrReset by a blocked Read (after the
// bytes it sent) and by Write.
func TestAbruptDisconnectIsReset(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			// A Write without a copy returns once the bytes have left:
			// the disconnect cannot flush them.
			d, a := pair(t, scheme, &Config{ZeroCopyMin: 1})
			defer a.Close()
			if _, err := d.Write([]byte("last words")); err != nil {
				t.Fatal(err)
			}
			go func() {
				d.cmc.Close()
			}()
			a.SetReadDeadline(time.Now().Add(20 * time.Second))
			b, err := io.ReadAll(a)
			if string(b) != "last words" || !errors.Is(err, ErrReset) {
				t.Errorf("ReadAll: %q, %v; want the bytes and ErrReset", b, err)
			}
			if _, err := a.Write([]byte("x")); !errors.Is(err, ErrReset) {
				t.Errorf("Write to a reset connection: %v", err)
			}
			d.Close()
		})
	}
}

// TestWriteToPeerThatLeftKeepsWhatItSent checks that a Write which
// finds the peer gone does not cost a Read the bytes and the end of
// stream the peer sent before it went, which the completion queue still
// holds: the Write fails with ErrReset, the Read returns them and
// io.EOF, or ErrReset after them where the peer ended no stream.
func TestWriteToPeerThatLeftKeepsWhatItSent(t *testing.T) {
	for _, scheme := range providers {
		for _, ended := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/ended=%v", scheme, ended), func(t *testing.T) {
				// A Write without a copy returns once the bytes have
				// left: the peer's disconnect cannot flush them.
				d, a := pair(t, scheme, &Config{ZeroCopyMin: 1})
				defer a.Close()
				defer d.Close()
				werr := lastWordsAndLeave(t, d, a, ended)
				a.SetReadDeadline(time.Now().Add(20 * time.Second))
				b, err := io.ReadAll(a)
				expectLastWords(t, ended, werr, b, err)
			})
		}
	}
}

// TestPeerEndsWhileReadFindsNothing checks the same when everything
// happens between a Read's poll of an empty CQ and what it does next:
// the peer's last bytes, its end, and a Write that finds it gone.
func TestPeerEndsWhileReadFindsNothing(t *testing.T) {
	for _, scheme := range providers {
		for _, ended := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/ended=%v", scheme, ended), func(t *testing.T) {
				d, a := pair(t, scheme, &Config{ZeroCopyMin: 1}) // as above
				defer a.Close()
				defer d.Close()
				var fired atomic.Bool
				var werr error
				afterEmptyPoll = func(c *Conn) {
					if c == a && fired.CompareAndSwap(false, true) {
						werr = lastWordsAndLeave(t, d, a, ended)
					}
				}
				defer func() { afterEmptyPoll = nil }()
				a.SetReadDeadline(time.Now().Add(20 * time.Second))
				b, err := io.ReadAll(a)
				afterEmptyPoll = nil
				if !fired.Load() {
					t.Fatal("the Read never found the CQ empty")
				}
				expectLastWords(t, ended, werr, b, err)
			})
		}
	}
}

// lastWordsAndLeave has d write "last words" and leave, ending its
// stream first if ended, waits until a sees it gone, and returns the
// error of a Write on a then.
func lastWordsAndLeave(t *testing.T, d, a *Conn, ended bool) error {
	if _, err := d.Write([]byte("last words")); err != nil {
		t.Error(err)
	}
	if ended {
		d.Close()
	} else {
		d.cmc.Close()
	}
	select {
	case <-a.cmc.Done():
	case <-time.After(20 * time.Second):
		t.Error("the peer's disconnect was not seen in 20 s")
	}
	_, err := a.Write([]byte("x"))
	return err
}

// expectLastWords checks that the Write after the peer left failed with
// ErrReset (werr) and that a Read got its last words and then io.EOF, or
// ErrReset if it ended no stream.
func expectLastWords(t *testing.T, ended bool, werr error, b []byte, err error) {
	t.Helper()
	if !errors.Is(werr, ErrReset) {
		t.Errorf("Write to a peer that left: %v, want ErrReset", werr)
	}
	want := error(nil)
	if !ended {
		want = ErrReset
	}
	if string(b) != "last words" || !errors.Is(err, want) {
		t.Errorf("ReadAll: %q, %v; want the bytes and %v", b, err, want)
	}
}

// TestCloseWriteToPeerThatLeft checks that CloseWrite, like Write, sees a
// peer that is gone, while a Read waits on the CQ.
func TestCloseWriteToPeerThatLeft(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			d, a := pair(t, scheme, &Config{})
			defer a.Close()
			read := make(chan error, 1)
			go func() {
				_, err := io.ReadAll(a)
				read <- err
			}()
			d.cmc.Close()
			defer d.Close()
			select {
			case <-a.cmc.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the peer's disconnect was not seen in 20 s")
			}
			if err := a.CloseWrite(); !errors.Is(err, ErrReset) {
				t.Errorf("CloseWrite to a peer that left: %v, want ErrReset", err)
			}
			if err := <-read; !errors.Is(err, ErrReset) {
				t.Errorf("Read from a peer that left: %v, want ErrReset", err)
			}
		})
	}
}

// TestKilledPeerIsReset kills a peer process (this test binary, run as
// the peer) and checks that a blocked Read fails with ErrReset.
func TestKilledPeerIsReset(t *testing.T) {
	for _, scheme := range []string{"shm", "tcp"} {
		t.Run(scheme, func(t *testing.T) {
			l, err := Listen(listenAddr(t, scheme))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "RSOCK_DIAL_AND_HANG="+l.Addr().String())
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			c, err := l.Accept()
			if err != nil {
				cmd.Process.Kill()
				t.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 5)
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ready" {
				cmd.Process.Kill()
				t.Fatalf("peer's greeting: %q, %v", buf, err)
			}
			cmd.Process.Kill()
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.Read(buf); !errors.Is(err, ErrReset) {
				t.Errorf("Read from a killed peer: %v, want ErrReset", err)
			}
		})
	}
}

// TestSplitReaderWriterRoundTrips runs request/response traffic the way
// gRPC does: on each end one goroutine only reads and another only
// writes, so that Write's polling and a Read that waits meet. Every
// round trip must complete; a lost wake-up fails on the deadline.
func TestSplitReaderWriterRoundTrips(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			d, a := pair(t, scheme, &Config{})
			defer d.Close()
			defer a.Close()
			const rounds = 5000
			deadline := time.Now().Add(60 * time.Second)
			d.SetDeadline(deadline)
			a.SetDeadline(deadline)
			// relay reads 64-byte messages from in and has another
			// goroutine write each to out.
			relay := func(in, out net.Conn, n int, first bool) error {
				msgs := make(chan []byte, 1)
				werr := make(chan error, 1)
				go func() {
					for m := range msgs {
						if _, err := out.Write(m); err != nil {
							werr <- err
							for range msgs {
							}
							return
						}
					}
					werr <- nil
				}()
				if first {
					msgs <- make([]byte, 64)
				}
				var rerr error
				for range n {
					buf := make([]byte, 64)
					if _, rerr = io.ReadFull(in, buf); rerr != nil {
						break
					}
					msgs <- buf
				}
				close(msgs)
				if err := <-werr; rerr == nil {
					rerr = err
				}
				return rerr
			}
			errc := make(chan error, 1)
			go func() { errc <- relay(a, a, rounds, false) }()
			if err := relay(d, d, rounds-1, true); err != nil {
				t.Error(err)
			}
			if err := <-errc; err != nil {
				t.Error(err)
			}
		})
	}
}

// TestAddrsAreURLs checks that both ends name the listener by its URL,
// and the dialler's end by its scheme and queue pair.
func TestAddrsAreURLs(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			l, err := Listen(listenAddr(t, scheme))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			a, d, err := connectVia(l, &Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			defer d.Close()
			url := l.Addr().String()
			if !strings.HasPrefix(url, scheme+"://") || strings.HasSuffix(url, ":0") {
				t.Errorf("listener address %q", url)
			}
			if d.RemoteAddr().String() != url || a.LocalAddr().String() != url {
				t.Errorf("dialler's remote %q, acceptor's local %q; want %q", d.RemoteAddr(), a.LocalAddr(), url)
			}
			if want := scheme + "://?qp="; !strings.HasPrefix(d.LocalAddr().String(), want) || !strings.HasPrefix(a.RemoteAddr().String(), want) {
				t.Errorf("dialler's end %q, %q; want %s<n>", d.LocalAddr(), a.RemoteAddr(), want)
			}
			if d.LocalAddr().Network() != "rsock" {
				t.Errorf("network %q", d.LocalAddr().Network())
			}
			if err := l.Close(); err != nil {
				t.Error(err)
			}
			if err := l.Close(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("second Close: %v", err)
			}
			if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Accept after Close: %v", err)
			}
		})
	}
}

// A Read takes the bytes on both sides of the ring's end at once, as many
// as its buffer holds, rather than stopping at the end.
func TestReadTakesBytesAcrossTheRingsEnd(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			d, a := pair(t, scheme, &Config{RingSize: MinRingSize})
			defer d.Close()
			defer a.Close()
			head := make([]byte, MinRingSize-100)
			if _, err := d.Write(head); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(a, head); err != nil {
				t.Fatal(err)
			}
			msg := make([]byte, 200) // 100 bytes to the ring's end, 100 from its start
			for i := range msg {
				msg[i] = byte(i)
			}
			if _, err := d.Write(msg); err != nil {
				t.Fatal(err)
			}
			for {
				a.pollMu.Lock()
				a.poll()
				a.pollMu.Unlock()
				a.mu.Lock()
				avail := a.rxTail - a.rxHead
				a.mu.Unlock()
				if avail == uint64(len(msg)) {
					break
				}
				runtime.Gosched()
			}
			buf := make([]byte, 1000)
			n, err := a.Read(buf)
			if err != nil || !bytes.Equal(buf[:n], msg) {
				t.Fatalf("read %d bytes (%v), want the %d written, equal", n, err, len(msg))
			}
		})
	}
}

package rsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// awaitParked yields until n connections of the process are parked.
func awaitParked(n int32) {
	for parked.n.Load() != n {
		runtime.Gosched()
	}
}

// A parked Read on tcp0 is polled by a spinning wait of another
// connection, and gets its bytes whoever takes them; once it has them,
// it is no longer polled.
func TestSpinningWaitPollsForParkedConnection(t *testing.T) {
	d, a := pair(t, "tcp", &Config{Spin: -1}) // a's Read parks at once
	defer d.Close()
	defer a.Close()
	if !a.helpable {
		t.Fatal("a tcp0 connection is not polled for while it is parked")
	}
	got := make(chan []byte, 1)
	before := time.Since(parkEpoch)
	go func() {
		buf := make([]byte, 16)
		n, err := a.Read(buf)
		if err != nil {
			t.Error(err)
		}
		got <- buf[:n]
	}()
	awaitParked(1)
	// Polled as of the moment it parked, and as of 2*helpWindow later:
	// the test's own pace (a loaded host may hold it off for longer than
	// helpWindow) does not decide. The parking goroutine may still hold
	// the lock of the parked set for an instant, which helpParked only
	// tries: try again then.
	at := time.Duration(a.parkedAt.Load())
	// The moment it parked is on the clock spinning waits pass
	// helpParked (the time since parkEpoch): taken from the connection
	// itself, it must fall between the test's readings of that clock.
	if after := time.Since(parkEpoch); at < before || at > after {
		t.Fatalf("the connection parked at %v, outside the %v to %v since parkEpoch in which it parked: spinning waits would misjudge its age", at, before, after)
	}
	helped := helpParked(nil, at)
	for i := 0; !helped && i < 1000; i++ {
		runtime.Gosched()
		helped = helpParked(nil, at)
	}
	if !helped {
		t.Fatal("a spinning wait did not poll the parked connection")
	}
	if helpParked(nil, at+2*helpWindow) {
		t.Fatal("a spinning wait polled a connection parked longer than helpWindow")
	}
	msg := []byte("parked")
	if _, err := d.Write(msg); err != nil {
		t.Fatal(err)
	}
	var b []byte
	for b == nil {
		helpParked(nil, time.Since(parkEpoch))
		select {
		case b = <-got:
		default:
			runtime.Gosched()
		}
	}
	if !bytes.Equal(b, msg) {
		t.Fatalf("read %q, want %q", b, msg)
	}
	awaitParked(0)
	if helpParked(nil, time.Since(parkEpoch)) {
		t.Fatal("a connection was polled after its Read returned")
	}
}

// Connections on shm0 and loop0 are woken without the network poller and
// are not polled for.
func TestParkedConnectionNotPolledOffIWARP(t *testing.T) {
	for _, scheme := range []string{"shm", "loop"} {
		d, a := pair(t, scheme, &Config{})
		if d.helpable || a.helpable {
			t.Errorf("%s: a connection is polled for while it is parked", scheme)
		}
		d.Close()
		a.Close()
	}
}

// Streams over tcp0 where every wait parks, beside ping-pongs whose
// waits spin and poll for them, carry every byte in order, and Close
// ends them whatever is parked.
func TestParkedAndSpinningConnectionsStream(t *testing.T) {
	const conns, rounds = 4, 200
	var wg sync.WaitGroup
	for i := range conns {
		cfg := &Config{Spin: -1}
		if i%2 == 0 {
			cfg = &Config{Spin: time.Millisecond}
		}
		d, a := pair(t, "tcp", cfg)
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer a.Close()
			buf := make([]byte, 64)
			for {
				if _, err := io.ReadFull(a, buf); err != nil {
					if err != io.EOF {
						t.Error(err)
					}
					return
				}
				if _, err := a.Write(buf); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			defer d.Close()
			out, in := make([]byte, 64), make([]byte, 64)
			for r := range rounds {
				for j := range out {
					out[j] = byte(r + j + i)
				}
				if _, err := d.Write(out); err != nil {
					t.Error(err)
					return
				}
				if _, err := io.ReadFull(d, in); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(in, out) {
					t.Errorf("connection %d round %d: got %x, want %x", i, r, in, out)
					return
				}
			}
			if err := d.CloseWrite(); err != nil {
				t.Error(err)
			}
			if _, err := io.ReadFull(d, in[:1]); err != io.EOF {
				t.Errorf("connection %d: after CloseWrite, read %v, want EOF", i, err)
			}
		}()
	}
	wg.Wait()
	if n := parked.n.Load(); n != 0 {
		t.Fatalf("%d connections still parked after Close", n)
	}
}

// A spinning wait that, polling for a parked connection, finds that
// connection's peer broke the protocol marks it failed and wakes it, but
// leaves it connected: the disconnect may wait for the provider's linger
// (a peer that stops reading holds it), which the spinning wait's own
// connection must not pay. The parked wait, once it leaves, disconnects.
func TestHelperLeavesDisconnectToParkedWait(t *testing.T) {
	victim, h, healthy, _ := attackSetup(t, "tcp")
	// The victim's wait parks: it holds pollMu, as a wait that parks does.
	victim.pollMu.Lock()
	victim.parkStart()
	parkedHere := true
	defer func() {
		if parkedHere {
			victim.parkEnd()
			victim.pollMu.Unlock()
		}
	}()
	h.write(t, h.victim.ringAddr(), h.victim.ringKey(), 0, makeCtrl(opBad, 0, 0))
	for !victim.failed.Load() {
		// Polled as if the victim had parked just now.
		helpParked(nil, time.Duration(victim.parkedAt.Load()))
		runtime.Gosched()
	}
	select {
	case <-victim.cmc.Done():
		t.Fatal("a spinning wait disconnected the parked connection it polled for")
	default:
	}
	victim.unpark()
	victim.pollMu.Unlock()
	parkedHere = false
	select {
	case <-h.cmc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the parked wait did not disconnect its failed connection when it left")
	}
	if _, err := victim.Read(make([]byte, 1)); !errors.Is(err, ErrProtocol) {
		t.Errorf("victim's Read: %v, want ErrProtocol", err)
	}
	checkHealthy(t, healthy)
}

// A parked Read that a spinning wait polls for without pause still ends
// at its deadline, and Close ends the next one, with the polling going
// on throughout; afterwards the connection is no longer polled.
func TestParkedWaitEndsWhilePolledFor(t *testing.T) {
	d, a := pair(t, "tcp", &Config{Spin: -1})
	defer d.Close()
	stop, helped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(helped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			// As if every connection had parked just now.
			helpParked(nil, time.Duration(a.parkedAt.Load()))
			runtime.Gosched()
		}
	}()
	defer func() {
		close(stop)
		<-helped
	}()
	a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	a.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 1))
		done <- err
	}()
	awaitParked(1)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read ended by Close: %v, want net.ErrClosed", err)
	}
	if n := parked.n.Load(); n != 0 {
		t.Fatalf("%d connections parked after Close", n)
	}
}

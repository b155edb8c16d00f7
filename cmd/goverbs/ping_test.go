package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// freePort returns a TCP port on 127.0.0.1 that nothing listened on a
// moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// servePing starts goverbs ping -s in this process and returns, once it
// listens, a channel with its exit status and output.
func servePing(t *testing.T, port string, args ...string) <-chan string {
	t.Helper()
	done := make(chan string, 1)
	go func() {
		var o, e bytes.Buffer
		code := run(context.Background(), append([]string{"ping", "-s", "-a", "127.0.0.1", "-p", port}, args...), &o, &e)
		done <- fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", code, o.String(), e.String())
	}()
	// Connecting is the only sign that it listens; the server drops a
	// connection that sends no MPA request.
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
			return done
		}
		select {
		case out := <-done:
			t.Fatalf("goverbs ping -s ended before listening: %s", out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("goverbs ping -s does not listen on port %s: %v", port, err)
		}
	}
}

// TestPing: goverbs ping's client and server, in this process over tcp0,
// run rping's ping-pong with the data checked on both sides, with the
// MPA CRC off and on.
func TestPing(t *testing.T) {
	defer iwarp.SetCRC(iwarp.CRC()) // --crc sets it for the process
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			port := freePort(t)
			var extra []string
			if crc {
				extra = []string{"--crc"}
			}
			done := servePing(t, port, append([]string{"-C", "20", "-S", "100"}, extra...)...)
			var o, e bytes.Buffer
			code := run(context.Background(), append([]string{"ping", "-c", "-a", "127.0.0.1", "-p", port, "-C", "20", "-S", "100", "-v"}, extra...), &o, &e)
			srv := <-done
			if code != 0 {
				t.Fatalf("goverbs ping -c: exit %d, stderr %q, stdout:\n%s\nserver: %s", code, e.String(), o.String(), srv)
			}
			if !strings.HasPrefix(srv, "exit 0\n") || !strings.Contains(srv, "served 20 pings of 100 bytes") {
				t.Fatalf("server: %s", srv)
			}
			if n := strings.Count(o.String(), "ping data: rdma-ping-"); n != 20 {
				t.Fatalf("the client printed %d pings' data, want 20:\n%s", n, o.String())
			}
		})
	}
}

// TestPingShortMessage: a client whose buffer message is shorter than
// rping's 16 bytes gets the server to stop with an error that says so,
// rather than use what the previous message left in the buffer.
func TestPingShortMessage(t *testing.T) {
	port := freePort(t)
	done := servePing(t, port)
	qp, mr := dialRaw(t, port, verbs.AccessLocalWrite)
	if _, err := qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{mr.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	srv := <-done
	if strings.HasPrefix(srv, "exit 0\n") || !strings.Contains(srv, "received 8 bytes, an rping message is 16") {
		t.Fatalf("server after an 8-byte message: %s", srv)
	}
}

// TestPingShortAdvertisement: a client that advertises a source buffer
// shorter than rping's smallest (here 0 bytes) gets the server to end the
// session with an error, not to panic.
func TestPingShortAdvertisement(t *testing.T) {
	port := freePort(t)
	done := servePing(t, port)
	qp, mr := dialRaw(t, port, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	b := mr.Bytes()
	binary.BigEndian.PutUint64(b[0:], mr.Addr()+32)
	binary.BigEndian.PutUint32(b[8:], mr.RKey())
	binary.BigEndian.PutUint32(b[12:], 0) // a buffer of 0 bytes
	if _, err := qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{mr.SGE(0, 16)}}}); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if !strings.HasPrefix(out, "exit 1\n") || !strings.Contains(out, "the client's buffer is 0 bytes") {
		t.Fatalf("goverbs ping -s after a 0-byte advertisement: %s", out)
	}
}

// dialRaw connects a bare tcp0 QP to the ping server at port, as rping
// would, with a 64-byte region of the given rights, for a test to send
// what it likes; everything is released when the test ends.
func dialRaw(t *testing.T, port string, access verbs.AccessFlags) (*verbs.QP, *verbs.MR) {
	t.Helper()
	dev, err := verbs.Open("tcp0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.AllocMR(64, access)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := cm.Dial(ctx, "tcp://127.0.0.1:"+port, qp, &cm.Param{ResponderResources: 1, InitiatorDepth: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return qp, mr
}

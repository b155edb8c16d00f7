package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFlagsAfterArguments: a command's flags may come before, between
// and after its positional arguments, "--" ends the flags, and the
// positional arguments are counted without the flags.
func TestFlagsAfterArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		addr string
		pos  []string
	}{
		{[]string{"-a", "x", "k", "v"}, "x", []string{"k", "v"}},
		{[]string{"k", "v", "-a", "x"}, "x", []string{"k", "v"}},
		{[]string{"k", "--addr=x", "v"}, "x", []string{"k", "v"}},
		{[]string{"k", "-a", "x", "--", "-v"}, "x", []string{"k", "-v"}},
		{[]string{"--", "-a", "x"}, "", []string{"-a", "x"}},
		{[]string{"k"}, "", []string{"k"}},
		{nil, "", nil},
	} {
		var addr string
		fs := newFlagSet("test", "KEY VALUE", "A test.", &env{stdout: io.Discard, stderr: io.Discard})
		fs.String(&addr, "addr", "a", "", "address")
		if err := fs.parse(tc.args); err != nil {
			t.Errorf("parse %q: %v", tc.args, err)
			continue
		}
		if addr != tc.addr || !slices.Equal(fs.Args(), tc.pos) || fs.NArg() != len(tc.pos) {
			t.Errorf("parse %q: addr %q, arguments %q; want %q, %q", tc.args, addr, fs.Args(), tc.addr, tc.pos)
		}
		for i, p := range tc.pos {
			if fs.Arg(i) != p {
				t.Errorf("parse %q: Arg(%d) = %q, want %q", tc.args, i, fs.Arg(i), p)
			}
		}
		if fs.Arg(len(tc.pos)) != "" {
			t.Errorf("parse %q: Arg past the end is %q", tc.args, fs.Arg(len(tc.pos)))
		}
	}
}

// TestKVFlagsAfterArguments: goverbs kv put, get and del take -a after
// the key and value, and "--" before a key that begins with "-".
func TestKVFlagsAfterArguments(t *testing.T) {
	addr := fmt.Sprintf("shm://@goverbs-test-kvargs-%d", os.Getpid())
	serveKV(t, addr)
	for _, step := range []struct {
		args []string
		out  string
	}{
		{[]string{"kv", "put", "greeting", "hello", "-a", addr}, ""},
		{[]string{"kv", "get", "greeting", "-a", addr}, "hello\n"},
		{[]string{"kv", "put", "-a", addr, "-t", "30s", "--", "-dash", "-value"}, ""},
		{[]string{"kv", "get", "-a", addr, "--", "-dash"}, "-value\n"},
		{[]string{"kv", "del", "greeting", "--addr", addr}, ""},
	} {
		out, errOut, code := goverbs(t, step.args...)
		if code != 0 || out != step.out {
			t.Fatalf("goverbs %q: exit %d, stdout %q, stderr %q; want exit 0, stdout %q", step.args, code, out, errOut, step.out)
		}
	}
	// The key was deleted: get fails, but as a lookup, not a usage error.
	if _, errOut, code := goverbs(t, "kv", "get", "greeting", "-a", addr); code != 1 {
		t.Fatalf("get of a deleted key: exit %d, stderr %q; want exit 1", code, errOut)
	}
	// The count of arguments leaves the flags out.
	_, errOut, code := goverbs(t, "kv", "get", "a", "b", "-a", addr)
	if code != 2 || !strings.Contains(errOut, `got 2: ["a" "b"]`) {
		t.Fatalf("kv get with two keys: exit %d, stderr %q; want a usage error counting 2 arguments", code, errOut)
	}
}

// serveKV runs goverbs kv serve at addr, with the extra flags, until the
// test ends.
func serveKV(t *testing.T, addr string, extra ...string) {
	t.Helper()
	cmd := exec.Command(goverbsBin, append([]string{"kv", "serve", "-l", addr, "--heap", "1048576", "--buckets", "1024"}, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "serving ") {
		t.Fatalf("goverbs kv serve: %q, %v", line, err)
	}
}

// TestKVTokenFile: a server given --token-file applies the PUTs and
// DELETEs of clients given the same file only; others are told they are
// not authorised, and still read.
func TestKVTokenFile(t *testing.T) {
	dir := t.TempDir()
	token, other := filepath.Join(dir, "token"), filepath.Join(dir, "other")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte("guess\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("shm://@goverbs-test-kvtoken-%d", os.Getpid())
	serveKV(t, addr, "--token-file", token)
	if out, errOut, code := goverbs(t, "kv", "put", "k", "v", "-a", addr, "--token-file", token); code != 0 {
		t.Fatalf("put with the token: exit %d, %q %q", code, out, errOut)
	}
	for _, args := range [][]string{
		{"kv", "put", "k", "forged", "-a", addr},
		{"kv", "put", "k", "forged", "-a", addr, "--token-file", other},
		{"kv", "del", "k", "-a", addr, "--token-file", other},
	} {
		if _, errOut, code := goverbs(t, args...); code != 1 || !strings.Contains(errOut, "not authorised") {
			t.Errorf("goverbs %q: exit %d, stderr %q; want exit 1 saying the client is not authorised", args, code, errOut)
		}
	}
	if out, errOut, code := goverbs(t, "kv", "get", "k", "-a", addr); code != 0 || out != "v\n" {
		t.Fatalf("get without the token: exit %d, %q %q; want the value", code, out, errOut)
	}
	if _, errOut, code := goverbs(t, "kv", "put", "k", "v", "-a", addr, "--token-file", filepath.Join(dir, "absent")); code != 1 || !strings.Contains(errOut, "token file") {
		t.Errorf("put with a token file that is not there: exit %d, stderr %q", code, errOut)
	}
}

// TestHelpShowsTheArguments: each kv operation's help names the
// arguments it takes and no other.
func TestHelpShowsTheArguments(t *testing.T) {
	for op, want := range map[string]string{"get": "KEY", "del": "KEY", "put": "KEY VALUE"} {
		out, _, code := goverbs(t, "kv", op, "-h")
		usage, _, _ := strings.Cut(out, "\n")
		if code != 0 || usage != "Usage: goverbs kv "+op+" [flags] "+want {
			t.Errorf("goverbs kv %s -h: exit %d, usage line %q; want the arguments %s", op, code, usage, want)
		}
		if op != "put" && strings.Contains(out, "VALUE") {
			t.Errorf("goverbs kv %s -h speaks of a VALUE it does not take:\n%s", op, out)
		}
	}
}

// TestRefusedFailsAtOnce: every command that connects fails at once, with
// exit status 1 and the refusal in one line, when nothing listens at the
// address — long before the generous timeouts given here, which goverbs
// (the helper) would not wait for.
func TestRefusedFailsAtOnce(t *testing.T) {
	tcp := "tcp://127.0.0.1:" + freePort(t)
	shm := fmt.Sprintf("shm://@goverbs-test-nobody-%d", os.Getpid())
	for _, args := range [][]string{
		{"kv", "get", "k", "-a", shm, "-t", "10m"},
		{"kv", "put", "k", "v", "-a", tcp, "-t", "10m"},
		{"kv", "del", "k", "-a", tcp, "-t", "10m"},
		{"log", "append", "rec", "--addr", shm + "," + tcp, "-t", "10m"},
		{"ping", "-c", "-a", tcp, "--timeout", "10m"},
		{"ping", "-c", "-a", shm, "--timeout", "10m"},
		{"bench", tcp, "--timeout", "10m"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, errOut, code := goverbs(t, args...)
			if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "nothing listens at") {
				t.Fatalf("goverbs %q: exit %d, stderr %q; want exit 1 and one line saying nothing listens", args, code, errOut)
			}
		})
	}
}

// TestPingURL: ping's address is a cm address, or rping's host and port.
func TestPingURL(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		port    int
		portSet bool
		want    string
	}{
		{"tcp://10.0.0.2:9000", 7174, false, "tcp://10.0.0.2:9000"},
		{"tcp://10.0.0.2", 7174, false, "tcp://10.0.0.2:7174"},
		{"tcp://[::1]", 7174, false, "tcp://[::1]:7174"},
		{"shm://@ping", 7174, false, "shm://@ping"},
		{"10.0.0.2", 9000, true, "tcp://10.0.0.2:9000"},
		{"::1", 9000, true, "tcp://[::1]:9000"},
		{"", 7174, false, "tcp://:7174"},
	} {
		if got, err := pingURL(tc.addr, tc.port, tc.portSet, ""); err != nil || got != tc.want {
			t.Errorf("pingURL(%q, %d, %v) = %q, %v; want %q", tc.addr, tc.port, tc.portSet, got, err, tc.want)
		}
	}
	if got, err := pingURL("tcp://10.0.0.2:9000", 9001, true, ""); !errors.Is(err, errUsage) {
		t.Errorf("pingURL with a cm address and -p = %q, %v; want a usage error", got, err)
	}
}

// TestPingAddressForms: goverbs ping's client and server meet whichever
// form each is given the address in (a cm address, or rping's -a host
// -p port), over tcp0 and over shm0; -p beside a cm address is refused.
func TestPingAddressForms(t *testing.T) {
	port := freePort(t)
	url := "tcp://127.0.0.1:" + port
	sock := "shm://" + filepath.Join(t.TempDir(), "ping.sock")
	tcpUp := func() error {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
		}
		return err
	}
	// The socket's file exists from bind, before listen: a connection
	// taken is what says it listens.
	shmUp := func() error {
		c, err := net.Dial("unixpacket", strings.TrimPrefix(sock, "shm://"))
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, tc := range []struct {
		name     string
		server   []string
		client   []string
		listens  func() error
		reported string
	}{
		{"cm server, rping client", []string{"-a", url}, []string{"-a", "127.0.0.1", "-p", port}, tcpUp, url},
		{"rping server, cm client", []string{"-a", "127.0.0.1", "-p", port}, []string{"-a", url}, tcpUp, url},
		{"shm", []string{"-a", sock}, []string{"-a", sock}, shmUp, sock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan string, 1)
			go func() {
				var o, e bytes.Buffer
				code := run(context.Background(), append([]string{"ping", "-s", "-C", "3"}, tc.server...), &o, &e)
				done <- fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", code, o.String(), e.String())
			}()
			for deadline := time.Now().Add(10 * time.Second); tc.listens() != nil; runtime.Gosched() {
				select {
				case out := <-done:
					t.Fatalf("goverbs ping -s %q ended before listening: %s", tc.server, out)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("goverbs ping -s %q does not listen", tc.server)
				}
			}
			var o, e bytes.Buffer
			code := run(context.Background(), append([]string{"ping", "-c", "-C", "3"}, tc.client...), &o, &e)
			srv := <-done
			if code != 0 || !strings.Contains(o.String(), "3 pings of 64 bytes to "+tc.reported) {
				t.Fatalf("goverbs ping -c %q: exit %d, stdout %q, stderr %q\nserver: %s", tc.client, code, o.String(), e.String(), srv)
			}
			if !strings.HasPrefix(srv, "exit 0\n") || !strings.Contains(srv, "served 3 pings") {
				t.Fatalf("goverbs ping -s %q: %s", tc.server, srv)
			}
		})
	}
	_, errOut, code := goverbs(t, "ping", "-c", "-a", url, "-p", port)
	if code != 2 || !strings.Contains(errOut, "give the port in the address") {
		t.Fatalf("ping -a %s -p %s: exit %d, stderr %q; want a usage error", url, port, code, errOut)
	}
}

// TestDemoOnTCP0: the demo's client posts its receive before it
// connects, so the server's Send, posted the moment it accepts, finds it
// on tcp0 too, which has no RNR retry; and --addr picks its device.
func TestDemoOnTCP0(t *testing.T) {
	for i := range 10 {
		args := []string{"demo", "-d", "tcp0"}
		if i%2 == 1 {
			args = []string{"demo", "--addr", "tcp://127.0.0.1:0"}
		}
		var o, e bytes.Buffer
		if code := run(context.Background(), args, &o, &e); code != 0 {
			t.Fatalf("run %d, goverbs %q: exit %d, stderr %q, stdout:\n%s", i, args, code, e.String(), o.String())
		}
		checkDemo(t, o.String(), defaultValue)
		if !strings.Contains(o.String(), "open device tcp0") {
			t.Fatalf("goverbs %q did not open tcp0:\n%s", args, o.String())
		}
	}
}

// TestPingURLKernelDevice: a host with -d naming a kernel device goes to
// librdmacm (rdma://), and with -d tcp0 or none to goverbs' iWARP.
func TestPingURLKernelDevice(t *testing.T) {
	for _, tc := range []struct{ device, want string }{
		{"", "tcp://10.77.0.2:7174"},
		{"tcp0", "tcp://10.77.0.2:7174"},
		{"rxe0", "rdma://10.77.0.2:7174"},
	} {
		if got, err := pingURL("10.77.0.2", 7174, true, tc.device); err != nil || got != tc.want {
			t.Errorf("pingURL with -d %q = %q, %v; want %q", tc.device, got, err, tc.want)
		}
	}
}

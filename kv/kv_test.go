package kv

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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
	_ "github.com/goverbs/goverbs/provider/iwarp"
	_ "github.com/goverbs/goverbs/provider/loop"
	_ "github.com/goverbs/goverbs/provider/shm"
)

func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	if addr := os.Getenv("GOVERBS_KV_TEST_SERVER"); addr != "" {
		os.Exit(serveChild(addr))
	}
	if spec := os.Getenv("GOVERBS_KV_TEST_HOSTILE"); spec != "" {
		os.Exit(hostileChild(spec))
	}
	goleak.VerifyTestMain(m)
}

// serveChild runs a server in this process, a child of the test, until
// its standard input closes.
func serveChild(addr string) int {
	s, err := Listen(addr, small())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// startChildServer runs a server in a child process.
func startChildServer(t *testing.T, addr string) *exec.Cmd {
	cmd, line, err := startChild(t, "GOVERBS_KV_TEST_SERVER="+addr)
	if err != nil || line != "ready\n" {
		t.Fatalf("server child: %q, %v", line, err)
	}
	return cmd
}

// startChild runs this test binary as a child process with env added,
// and returns it with the first line it printed; the child ends with the
// test.
func startChild(t *testing.T, env string) (*exec.Cmd, string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env, "GORACE=atexit_sleep_ms=0")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	return cmd, line, err
}

var serial atomic.Int64

// addrs are the providers the store is tested on.
func addrs() map[string]func() string {
	return map[string]func() string{
		"loop":  func() string { return fmt.Sprintf("loop://kv-%d", serial.Add(1)) },
		"shm":   func() string { return fmt.Sprintf("shm://@goverbs-kv-%d-%d", os.Getpid(), serial.Add(1)) },
		"iwarp": func() string { return "tcp://" + freePort() },
	}
}

// freePort returns a loopback address with a port nobody listens on.
func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func small() Config {
	return Config{Buckets: 64, SlotsPerBucket: 4, MaxValue: 8192, HeapBytes: 1 << 20, RecvDepth: 4}
}

func startServer(t testing.TB, addr string, cfg Config) *Server {
	t.Helper()
	s, err := Listen(addr, cfg)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func dial(t testing.TB, addr string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func forEachProvider(t *testing.T, f func(t *testing.T, addr func() string)) {
	for name, addr := range addrs() {
		t.Run(name, func(t *testing.T) { f(t, addr) })
	}
}

func TestPutGetDelete(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		s := startServer(t, a, small())
		c := dial(t, a)
		values := map[string][]byte{
			"inline":     []byte("a short value"),
			"heap":       bytes.Repeat([]byte("0123456789"), 100),
			"empty":      {},
			"exactly-80": bytes.Repeat([]byte{7}, InlineCap-len("exactly-80")),
		}
		for k, v := range values {
			if err := c.Put([]byte(k), v); err != nil {
				t.Fatalf("put %s: %v", k, err)
			}
		}
		for k, v := range values {
			got, err := c.Get([]byte(k))
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get %s = %q, %v; want %q", k, got, err, v)
			}
		}
		// Overwrite, inline to heap and back.
		if err := c.Put([]byte("inline"), values["heap"]); err != nil {
			t.Fatal(err)
		}
		if got, _ := c.Get([]byte("inline")); !bytes.Equal(got, values["heap"]) {
			t.Fatalf("after overwrite got %d bytes", len(got))
		}
		if err := c.Put([]byte("heap"), []byte("now inline")); err != nil {
			t.Fatal(err)
		}
		if got, _ := c.Get([]byte("heap")); string(got) != "now inline" {
			t.Fatalf("after overwrite got %q", got)
		}
		if err := c.Delete([]byte("heap")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get([]byte("heap")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get after delete: %v, want ErrNotFound", err)
		}
		if err := c.Delete([]byte("heap")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v, want ErrNotFound", err)
		}
		if _, err := c.Get([]byte("never")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get of a missing key: %v, want ErrNotFound", err)
		}
		// GETs were one-sided: the server served no GET RPC.
		if n := s.Gets.Load(); n != 0 {
			t.Fatalf("the server served %d GETs; GET must be one-sided", n)
		}
		buf := make([]byte, 4)
		if n, err := c.GetInto([]byte("inline"), buf); n != len(values["heap"]) || err == nil {
			t.Fatalf("GetInto a short buffer: %d, %v; want the full length and an error", n, err)
		}
	})
}

func TestBadInput(t *testing.T) {
	a := addrs()["loop"]()
	startServer(t, a, Config{Buckets: 1, SlotsPerBucket: 2, MaxValue: 1024, HeapBytes: 1 << 16, RecvDepth: 2})
	c := dial(t, a)
	if err := c.Put(bytes.Repeat([]byte("k"), MaxKey+1), nil); !errors.Is(err, ErrKeyTooLarge) {
		t.Fatalf("oversize key: %v", err)
	}
	if err := c.Put([]byte("k"), make([]byte, 4096)); !errors.Is(err, ErrValueTooLarge) {
		t.Fatalf("oversize value: %v", err)
	}
	for _, k := range []string{"a", "b"} {
		if err := c.Put([]byte(k), []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Put([]byte("c"), []byte("c")); !errors.Is(err, ErrTableFull) {
		t.Fatalf("third key in a 2-slot table: %v, want ErrTableFull", err)
	}
	if got, err := c.Get([]byte("a")); err != nil || string(got) != "a" {
		t.Fatalf("after a refused PUT: %q, %v", got, err)
	}
}

// TestMaxValueLimit: a server takes values of MaxValueLimit bytes, with
// a key of MaxKey, and refuses a MaxValue above it; a client refuses a
// server that describes larger messages (it would allocate buffers of
// that size), saying why.
func TestMaxValueLimit(t *testing.T) {
	for _, name := range []string{"loop", "shm"} {
		a := addrs()[name]()
		startServer(t, a, Config{MaxValue: MaxValueLimit, HeapBytes: 3 * MaxValueLimit, Buckets: 16, RecvDepth: 2})
		c := dial(t, a)
		key := bytes.Repeat([]byte("k"), MaxKey)
		val := bytes.Repeat([]byte{7}, MaxValueLimit)
		if err := c.Put(key, val); err != nil {
			t.Fatalf("%s: Put of MaxValueLimit bytes under a %d-byte key: %v", name, MaxKey, err)
		}
		if got, err := c.Get(key); err != nil || !bytes.Equal(got, val) {
			t.Fatalf("%s: Get of MaxValueLimit bytes: %d bytes, %v", name, len(got), err)
		}
		if err := c.Put(key, append(val, 1)); !errors.Is(err, ErrValueTooLarge) {
			t.Fatalf("%s: Put of MaxValueLimit+1 bytes: %v, want ErrValueTooLarge", name, err)
		}
	}
	if _, err := Listen(addrs()["loop"](), Config{MaxValue: MaxValueLimit + 1}); err == nil || !strings.Contains(err.Error(), "MaxValueLimit") {
		t.Fatalf("Listen with MaxValue over the limit: %v", err)
	}
	for _, maxMsg := range []int{requestHeader + MaxKey + MaxValueLimit + 1, 1<<32 - 1} {
		b := indexInfo{slotsPerBucket: 4, buckets: 16, maxMsg: maxMsg, addr: 4096}.encode(1, nil)
		if _, _, err := decodeInfo(b); !errors.Is(err, errInfo) || !strings.Contains(err.Error(), "MaxValueLimit") {
			t.Fatalf("decodeInfo of a %d-byte largest message: %v, want errInfo naming MaxValueLimit", maxMsg, err)
		}
	}
}

// TestReconnect: a client whose server restarts at the same address
// reconnects by itself; while the server is gone it gets ErrServerGone.
func TestReconnect(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		s, err := Listen(a, small())
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, a)
		if err := c.Put([]byte("k"), []byte("v1")); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := c.Get([]byte("k")); !errors.Is(err, ErrServerGone) {
			t.Fatalf("get with the server gone: %v, want ErrServerGone", err)
		}
		startServer(t, a, small())
		if err := c.Put([]byte("k"), []byte("v2")); err != nil {
			t.Fatalf("put after the restart: %v", err)
		}
		if got, err := c.Get([]byte("k")); err != nil || string(got) != "v2" {
			t.Fatalf("get after the restart: %q, %v", got, err)
		}
		if c.Reconnects.Load() == 0 {
			t.Fatal("no reconnect was counted")
		}
	})
}

// kvInput and kvOutput are porcupine's view of one operation.
type kvInput struct {
	op    uint8 // opPut, opDel, opGet
	key   string
	value string
}

type kvOutput struct {
	value string
	found bool
}

// kvModel is a map of keys to values, partitioned by key.
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(kvInput).key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return kvOutput{} },
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(kvOutput), input.(kvInput), output.(kvOutput)
		switch in.op {
		case opPut:
			return true, kvOutput{value: in.value, found: true}
		case opDel:
			return out.found == st.found, kvOutput{}
		default:
			return out == st, st
		}
	},
	Equal: func(a, b any) bool { return a == b },
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvInput), output.(kvOutput)
		return fmt.Sprintf("op%d(%s,%q) -> %q %v", in.op, in.key, in.value, out.value, out.found)
	},
}

// runHistory has clients issue random GET, PUT and DELETE on a few keys
// concurrently and records the history.
func runHistory(t *testing.T, addr string, clients, opsEach int, valueSize func(i int) int) []porcupine.Operation {
	var mu sync.Mutex
	var history []porcupine.Operation
	start := time.Now()
	var wg sync.WaitGroup
	for id := range clients {
		c := dial(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range opsEach {
				key := fmt.Sprintf("key%d", (id*7+i*3)%3)
				in := kvInput{key: key}
				var out kvOutput
				call := time.Since(start).Nanoseconds()
				switch (id + i) % 4 {
				case 0, 1:
					in.op = opGet
					v, err := c.Get([]byte(key))
					switch {
					case err == nil:
						out = kvOutput{value: string(v), found: true}
					case !errors.Is(err, ErrNotFound):
						t.Errorf("get: %v", err)
						return
					}
				case 2:
					in.op = opPut
					tag := fmt.Sprintf("%d.%d,", id, i)
					in.value = strings.Repeat(tag, valueSize(i)/len(tag)+1)[:valueSize(i)]
					if err := c.Put([]byte(key), []byte(in.value)); err != nil {
						t.Errorf("put: %v", err)
						return
					}
					out = kvOutput{value: in.value, found: true}
				case 3:
					in.op = opDel
					err := c.Delete([]byte(key))
					if err != nil && !errors.Is(err, ErrNotFound) {
						t.Errorf("delete: %v", err)
						return
					}
					out.found = err == nil
				}
				ret := time.Since(start).Nanoseconds()
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: id, Input: in, Output: out, Call: call, Return: ret})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return history
}

// TestLinearizable checks with porcupine that concurrent GET (one-sided),
// PUT and DELETE are linearizable, with inline and heap values.
func TestLinearizable(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		startServer(t, a, small())
		hist := runHistory(t, a, 4, 300, func(i int) int { return []int{8, 64, 700, 3000}[i%4] })
		res := porcupine.CheckOperationsTimeout(kvModel, hist, 30*time.Second)
		if res == porcupine.Illegal {
			t.Fatalf("history of %d operations is not linearizable", len(hist))
		}
		t.Logf("%d operations: %v", len(hist), res)
	})
}

// TestTornReads proves that GETs detect torn reads and retry them. A GET
// of a slot the server holds half written sees it torn (every time, not
// when a race happens to go that way) and returns a value that was PUT;
// and GETs raced with a server that writes slots and records a few bytes
// at a time, and reuses freed records at once, return only values that
// were PUT.
func TestTornReads(t *testing.T) {
	a := addrs()["shm"]()
	cfg := small()
	cfg.slowWrites = true
	cfg.Grace = -1 // reuse record space immediately
	// A pause armed holds the server's next slot write half done:
	// torn closes when it is, and the write goes on once resume closes.
	type pause struct{ torn, resume chan struct{} }
	armed := make(chan pause, 1)
	cfg.slotTorn = func() {
		select {
		case p := <-armed:
			close(p.torn)
			<-p.resume
		default:
		}
	}
	startServer(t, a, cfg)
	w, r := dial(t, a), dial(t, a)
	sawTorn := make(chan struct{}, 1)
	r.tornRead = func() {
		select {
		case sawTorn <- struct{}{}:
		default:
		}
	}
	valid := map[string]bool{}
	var vals []string
	for i := range 8 {
		v := strings.Repeat(fmt.Sprintf("<%d>", i), 60+i*13) // heap records
		if i%2 == 1 {
			v = v[:40] // inline
		}
		vals = append(vals, v)
		valid[v] = true
	}

	// Replace each value with the next (heap and inline in turn), the
	// slot held half written, and GET the key meanwhile.
	if err := w.Put([]byte("k"), []byte(vals[0])); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(vals); i++ {
		old, next := vals[i-1], vals[i]
		if v, err := r.Get([]byte("k")); err != nil || string(v) != old {
			t.Fatalf("GET before replacing the value: %q, %v; want %q", v, err, old)
		}
		select {
		case <-sawTorn: // left by a retry of the GET before
		default:
		}
		p := pause{torn: make(chan struct{}), resume: make(chan struct{})}
		armed <- p
		put := make(chan error, 1)
		go func() { put <- w.Put([]byte("k"), []byte(next)) }()
		<-p.torn
		type result struct {
			v   []byte
			err error
		}
		get := make(chan result, 1)
		go func() {
			v, err := r.Get([]byte("k"))
			get <- result{v, err}
		}()
		var early *result
		select {
		case <-sawTorn:
		case res := <-get:
			early = &res
		}
		close(p.resume)
		if err := <-put; err != nil {
			t.Fatalf("PUT %d: %v", i, err)
		}
		if early != nil {
			t.Fatalf("GET of a slot held half written returned %q, %v without seeing it torn", early.v, early.err)
		}
		res := <-get
		if res.err != nil || (string(res.v) != old && string(res.v) != next) {
			t.Fatalf("GET racing PUT %d returned %q, %v; want the value before or after it", i, res.v, res.err)
		}
	}

	// Race GETs with PUTs.
	torn, fallbacks := r.TornReads.Load(), r.FallbackGets.Load()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var err error
		for i := 0; err == nil; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			err = w.Put([]byte("k"), []byte(vals[i%len(vals)]))
		}
		done <- err
	}()
	for range 3000 {
		v, err := r.Get([]byte("k"))
		if err != nil && !errors.Is(err, ErrNotFound) {
			close(stop)
			<-done
			t.Fatalf("get: %v", err)
		}
		if err == nil && !valid[string(v)] {
			close(stop)
			<-done
			t.Fatalf("get returned a value that was never put: %q", v)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("held half written: %d torn reads, %d fallback GETs; raced: %d torn reads, %d fallback GETs",
		torn, fallbacks, r.TornReads.Load()-torn, r.FallbackGets.Load()-fallbacks)
}

// TestGetWhileServerStopped proves GET is one-sided: with the server's
// process stopped by SIGSTOP, GETs of inline and heap values keep
// succeeding, and a PUT (an RPC) cannot.
func TestGetWhileServerStopped(t *testing.T) {
	a := addrs()["shm"]()
	srv := startChildServer(t, a)
	c := dial(t, a)
	want := map[string][]byte{"inline": []byte("small"), "heap": bytes.Repeat([]byte("big!"), 500)}
	for k, v := range want {
		if err := c.Put([]byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Signal(syscall.SIGCONT)
	for i := range 1000 {
		for k, v := range want {
			got, err := c.Get([]byte(k))
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("GET %d of %s with the server stopped: %d bytes, %v", i, k, len(got), err)
			}
		}
	}
	if _, err := c.Get([]byte("absent")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GET of an absent key with the server stopped: %v", err)
	}
	if err := srv.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := c.Put([]byte("after"), []byte("resumed")); err != nil {
		t.Fatalf("PUT after SIGCONT: %v", err)
	}
}

// TestCachedLocationSuperseded: a client that read a heap value reads it
// next time where it found it; once another client replaces or deletes
// the key, that record is marked superseded, and the first client gets
// the new value (or ErrNotFound) — and, with the server's heap reusing
// space at once (no grace), never a value that was not current.
func TestCachedLocationSuperseded(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		cfg := small()
		cfg.Grace = -1 // reuse retired records at once
		startServer(t, a, cfg)
		reader, writer := dial(t, a), dial(t, a)
		key := []byte("cached-key")
		val := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 200+i) }
		for i := range 40 {
			if err := writer.Put(key, val(i)); err != nil {
				t.Fatal(err)
			}
			for range 2 { // the second GET reads the remembered record
				got, err := reader.Get(key)
				if err != nil || !bytes.Equal(got, val(i)) {
					t.Fatalf("round %d: GET %d bytes %q..., %v; want the %d bytes just put", i, len(got), got[:min(len(got), 4)], err, len(val(i)))
				}
			}
		}
		if err := writer.Delete(key); err != nil {
			t.Fatal(err)
		}
		if _, err := reader.Get(key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GET after DELETE: %v, want ErrNotFound", err)
		}
		if n := reader.CachedGets.Load(); n < 40 {
			t.Fatalf("%d GETs read a remembered record, want at least the 40 second GETs", n)
		}
	})
}

// TestPutRemembersLocation: a PUT's reply tells the client where its heap
// value went, so the client's next GET of the key reads the record
// directly (one Read), while a value stored inline, or a deleted key,
// leaves nothing remembered.
func TestPutRemembersLocation(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		startServer(t, a, small())
		c := dial(t, a)
		key := []byte("put-then-get")
		for i := range 10 {
			val := bytes.Repeat([]byte{byte('a' + i)}, 300+i)
			if err := c.Put(key, val); err != nil {
				t.Fatal(err)
			}
			before := c.CachedGets.Load()
			got, err := c.Get(key)
			if err != nil || !bytes.Equal(got, val) {
				t.Fatalf("round %d: GET %d bytes, %v; want the %d bytes just put", i, len(got), err, len(val))
			}
			if c.CachedGets.Load() != before+1 {
				t.Fatalf("round %d: the GET after a PUT did not read the record where the PUT's reply said it was", i)
			}
		}
		if err := c.Put(key, []byte("tiny")); err != nil { // inline
			t.Fatal(err)
		}
		before := c.CachedGets.Load()
		if got, err := c.Get(key); err != nil || string(got) != "tiny" {
			t.Fatalf("GET of an inline value: %q, %v", got, err)
		}
		if c.CachedGets.Load() != before {
			t.Fatal("a GET of an inline value read a remembered heap record")
		}
		if err := c.Delete(key); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GET after DELETE: %v, want ErrNotFound", err)
		}
	})
}

// TestRememberTakesOnlyValidHeapSlots: a PUT reply's slot becomes the
// key's remembered location only if it is a sealed heap slot of the key's
// hash; anything else forgets what was remembered for the key.
func TestRememberTakesOnlyValidHeapSlots(t *testing.T) {
	c := &Client{locs: make([]recordLoc, locEntries), heapKeys: []uint32{0x41, 0x42}}
	key := []byte("remembered")
	h := hashKey(key)
	loc := &c.locs[h%uint64(len(c.locs))]
	heap := func(hash uint64) slot {
		s := make(slot, SlotSize)
		s.setHeap(7, hash, len(key), 300, 0x1000, recordLen(len(key), 300), 1)
		return s
	}
	c.remember(key, heap(h))
	if *loc != (recordLoc{hash: h, version: 7, addr: 0x1000, rkey: 0x42, length: uint32(recordLen(len(key), 300))}) {
		t.Fatalf("a valid heap slot was remembered as %+v", *loc)
	}
	torn := heap(h)
	torn[33] ^= 1 // the address, under the slot's CRC
	inline := make(slot, SlotSize)
	inline.setInline(8, h, key, []byte("v"))
	for _, bad := range []struct {
		name string
		s    slot
	}{{"a torn slot", torn}, {"an inline slot", inline}, {"no slot", nil}, {"another key's slot", heap(h + 1)}} {
		c.remember(key, heap(h))
		c.remember(key, bad.s)
		if loc.length != 0 {
			t.Fatalf("after %s the key's location is still remembered: %+v", bad.name, *loc)
		}
	}
}

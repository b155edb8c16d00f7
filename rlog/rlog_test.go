package rlog

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
	_ "github.com/goverbs/goverbs/provider/loop"
	_ "github.com/goverbs/goverbs/provider/shm"
)

func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	code := m.Run()
	if goverbsBin != "" {
		os.RemoveAll(filepath.Dir(goverbsBin))
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var serial atomic.Int64

// cluster is n members in this process.
type cluster struct {
	t       testing.TB
	addrs   []string
	dirs    []string
	members []*Member
	cfg     Config
	logs    []*testLogf
	hooks   []*hooks // per member, if set
	events  chan struct{}
	subs    []<-chan struct{}
	unsubs  []func()
}

// testLogf collects a member's diagnostics.
type testLogf struct {
	mu     sync.Mutex
	lines  []string
	t      testing.TB
	events chan struct{}
}

func (l *testLogf) logf(format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
	select {
	case l.events <- struct{}{}:
	default:
	}
	if testing.Verbose() {
		l.t.Logf(format, args...)
	}
}

func (l *testLogf) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if bytes.Contains([]byte(s), []byte(sub)) {
			return true
		}
	}
	return false
}

// smallConfig is a configuration with small buffers, so that batches,
// chunks and segments turn over quickly.
func smallConfig() Config {
	return Config{Secret: testSecret, BufferSize: 16 << 10, MaxRecord: 1024, CacheBuffers: 4, SegmentBytes: 32 << 10, ClientDepth: 8,
		DialTimeout: 2 * time.Second, PromoteTimeout: 10 * time.Second}
}

func newCluster(t testing.TB, scheme string, n int, cfg Config) *cluster {
	t.Helper()
	c := &cluster{t: t, cfg: cfg, events: make(chan struct{}, 1), subs: make([]<-chan struct{}, n), unsubs: make([]func(), n)}
	id := serial.Add(1)
	for i := range n {
		switch scheme {
		case "loop":
			c.addrs = append(c.addrs, fmt.Sprintf("loop://rlog-%d-%d", id, i))
		case "shm":
			c.addrs = append(c.addrs, fmt.Sprintf("shm://@goverbs-rlog-%d-%d-%d", os.Getpid(), id, i))
		case "tcp":
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			c.addrs = append(c.addrs, "tcp://"+l.Addr().String())
			l.Close()
		}
		c.dirs = append(c.dirs, filepath.Join(t.TempDir(), fmt.Sprint(i)))
		c.logs = append(c.logs, &testLogf{t: t, events: c.events})
	}
	c.members = make([]*Member, n)
	t.Cleanup(func() {
		for _, m := range c.members {
			if m != nil {
				m.Close()
			}
		}
	})
	return c
}

func (c *cluster) config(i int, primary bool) Config {
	cfg := c.cfg
	cfg.Dir, cfg.Listen, cfg.Members, cfg.Primary = c.dirs[i], c.addrs[i], c.addrs, primary
	cfg.Logf = c.logs[i].logf
	if c.hooks != nil {
		cfg.hooks = c.hooks[i]
	}
	return cfg
}

// start starts member i.
func (c *cluster) start(i int, primary bool) *Member {
	c.t.Helper()
	m, err := c.startErr(i, primary)
	if err != nil {
		c.t.Fatalf("start member %d: %v", i, err)
	}
	return m
}

func (c *cluster) startErr(i int, primary bool) (*Member, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := Start(ctx, c.config(i, primary))
	if err == nil {
		c.members[i] = m
		c.subs[i], c.unsubs[i] = m.log.subscribe()
	}
	return m, err
}

// stop closes member i.
func (c *cluster) stop(i int) {
	if c.members[i] != nil {
		c.unsubs[i]()
		c.members[i].Close()
		c.members[i], c.subs[i] = nil, nil
	}
}

// waitFor waits until cond holds, checking it whenever a member's log
// becomes durable further or a member reports something, for a bounded
// time.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for !cond() {
		cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)}, {Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.events)}}
		for _, ch := range c.subs {
			if ch != nil {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
			}
		}
		if i, _, _ := reflect.Select(cases); i == 0 {
			c.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (c *cluster) dial() *Client {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := Dial(ctx, c.addrs...)
	if err != nil {
		c.t.Fatalf("dial: %v", err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// records reads member i's log from its directory.
func (c *cluster) records(i int) []Record {
	c.t.Helper()
	var out []Record
	if _, err := ScanDir(c.dirs[i], 1, func(r Record) error {
		r.Data = bytes.Clone(r.Data)
		out = append(out, r)
		return nil
	}); err != nil {
		c.t.Fatalf("scan member %d: %v", i, err)
	}
	return out
}

// waitDurable waits until member i holds records up to seq durably.
func (c *cluster) waitDurable(i int, seq uint64) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("member %d to hold record %d durably", i, seq), func() bool { return c.members[i].Status().Durable >= seq })
}

func appendN(t *testing.T, cl *Client, n int, prefix string) []uint64 {
	t.Helper()
	var seqs []uint64
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		seq, err := cl.Append(ctx, []byte(fmt.Sprintf("%s-%d", prefix, i)))
		cancel()
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		seqs = append(seqs, seq)
	}
	return seqs
}

func TestBasic(t *testing.T) {
	for _, scheme := range []string{"loop", "shm"} {
		for _, mode := range []Mode{ModeWrite, ModeSend} {
			t.Run(scheme+"/"+mode.String(), func(t *testing.T) {
				cfg := smallConfig()
				cfg.Mode = mode
				c := newCluster(t, scheme, 3, cfg)
				c.start(1, false)
				c.start(2, false)
				c.start(0, true)
				cl := c.dial()
				seqs := appendN(t, cl, 200, "rec")
				for i, s := range seqs {
					if s != uint64(i+1) {
						t.Fatalf("append %d got seq %d", i, s)
					}
				}
				for i := range 3 {
					c.waitDurable(i, 200)
					recs := c.records(i)
					if len(recs) != 200 {
						t.Fatalf("member %d holds %d records", i, len(recs))
					}
					for k, r := range recs {
						if want := fmt.Sprintf("rec-%d", k); string(r.Data) != want || r.Seq != uint64(k+1) {
							t.Fatalf("member %d record %d = %d %q, want %q", i, k, r.Seq, r.Data, want)
						}
					}
				}
			})
		}
	}
}

// testSecret is the cluster secret of the tests' members.
var testSecret = []byte("the rlog tests' cluster secret, 41 bytes")

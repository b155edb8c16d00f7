package rlog

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The crash test runs a log of three `goverbs log serve` processes under
// load from two clients in this process, and kills a member with SIGKILL
// at a random moment, round after round — the primary or a replica —
// restarting it each time. A killed primary is restarted as primary
// (with --primary, which promotes it again), or the test fails over:
// it kills another member too and starts that one as primary, and the
// old primary as a replica. At the end it kills all three, and checks every member's log:
// each is a valid log (checksums, consecutive sequence numbers, epochs
// that never decrease) and a prefix of the longest; every record in them
// is one a client appended, intact, with no duplicates and each client's
// records in the order it appended them; every acknowledged record is at
// its acknowledged sequence number in a majority of the logs. Then it
// opens each log as a member does, which truncates a torn tail, and
// checks that nothing else changed.
//
// Throughout the rounds an intruder — a peer that is not a member —
// asks the members to take records from it, to let it fetch, and to
// promise it a huge epoch, injecting a truncating START and forged
// records; no member may answer it, and the checks above hold.
//
// RLOG_CRASH_ROUNDS sets the number of rounds (default 50).

var (
	buildOnce  sync.Once
	goverbsBin string
	buildErr   error
)

// goverbsCommand builds cmd/goverbs once (pure Go, no race detector: the
// members are the processes being killed; the race detector watches this
// process's clients).
func goverbsCommand(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "goverbs-rlog-crash-")
		if err != nil {
			buildErr = err
			return
		}
		goverbsBin = filepath.Join(dir, "goverbs")
		gocmd, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("no go command on PATH: %w", err)
			return
		}
		cmd := exec.Command(gocmd, "build", "-buildvcs=false", "-o", goverbsBin, "github.com/goverbs/goverbs/cmd/goverbs")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/goverbs: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return goverbsBin // TestMain removes it
}

// member is a `goverbs log serve` process.
type memberProc struct {
	cmd  *exec.Cmd
	exit chan struct{}
}

type crashCluster struct {
	t      *testing.T
	bin    string
	addrs  []string
	dirs   []string
	logs   []*os.File
	procs  []*memberProc
	starts int
	secret string // the members' --secret-file
}

func (c *crashCluster) start(i int, primary bool) {
	c.t.Helper()
	if c.secret == "" {
		c.secret = filepath.Join(c.t.TempDir(), "secret")
		if err := os.WriteFile(c.secret, testSecret, 0o600); err != nil {
			c.t.Fatal(err)
		}
	}
	args := []string{"log", "serve", "-v", "--data", c.dirs[i], "--listen", c.addrs[i], "--members", strings.Join(c.addrs, ","), "--secret-file", c.secret,
		"--buffer-size", "64K", "--max-record", "4K", "--segment-size", "256K"}
	if primary {
		args = append(args, "--primary")
	}
	cmd := exec.Command(c.bin, args...)
	cmd.Stderr = c.logs[i]
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	p := &memberProc{cmd: cmd, exit: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		ready <- line
		for {
			if _, err := r.ReadString('\n'); err != nil {
				break
			}
		}
		cmd.Wait()
		close(p.exit)
	}()
	c.procs[i] = p
	c.starts++
	timer := time.NewTimer(60 * time.Second)
	defer timer.Stop()
	select {
	case line := <-ready:
		if !strings.HasPrefix(line, "serving ") {
			c.t.Fatalf("member %d did not start: %q (see %s)", i, line, c.logs[i].Name())
		}
	case <-timer.C:
		c.kill(i)
		c.t.Fatalf("member %d did not start within a minute (see %s)", i, c.logs[i].Name())
	}
}

// kill kills member i with SIGKILL and waits for it to be gone.
func (c *crashCluster) kill(i int) {
	p := c.procs[i]
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exit
	c.procs[i] = nil
}

// crashRecord is a record the load appends: client, number, random
// filler, and a CRC-32C of the rest, so that a record can be checked
// alone.
func crashRecord(client, n int, rng *rand.Rand) []byte {
	b := fmt.Appendf(nil, "c%d n%d ", client, n)
	fill := rng.IntN(2000)
	for range fill {
		b = append(b, byte('a'+rng.IntN(26)))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseCrashRecord checks a record and returns its client and number.
func parseCrashRecord(b []byte) (client, n int, ok bool) {
	if len(b) < 4 || crc32.Checksum(b[:len(b)-4], castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return 0, 0, false
	}
	f := strings.Fields(string(b[:len(b)-4]))
	if len(f) < 2 || !strings.HasPrefix(f[0], "c") || !strings.HasPrefix(f[1], "n") {
		return 0, 0, false
	}
	c, err1 := strconv.Atoi(f[0][1:])
	n, err2 := strconv.Atoi(f[1][1:])
	return c, n, err1 == nil && err2 == nil
}

type crashAck struct {
	seq    uint64
	client int
	n      int
	data   []byte
}

func TestCrash(t *testing.T) {
	rounds := 50
	if s := os.Getenv("RLOG_CRASH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	began := time.Now()
	c := &crashCluster{t: t, bin: goverbsCommand(t), procs: make([]*memberProc, 3)}
	base := t.TempDir()
	for i := range 3 {
		c.addrs = append(c.addrs, fmt.Sprintf("shm://@goverbs-rlog-crash-%d-%d", os.Getpid(), i))
		c.dirs = append(c.dirs, filepath.Join(base, fmt.Sprint(i)))
		f, err := os.Create(filepath.Join(base, fmt.Sprintf("member%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c.logs = append(c.logs, f)
	}
	defer func() {
		for i := range 3 {
			c.kill(i)
		}
		if t.Failed() || os.Getenv("RLOG_CRASH_SHOW") != "" {
			for i := range 3 {
				b, _ := os.ReadFile(c.logs[i].Name())
				t.Logf("member %d's diagnostics (last 4 KiB):\n%s", i, b[max(0, len(b)-4096):])
			}
		}
	}()
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)

	// The load: two clients appending as fast as they are acknowledged.
	var (
		mu       sync.Mutex
		acks     []crashAck
		unknown  int
		acked    atomic.Int64
		progress = make(chan struct{}, 1)
		loadErr  atomic.Pointer[error]
	)
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for client := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(client), uint64(time.Now().UnixNano())))
			dctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			cl, err := Dial(dctx, c.addrs...)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					loadErr.Store(&err)
				}
				return
			}
			defer cl.Close()
			for n := 1; ctx.Err() == nil; n++ {
				rec := crashRecord(client, n, rng)
				actx, cancel := context.WithTimeout(ctx, 60*time.Second)
				seq, err := cl.Append(actx, rec)
				cancel()
				switch {
				case err == nil:
					mu.Lock()
					acks = append(acks, crashAck{seq: seq, client: client, n: n, data: rec})
					mu.Unlock()
					acked.Add(1)
					select {
					case progress <- struct{}{}:
					default:
					}
				case ctx.Err() != nil:
					return
				case errors.Is(err, ErrOutcomeUnknown), errors.Is(err, ErrUnavailable):
					mu.Lock()
					unknown++
					mu.Unlock()
				default:
					loadErr.Store(&err)
					return
				}
			}
		}()
	}
	// waitProgress waits until the clients have had k more appends
	// acknowledged.
	waitProgress := func(what string, k int64) {
		t.Helper()
		target := acked.Load() + k
		timer := time.NewTimer(60 * time.Second)
		defer timer.Stop()
		for acked.Load() < target {
			select {
			case <-progress:
			case <-timer.C:
				t.Fatalf("%s: no progress within a minute (%d acknowledged)", what, acked.Load())
			}
			if p := loadErr.Load(); p != nil {
				t.Fatalf("%s: the load failed: %v", what, *p)
			}
		}
	}
	waitProgress("start", 20)

	// The intruder: a peer that is not a member attacks the members
	// throughout the rounds, one attempt after another — replicate,
	// fetch and fence requests of epoch 2^62 with a made-up member id
	// and a secret of its own, followed at once by a START truncating
	// the log to nothing and forged records, or silence.
	var intrusions, intruderAnswered atomic.Int64
	ictx, stopIntruder := context.WithCancel(context.Background())
	intruderDone := make(chan struct{})
	go func() {
		defer close(intruderDone)
		kinds := []uint8{kindReplicate, kindFetch, kindFence}
		for n := 0; ictx.Err() == nil; n++ {
			res := intrude(ictx, c.addrs[n%3], c.addrs, kinds[n/3%3], 1<<62, n/9%4 == 3)
			intrusions.Add(1)
			if res.answered {
				intruderAnswered.Add(1)
			}
		}
	}()
	defer func() {
		stopIntruder()
		<-intruderDone
	}()

	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	kills := map[string]int{}
	prim := 0
	for round := range rounds {
		// Kill at a random moment under load.
		delay := time.NewTimer(time.Duration(5+rng.IntN(150)) * time.Millisecond)
		<-delay.C
		victim := rng.IntN(3)
		if rng.IntN(5) < 2 {
			victim = prim
		}
		c.kill(victim)
		switch {
		case victim != prim:
			kills["replica"]++
			c.start(victim, false)
		case rng.IntN(2) == 0:
			kills["primary, restarted as primary"]++
			c.start(victim, true)
		default:
			// Fail over: promote another member (killed too, then
			// started as primary), and restart the old primary as a
			// replica, whose log may hold records it wrote and never
			// replicated: they must go.
			kills["primary, failed over"]++
			next := (prim + 1 + rng.IntN(2)) % 3
			c.kill(next)
			c.start(next, true)
			c.start(prim, false)
			prim = next
		}
		waitProgress(fmt.Sprintf("round %d (member %d restarted; primary %d)", round, victim, prim), 5)
	}
	// Before the final crash, every member takes records from the current
	// primary, so that any tail an old primary wrote and never replicated
	// is gone (the logs are prefixes of one another only then).
	converged := time.Now().Add(60 * time.Second)
	for {
		epochs := make([]uint64, 3)
		for i := range 3 {
			ScanDir(c.dirs[i], 1, func(r Record) error { epochs[i] = r.Epoch; return nil })
		}
		if epochs[0] == epochs[1] && epochs[1] == epochs[2] {
			break
		}
		if time.Now().After(converged) {
			t.Fatalf("the members' logs end in epochs %v a minute after the last round", epochs)
		}
		waitProgress("converging", 1)
	}

	stopIntruder()
	<-intruderDone
	if intruderAnswered.Load() > 0 || intrusions.Load() == 0 {
		t.Fatalf("the intruder got through %d times in %d attempts", intruderAnswered.Load(), intrusions.Load())
	}
	t.Logf("the intruder made %d attempts; none was answered", intrusions.Load())

	// The final crash: all three at once, under load.
	for i := range 3 {
		c.kill(i)
	}
	stopLoad()
	wg.Wait()
	if p := loadErr.Load(); p != nil {
		t.Fatalf("the load failed: %v", *p)
	}

	logs := make([][]Record, 3)
	for i := range 3 {
		res, err := ScanDir(c.dirs[i], 1, func(r Record) error {
			r.Data = append([]byte(nil), r.Data...)
			logs[i] = append(logs[i], r)
			return nil
		})
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		if res.Torn > 0 {
			t.Logf("member %d: a torn tail of %d bytes", i, res.Torn)
		}
	}
	longest := logs[0]
	for _, l := range logs {
		if len(l) > len(longest) {
			longest = l
		}
	}
	for i, l := range logs {
		for k, r := range l {
			o := longest[k]
			if r.Seq != o.Seq || r.Epoch != o.Epoch || string(r.Data) != string(o.Data) {
				t.Fatalf("member %d: record %d (epoch %d) differs from the longest log's (epoch %d): the logs are not prefixes of one another", i, r.Seq, r.Epoch, o.Epoch)
			}
		}
	}
	lastN := map[int]int{}
	for _, r := range longest {
		client, n, ok := parseCrashRecord(r.Data)
		if !ok {
			t.Fatalf("record %d is not a record the clients appended: %q", r.Seq, r.Data[:min(len(r.Data), 40)])
		}
		if n <= lastN[client] {
			t.Fatalf("record %d is client %d's append %d, after its append %d: duplicated or out of order", r.Seq, client, n, lastN[client])
		}
		lastN[client] = n
	}
	for _, a := range acks {
		holders := 0
		for _, l := range logs {
			if a.seq <= uint64(len(l)) && string(l[a.seq-1].Data) == string(a.data) {
				holders++
			}
		}
		if holders < 2 {
			t.Fatalf("acknowledged record %d (client %d's append %d) is in %d logs, not a majority", a.seq, a.client, a.n, holders)
		}
	}
	// Open each log as a member does: a torn tail goes, nothing else.
	for i := range 3 {
		l, err := openLog(c.dirs[i], logOptions{})
		if err != nil {
			t.Fatalf("member %d: reopen: %v", i, err)
		}
		last, _ := l.Last()
		l.close()
		if last != uint64(len(logs[i])) {
			t.Fatalf("member %d: reopened, the log ends at %d, not %d", i, last, len(logs[i]))
		}
		res, err := ScanDir(c.dirs[i], 1, func(Record) error { return nil })
		if err != nil || res.Torn != 0 || res.Last != last {
			t.Fatalf("member %d after reopening: %+v, %v", i, res, err)
		}
	}
	// The members' diagnostics must show no protocol violation, refused
	// batch or internal error: crashes alone cause none.
	for i := range 3 {
		b, err := os.ReadFile(c.logs[i].Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, bad := range []string{"protocol violation", "internal error", "refused a batch", "panic", "corrupt"} {
				if strings.Contains(line, bad) {
					t.Errorf("member %d: %s", i, line)
				}
			}
		}
	}
	t.Logf("%d rounds (kills: %v), then all three killed at once; %d appends acknowledged, %d with an unknown outcome; logs of %d, %d and %d records, each a prefix of the longest; every acknowledged record on a majority; %v",
		rounds, kills, len(acks), unknown, len(logs[0]), len(logs[1]), len(logs[2]), time.Since(began).Round(time.Second))
}

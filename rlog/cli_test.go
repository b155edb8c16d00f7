package rlog

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommand drives `goverbs log` as an operator would: three members,
// appends from the arguments and from stdin, tail, the primary stopped,
// a replica promoted with `log promote` and served with --primary, and
// the old primary back as a replica.
func TestCommand(t *testing.T) {
	bin := goverbsCommand(t)
	base := t.TempDir()
	c := &crashCluster{t: t, bin: bin, procs: make([]*memberProc, 3)}
	for i := range 3 {
		c.addrs = append(c.addrs, fmt.Sprintf("shm://@goverbs-rlog-cli-%d-%d", os.Getpid(), i))
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
	}()
	members := strings.Join(c.addrs, ",")
	run := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), code
	}
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	out, errOut, code := run("", "log", "append", "--addr", members, "first", "second")
	if code != 0 || out != "1\n2\n" {
		t.Fatalf("log append: %q %q %d", out, errOut, code)
	}
	out, _, code = run("third\nfourth\n", "log", "append", "-a", members)
	if code != 0 || out != "3\n4\n" {
		t.Fatalf("log append from stdin: %q %d", out, code)
	}
	_, errOut, code = run("", "log", "append", "-a", members, strings.Repeat("x", 5000))
	if code != 1 || !strings.Contains(errOut, "larger than the log's MaxRecord: 5000 bytes; the log takes at most 4096") {
		t.Fatalf("an oversize record: %q, exit %d", errOut, code)
	}
	c.kill(0)
	c.kill(1)
	out, errOut, code = run("", "log", "tail", "--data", c.dirs[1], "-n", "2")
	if code != 0 || !strings.Contains(out, `3	epoch 1	5 bytes	"third"`) || !strings.Contains(out, `4	epoch 1	6 bytes	"fourth"`) || !strings.Contains(out, "records 1 to 4") {
		t.Fatalf("log tail: %q %q", out, errOut)
	}
	out, errOut, code = run("", "log", "tail", "--data", c.dirs[1], "-n", "0")
	if code != 0 || strings.Contains(out, "epoch 1\t") || !strings.Contains(out, "records 1 to 4") {
		t.Fatalf("log tail -n 0: %q %q", out, errOut)
	}
	_, errOut, code = run("", "log", "tail", "--data", c.dirs[1], "-n", "-1")
	if code != 2 || !strings.Contains(errOut, "0 or more") {
		t.Fatalf("log tail -n -1: %q, exit %d", errOut, code)
	}
	out, errOut, code = run("", "log", "promote", "--data", c.dirs[1], "--listen", c.addrs[1], "--members", members, "--secret-file", c.secret,
		"--buffer-size", "64K", "--max-record", "4K", "--segment-size", "256K")
	if code != 0 || !strings.Contains(out, "promoted "+c.addrs[1]+" to epoch 2") {
		t.Fatalf("log promote: %q %q %d", out, errOut, code)
	}
	c.start(1, true)
	c.start(0, false)
	out, _, code = run("", "log", "append", "-a", members, "fifth")
	if code != 0 || out != "5\n" {
		t.Fatalf("log append to the new primary: %q %d", out, code)
	}
	_, errOut, code = run("", "log", "serve", "--data", c.dirs[2], "--listen", c.addrs[2])
	if code != 2 || !strings.Contains(errOut, "--members and --secret-file are required") {
		t.Fatalf("log serve without --members: %q %d", errOut, code)
	}
	loose := filepath.Join(base, "loose-secret")
	if err := os.WriteFile(loose, testSecret, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = run("", "log", "serve", "--data", c.dirs[2], "--listen", c.addrs[2], "--members", members, "--secret-file", loose)
	if code == 0 || !strings.Contains(errOut, "chmod 600") {
		t.Fatalf("a secret file others may read: %q %d", errOut, code)
	}
	short := filepath.Join(base, "short-secret")
	if err := os.WriteFile(short, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = run("", "log", "serve", "--data", c.dirs[2], "--listen", c.addrs[2], "--members", members, "--secret-file", short)
	if code == 0 || !strings.Contains(errOut, "holds 7 bytes") {
		t.Fatalf("a secret file too short: %q %d", errOut, code)
	}
	_, errOut, code = run("", "log", "serve", "--data", c.dirs[2], "--listen", c.addrs[2], "--members", members, "--secret-file", c.secret)
	if code != 1 || !strings.Contains(errOut, "in use by another process") {
		t.Fatalf("a second member on a data directory in use: %q %d", errOut, code)
	}
	_, errOut, code = run("", "log", "frobnicate")
	if code != 2 || !strings.Contains(errOut, "unknown log subcommand") {
		t.Fatalf("an unknown subcommand: %q %d", errOut, code)
	}
}

//go:build !linux

package perftest

import "os/exec"

// DieWithParent does nothing here: only Linux can kill a child when its
// parent dies. The bench server still exits at the end of its standard
// input.
func DieWithParent(cmd *exec.Cmd) {}

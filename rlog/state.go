package rlog

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
)

// memberState is what a member keeps beside its log, in the file "state":
// its identity and its promise. A member that has promised epoch e to
// holder accepts records only from holder's primary in epoch e, or from a
// primary of a later epoch; that is how a promotion fences the old
// primary.
//
//	0 magic u32   4 version u32   8 member id u64   16 epoch u64
//	24 holder u64   32 crc32c u32 of bytes 0..31
type memberState struct {
	id     uint64
	epoch  uint64
	holder uint64
}

const (
	stateLen   = 36
	stateMagic = 0x534c5647 // "GVLS"
	stateFile  = "state"
)

// loadState reads the state of the member in dir, creating it (with a new
// random member id) if there is none.
func loadState(dir string, noSync bool) (memberState, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		var id [8]byte
		rand.Read(id[:])
		st := memberState{id: binary.LittleEndian.Uint64(id[:]) | 1}
		return st, saveState(dir, st, noSync)
	}
	if err != nil {
		return memberState{}, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if len(b) != stateLen || binary.LittleEndian.Uint32(b) != stateMagic || binary.LittleEndian.Uint32(b[4:]) != 1 ||
		crc32.Checksum(b[:32], castagnoli) != binary.LittleEndian.Uint32(b[32:]) {
		return memberState{}, fmt.Errorf("%w: %s is not a valid member state file", ErrCorrupt, filepath.Join(dir, stateFile))
	}
	return memberState{id: binary.LittleEndian.Uint64(b[8:]), epoch: binary.LittleEndian.Uint64(b[16:]), holder: binary.LittleEndian.Uint64(b[24:])}, nil
}

// saveState replaces the state file atomically and durably: a temporary
// file, fsynced, renamed over the old one, and the directory fsynced.
func saveState(dir string, st memberState, noSync bool) error {
	b := make([]byte, stateLen)
	binary.LittleEndian.PutUint32(b, stateMagic)
	binary.LittleEndian.PutUint32(b[4:], 1)
	binary.LittleEndian.PutUint64(b[8:], st.id)
	binary.LittleEndian.PutUint64(b[16:], st.epoch)
	binary.LittleEndian.PutUint64(b[24:], st.holder)
	binary.LittleEndian.PutUint32(b[32:], crc32.Checksum(b[:32], castagnoli))
	tmp := filepath.Join(dir, stateFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	_, err = f.Write(b)
	if err == nil && !noSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, stateFile))
	}
	if err != nil {
		return fmt.Errorf("%w: save member state: %w", ErrStorage, err)
	}
	if noSync {
		return nil
	}
	return syncPath(dir)
}

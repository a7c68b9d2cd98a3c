package ledger

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tempPrefix starts the name of every temp file the ledger writes. The full
// name is tempPrefix + ledger name + "." + 16 hex digits, so Open can tell
// this ledger's leftovers from anything else in the directory, including
// another ledger's.
const tempPrefix = ".ledger-tmp."

const tempSuffixLen = 16 // hex digits

func tempName(name string) string {
	var b [tempSuffixLen / 2]byte
	rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return tempPrefix + name + "." + hex.EncodeToString(b[:])
}

// isTempName reports whether file is a temp file of the ledger named name.
func isTempName(file, name string) bool {
	rest, ok := strings.CutPrefix(file, tempPrefix+name+".")
	if !ok || len(rest) != tempSuffixLen {
		return false
	}
	for _, c := range []byte(rest) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// fileOp names one step of writeCopy, for fault injection in tests.
type fileOp string

const (
	opCreate  fileOp = "create"
	opWrite   fileOp = "write"
	opSync    fileOp = "fsync"
	opClose   fileOp = "close"
	opRename  fileOp = "rename"
	opSyncDir fileOp = "fsync-dir"
)

// faultFunc is the test-only seam of the write path: called after each step
// with the step's result, it returns the result to go on with, so a test can
// make one step fail after it was done (as a real file system may: a rename
// that reports EIO, an fsync of the directory that fails after the rename).
// Nil outside tests.
type faultFunc func(op fileOp, path string, err error) error

func (f faultFunc) after(op fileOp, path string, err error) error {
	if f == nil {
		return err
	}
	return f(op, path, err)
}

// writeCopy atomically replaces dir/name with contents: temp file in dir
// (O_EXCL), write, fsync, close, rename over the copy, fsync dir. On failure
// before the rename the old copy is untouched and the temp file is removed.
// renamed reports whether the rename was attempted: once it was, an error
// no longer proves that the copy still holds its old contents.
func writeCopy(dir, name string, contents []byte, fault faultFunc) (renamed bool, err error) {
	var f *os.File
	var tmp string
	for range 5 { // a name collision is all but impossible; retry anyway
		tmp = filepath.Join(dir, tempName(name))
		f, err = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err = fault.after(opCreate, tmp, err); err != nil {
		if f != nil {
			f.Close()
			os.Remove(tmp)
		}
		return false, fmt.Errorf("create temp file: %w", err)
	}
	closed := false
	defer func() {
		if err == nil || renamed {
			return
		}
		if !closed {
			f.Close()
		}
		os.Remove(tmp)
	}()

	_, err = f.Write(contents)
	if err = fault.after(opWrite, tmp, err); err != nil {
		return false, fmt.Errorf("write temp file: %w", err)
	}
	if err = fault.after(opSync, tmp, f.Sync()); err != nil {
		return false, fmt.Errorf("fsync temp file: %w", err)
	}
	closed = true
	if err = fault.after(opClose, tmp, f.Close()); err != nil {
		return false, fmt.Errorf("close temp file: %w", err)
	}
	path := filepath.Join(dir, name)
	renamed = true
	if err = fault.after(opRename, path, os.Rename(tmp, path)); err != nil {
		// A rename that reports an error may still have happened; the
		// caller reads the copy back to tell. Remove the temp file if it
		// is still there.
		os.Remove(tmp)
		return true, fmt.Errorf("rename temp file over copy: %w", err)
	}
	if err = fault.after(opSyncDir, dir, syncDir(dir)); err != nil {
		// The new copy is in place but may not survive a crash.
		return true, fmt.Errorf("copy replaced but not durable: %w", err)
	}
	return true, nil
}

// readCopy reads and validates the copy at path in dir.
func readCopy(dir, path string) (Record, CopyStatus) {
	st := CopyStatus{Path: path}
	b, err := readFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Only a missing file in a directory that is there counts as
		// missing; a missing directory may be an absent disk.
		if derr := checkDir(dir); derr != nil {
			st.State, st.Err = StateUnreadable, derr.Error()
		} else {
			st.State = StateMissing
		}
		return Record{}, st
	case err != nil:
		st.State, st.Err = StateUnreadable, err.Error()
		return Record{}, st
	}
	rec, err := decodeCopy(b)
	if err != nil {
		st.State, st.Err = StateCorrupt, err.Error()
		return Record{}, st
	}
	st.State, st.Generation = StateOK, rec.Generation
	return rec, st
}

// errNotRegular is wrapped by readFile's error for a copy that is not a
// regular file.
var errNotRegular = errors.New("not a regular file")

// readFile reads a regular file, at most maxCopySize+1 bytes of it (enough
// for decodeCopy to see that it is too large).
func readFile(path string) ([]byte, error) {
	// Stat first so that a FIFO in the copy's place cannot block the open.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%s)", path, errNotRegular, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCopySize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// checkDir returns an error unless dir exists and is a directory.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("directory %s: not a directory", dir)
	}
	return nil
}

// ensureDir creates dir (and missing parents) with mode 0o700 and fsyncs
// the parent of each directory it creates, so the new directories survive a
// crash along with the copies later written into them.
func ensureDir(dir string) error {
	var created []string
	for p := dir; ; {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s: not a directory", p)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		created = append(created, p)
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	if len(created) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, p := range created {
		if err := syncDir(filepath.Dir(p)); err != nil {
			return err
		}
	}
	return nil
}

// syncDir fsyncs a directory so that entries created or renamed in it are
// durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return d.Close()
}

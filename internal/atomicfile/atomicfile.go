// Package atomicfile replaces files so that a reader, or the file system after
// a crash, sees the old content or the new, never a mix.
package atomicfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Options say how to write.
type Options struct {
	// Perm is the new file's permission bits (default 0o644).
	Perm fs.FileMode
	// Durable fsyncs the file before the rename and the directory after it,
	// so the new content survives a machine crash once WriteFile returns.
	Durable bool
}

// WriteFile replaces path with data: a temp file in the same directory,
// written, renamed over path. Missing directories are created (0o755).
func WriteFile(path string, data []byte, opts Options) error {
	perm := opts.Perm
	if perm == 0 {
		perm = 0o644
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && opts.Durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if !opts.Durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// WriteFileIfChanged is WriteFile, skipped when path already holds data
// (then only a wrong permission is fixed).
func WriteFileIfChanged(path string, data []byte, opts Options) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err != nil || !bytes.Equal(old, data) {
		return WriteFile(path, data, opts)
	}
	perm := opts.Perm
	if perm == 0 {
		perm = 0o644
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm() != perm {
		return os.Chmod(path, perm)
	}
	return nil
}

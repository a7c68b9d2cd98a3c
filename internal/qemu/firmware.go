package qemu

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// PrepareVars gives a machine its own firmware variable store: it copies
// template (OVMF_VARS_4M.fd) to path unless path exists already, in which
// case the guest's variables from an earlier boot are kept. The copy is
// written beside path, synced and renamed, so path is whole or absent.
func PrepareVars(template, path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("firmware vars: %w", err)
	}
	src, err := os.Open(template)
	if err != nil {
		return fmt.Errorf("firmware vars template: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("firmware vars: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	_, err = io.Copy(tmp, src)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("firmware vars: %w", err)
	}
	return nil
}

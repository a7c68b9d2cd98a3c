package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// VdevSize is the size of the synthetic disks MakeVdevs makes: sparse, so
// it costs only what the pool writes, and above mkfs.btrfs's minimum.
const VdevSize = 256 << 20

// MakeVdevs makes, in dir, the file-backed disk u2_<name>.vdev of each
// name that has none yet (tests, the crash test and benchmarks: the Linux
// backend finds them through --vdev-dir). An existing file is left as it
// is, so that a restarted agent finds its pools on them.
func MakeVdevs(dir string, names ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		if !component.MatchString(n) {
			return fmt.Errorf("vdev name %q: want letters, digits, '_', '.', ':' or '-'", n)
		}
		path := filepath.Join(dir, "u2_"+n+".vdev")
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = f.Truncate(VdevSize)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// ReleaseUnder unmounts every mount point under dir and detaches every loop
// device backed by a file under dir (tests, the crash test and benchmarks,
// at cleanup): what a backend with its pool root and vdev dir under dir
// left attached. Each unmount runs under a deadline and falls back to a
// lazy one, so a busy pool never stops the cleanup.
func ReleaseUnder(ctx context.Context, dir string) error {
	var errs []error
	for _, m := range Mounts(dir) {
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := runCommand(uctx, "umount", m)
		cancel()
		if err != nil {
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if _, lerr := runCommand(lctx, "umount", "--lazy", m); lerr != nil {
				errs = append(errs, fmt.Errorf("umount %s: %w", m, errors.Join(err, lerr)))
			}
			cancel()
		}
	}
	for _, dev := range LoopsBackedBy(dir) {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		runCommand(fctx, "btrfs", "device", "scan", "--forget", dev) // best effort
		cancel()
		if err := DetachLoop(dev); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", dev, err))
		}
	}
	return errors.Join(errs...)
}

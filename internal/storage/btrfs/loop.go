package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// sysBlock is the real sysfs block directory, where loop devices are.
const sysBlock = "/sys/block"

// loopFor returns the loop device backed by file (a synthetic disk),
// attaching one if there is none. Attaching writes nothing to the file.
// Only one attach per file runs at once; others wait for it (under ctx).
func (b *Backend) loopFor(ctx context.Context, file string) (string, error) {
	abs, err := filepath.EvalSymlinks(file)
	if err != nil {
		return "", fmt.Errorf("synthetic disk: %w", err)
	}
	for {
		if dev, ok := findLoop(sysBlock, abs); ok {
			return dev, nil
		}
		b.mu.Lock()
		wait, busy := b.attaching[abs]
		if !busy {
			wait = make(chan struct{})
			b.attaching[abs] = wait
		}
		b.mu.Unlock()
		if busy {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return "", fmt.Errorf("waiting for %s to be attached: %w", abs, ctx.Err())
			}
		}
		var dev string
		err := b.record(ctx, abs)
		if err == nil {
			dev, err = syscallOn(ctx, b, abs, func() (string, error) {
				if dev, ok := findLoop(sysBlock, abs); ok {
					return dev, nil
				}
				return attachLoop(abs)
			})
		}
		b.mu.Lock()
		delete(b.attaching, abs)
		close(wait)
		b.mu.Unlock()
		if err == nil {
			b.log.Info("attached synthetic disk", "file", abs, "device", dev)
		}
		return dev, err
	}
}

// findLoop returns the loop device whose backing file is file, with no
// offset or size limit (the whole file is the disk); the lowest-numbered
// one if there are several.
func findLoop(sysBlock, file string) (string, bool) {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", false
	}
	best, bestN := "", -1
	for _, e := range ents {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "loop%d", &n); err != nil || e.Name() != fmt.Sprintf("loop%d", n) {
			continue
		}
		dir := filepath.Join(sysBlock, e.Name(), "loop")
		if readTrim(filepath.Join(dir, "backing_file")) != file {
			continue
		}
		if off := readTrim(filepath.Join(dir, "offset")); off != "" && off != "0" {
			continue
		}
		if lim := readTrim(filepath.Join(dir, "sizelimit")); lim != "" && lim != "0" {
			continue
		}
		if bestN < 0 || n < bestN {
			best, bestN = "/dev/"+e.Name(), n
		}
	}
	return best, bestN >= 0
}

// LoopsBackedBy lists the loop devices whose backing file is under dir.
func LoopsBackedBy(dir string) []string {
	ents, _ := os.ReadDir(sysBlock)
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		f := readTrim(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if f != "" && strings.HasPrefix(f, dir+"/") {
			out = append(out, "/dev/"+e.Name())
		}
	}
	return out
}

// attachLoop attaches file to a free loop device (LOOP_CONFIGURE, or
// LOOP_SET_FD on kernels older than 5.8). A device another process took
// between asking for a free one and configuring it is skipped.
func attachLoop(file string) (string, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("loop-control: %w", err)
	}
	defer unix.Close(ctl)
	ffd, err := unix.Open(file, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", file, err)
	}
	defer unix.Close(ffd)
	var lastErr error
	for range 8 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("no free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lfd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(ffd)}
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], file)
		err = unix.IoctlLoopConfigure(lfd, &cfg)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			err = unix.IoctlSetInt(lfd, unix.LOOP_SET_FD, ffd)
			if err == nil {
				if serr := unix.IoctlLoopSetStatus64(lfd, &cfg.Info); serr != nil {
					unix.IoctlSetInt(lfd, unix.LOOP_CLR_FD, 0)
					err = serr
				}
			}
		}
		unix.Close(lfd)
		if err == nil {
			return dev, nil
		}
		lastErr = err
		if !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	return "", fmt.Errorf("attach %s: %w", file, lastErr)
}

// DetachLoop detaches a loop device (tests, at cleanup). It does not
// touch the backing file.
func DetachLoop(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
}

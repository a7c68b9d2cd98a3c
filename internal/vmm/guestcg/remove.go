package guestcg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Remove kills whatever runs in the guest cgroup name, in every hierarchy
// of h, waits (until ctx ends) for each directory to be empty, and removes
// it; it returns the directories it removed. A directory that does not
// exist is skipped. On v2 one write to cgroup.kill kills the lot; on v1
// each process is killed through a pidfd taken while it is in the cgroup,
// so a pid reused meanwhile is never signalled.
func (h Host) Remove(ctx context.Context, name string) ([]string, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, d := range h.Dirs(name) {
		ok, err := removeDir(ctx, d)
		if ok {
			removed = append(removed, d.Path)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// removeDir empties the cgroup d of its processes and removes it; false if
// it did not exist.
func removeDir(ctx context.Context, d Dir) (bool, error) {
	// Most often QEMU has exited already: an empty cgroup simply goes (the
	// kernel refuses, EBUSY, while it holds a process).
	err := os.Remove(d.Path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	killAll := d.V2
	if killAll {
		if err := writeFile(filepath.Join(d.Path, "cgroup.kill"), "1"); err != nil {
			if errors.Is(err, fs.ErrNotExist) && missing(d.Path) {
				return false, nil
			}
			killAll = false // a kernel before 5.14: one by one
		}
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if !killAll {
			if err := killProcs(d.Path); err != nil {
				if errors.Is(err, fs.ErrNotExist) && missing(d.Path) {
					return false, nil
				}
				return false, fmt.Errorf("killing the processes of cgroup %s: %w", d.Path, err)
			}
		}
		err := os.Remove(d.Path)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, fs.ErrNotExist):
			return false, nil
		case !errors.Is(err, unix.EBUSY):
			return false, fmt.Errorf("removing cgroup %s: %w", d.Path, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			pids, _ := readPIDs(d.Path)
			return false, fmt.Errorf("the processes %v of cgroup %s did not exit: %w", pids, d.Path, ctx.Err())
		case <-t.C:
		}
	}
}

// killProcs sends SIGKILL to every process in the cgroup dir. Each is
// taken by a pidfd, then signalled only if its pid is still in the cgroup:
// the process that holds the pid then is the pidfd's (a pid is not reused
// while its process lives), and if that one has exited since, the signal
// goes nowhere.
func killProcs(dir string) error {
	pids, err := readPIDs(dir)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // exited
		}
		if now, err := readPIDs(dir); err == nil && slices.Contains(now, pid) {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		unix.Close(fd)
	}
	return nil
}

// readPIDs reads a cgroup's cgroup.procs.
func readPIDs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Guests lists the guest cgroups of the zone runtime of tag, in every
// hierarchy of h: their directories by zone name.
func (h Host) Guests(tag string) (map[string][]string, error) {
	out := map[string][]string{}
	var errs []error
	for _, root := range h.roots() {
		dir := filepath.Join(root, parent, tag)
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			if zone, ok := strings.CutSuffix(e.Name(), Suffix); ok && e.IsDir() && zone != "" {
				out[zone] = append(out[zone], filepath.Join(dir, e.Name()))
			}
		}
	}
	return out, errors.Join(errs...)
}

// RemoveEmpty removes the tag's directory, and sled-agent/ above it, from
// every hierarchy of h where they are empty.
func (h Host) RemoveEmpty(tag string) {
	for _, root := range h.roots() {
		os.Remove(filepath.Join(root, parent, tag))
		os.Remove(filepath.Join(root, parent)) // if no other tag uses it
	}
}

func missing(path string) bool {
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

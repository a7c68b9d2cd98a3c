package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// What the backend attaches, and how it lets go of it.
//
// The backend attaches a loop device to each synthetic disk (a file in
// VdevDir) and mounts each pool under PoolRoot; an agent that stops leaves
// both, so that a restarted agent finds its pools as they were. Two things
// release them:
//
//   - Release (the agent's teardown) unmounts every pool under PoolRoot and
//     detaches the loop devices of VdevDir's files: nothing is formatted,
//     no file is written, and real disks are only unmounted.
//   - A vdev file deleted while its loop device is attached leaves that
//     device holding the pool's btrfs, whose UUID is the pool id: mkfs.btrfs
//     -U of that pool on a new file then fails for ever ("non-unique UUID"),
//     and the pool's mount point holds the old device. CreatePool and
//     OpenPool detach such a stale loop device of the pool they are asked
//     for (unmounting it first where it is mounted under PoolRoot), and
//     only such a one: its backing file was a synthetic disk of this
//     backend's (in VdevDir, with its tag) and is deleted, and it holds our
//     pool with that id. One mounted anywhere else is left, and named in
//     the error.

// deletedSuffix ends the backing file the kernel reports for a loop device
// whose file was deleted.
const deletedSuffix = " (deleted)"

// vdevLoop is a loop device backed by a synthetic disk file of ours.
type vdevLoop struct {
	dev     string // "/dev/loop3"
	file    string // the backing file, without deletedSuffix
	deleted bool
}

// vdevLoops lists the loop devices backed by this backend's synthetic disk
// files (in VdevDir, named as synthetic disks, with its tag), deleted ones
// included.
func (b *Backend) vdevLoops() []vdevLoop {
	if b.opts.VdevDir == "" {
		return nil
	}
	dirs := []string{filepath.Clean(b.opts.VdevDir)}
	if real, err := filepath.EvalSymlinks(b.opts.VdevDir); err == nil && real != dirs[0] {
		dirs = append(dirs, real) // loopFor attaches the file's real path
	}
	ents, _ := os.ReadDir(sysBlock)
	var out []vdevLoop
	for _, e := range ents {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "loop%d", &n); err != nil || e.Name() != fmt.Sprintf("loop%d", n) {
			continue
		}
		f := readTrim(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		file, deleted := strings.CutSuffix(f, deletedSuffix)
		name, _, ok := parseVdevName(filepath.Base(file))
		if f == "" || !ok || !strings.HasPrefix(name, b.opts.Tag) || !containsDir(dirs, filepath.Dir(file)) {
			continue
		}
		out = append(out, vdevLoop{dev: "/dev/" + e.Name(), file: file, deleted: deleted})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dev < out[j].dev })
	return out
}

func containsDir(dirs []string, d string) bool {
	for _, x := range dirs {
		if x == d {
			return true
		}
	}
	return false
}

// releaseStale detaches every stale loop device (see above) that holds
// pool poolID, unmounting it first where it is mounted under PoolRoot. It
// returns an error if one cannot be released; none is no error.
func (b *Backend) releaseStale(ctx context.Context, poolID string) error {
	var errs []error
	for _, l := range b.vdevLoops() {
		if !l.deleted {
			continue
		}
		head, err := syscallOn(ctx, b, l.dev, func() ([]byte, error) { return readHead(l.dev) })
		if err != nil {
			errs = append(errs, fmt.Errorf("stale loop device %s of deleted %s: %w", l.dev, l.file, err))
			continue
		}
		fsid, label, _, ok := parseSuper(head)
		if !ok || fsid != poolID || label != poolLabel(poolID) {
			continue
		}
		if err := b.detach(ctx, l, "pool "+poolID); err != nil {
			errs = append(errs, fmt.Errorf("pool %s: stale loop device %s of deleted vdev file %s: %w", poolID, l.dev, l.file, err))
			continue
		}
		b.log.Warn("detached the loop device of a deleted vdev file, which held the pool", "pool", poolID, "device", l.dev, "file", l.file)
	}
	return errors.Join(errs...)
}

// detach unmounts the loop device l where it is mounted under PoolRoot,
// refuses if it is mounted anywhere else, then tells btrfs to forget it and
// detaches it. what is what it holds, for the log.
func (b *Backend) detach(ctx context.Context, l vdevLoop, what string) error {
	points, err := mountsOf(l.dev)
	if err != nil {
		return err
	}
	root := filepath.Clean(b.opts.PoolRoot) + string(filepath.Separator)
	for _, p := range points {
		if !strings.HasPrefix(p, root) {
			return fmt.Errorf("mounted at %s, outside the pool root %s: unmount it first", p, b.opts.PoolRoot)
		}
	}
	for _, p := range points {
		if err := b.unmount(ctx, p); err != nil {
			return err
		}
		b.log.Info("unmounted", "what", what, "device", l.dev, "mountpoint", p)
	}
	// Best effort: the kernel's btrfs keeps a list of the devices it has
	// seen, and a detached loop device would stay on it.
	b.command(ctx, "btrfs", "device", "scan", "--forget", l.dev)
	if _, err := syscallOn(ctx, b, l.dev, func() (struct{}, error) { return struct{}{}, DetachLoop(l.dev) }); err != nil {
		return fmt.Errorf("detach: %w", err)
	}
	return nil
}

// unmount unmounts mnt, lazily if it is busy.
func (b *Backend) unmount(ctx context.Context, mnt string) error {
	if _, err := b.command(ctx, "umount", mnt); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("umount %s: %w", mnt, err)
		}
		if _, lerr := b.command(ctx, "umount", "--lazy", mnt); lerr != nil {
			return fmt.Errorf("umount %s: %w (then %v)", mnt, err, lerr)
		}
		b.log.Warn("unmounted a busy file system lazily", "mountpoint", mnt, "err", err)
	}
	return nil
}

// mountsOf returns where device dev is mounted, deepest first.
func mountsOf(dev string) ([]string, error) {
	ms, err := mountinfo.current()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if m.source == dev || sameDevice(m.source, dev) {
			out = append([]string{m.point}, out...)
		}
	}
	return out, nil
}

// Release lets go of what the backend attached (the agent's teardown): it
// unmounts every pool mounted under PoolRoot (<PoolRoot>/ext/<pool id>,
// btrfs) and detaches the loop device of every synthetic disk file of
// VdevDir or of the LoopRecord, deleted or not. It formats nothing and writes no disk; a real
// disk's pool is only unmounted, and a loop device mounted outside PoolRoot
// is left (an error says where). It returns one line per thing released,
// for people, and every failure joined.
func (b *Backend) Release(ctx context.Context) ([]string, error) {
	var lines []string
	var errs []error
	ms, err := mountinfo.current()
	if err != nil {
		return nil, err
	}
	ext := filepath.Join(filepath.Clean(b.opts.PoolRoot), "ext")
	for i := len(ms) - 1; i >= 0; i-- { // the topmost first
		m := ms[i]
		if filepath.Dir(m.point) != ext || validUUID(filepath.Base(m.point)) != nil || m.fstype != "btrfs" {
			continue
		}
		if err := ctx.Err(); err != nil {
			return lines, errors.Join(append(errs, err)...)
		}
		if err := b.unmount(ctx, m.point); err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", filepath.Base(m.point), err))
			continue
		}
		b.log.Info("unmounted pool", "pool", filepath.Base(m.point), "mountpoint", m.point)
		lines = append(lines, fmt.Sprintf("pool %s mounted at %s (unmounted)", filepath.Base(m.point), m.point))
	}
	loops := b.vdevLoops()
	more, files, err := b.recordedLoops(loops)
	if err != nil {
		errs = append(errs, err)
	}
	loops = append(loops, more...)
	// The record keeps the files whose loop device is still attached: none
	// but those that failed (all, if the release stops early).
	var kept []string
	defer func() {
		if files != nil {
			if err := b.writeRecord(kept); err != nil {
				b.log.Error("rewriting the record of attached vdev files", "err", err)
			}
		}
	}()
	for _, l := range loops {
		if err := ctx.Err(); err != nil {
			kept = files
			return lines, errors.Join(append(errs, err)...)
		}
		file := l.file
		if l.deleted {
			file += deletedSuffix
		}
		if err := b.detach(ctx, l, "synthetic disk "+file); err != nil {
			errs = append(errs, fmt.Errorf("loop device %s of %s: %w", l.dev, file, err))
			if slices.Contains(files, l.file) && !slices.Contains(kept, l.file) {
				kept = append(kept, l.file)
			}
			continue
		}
		b.log.Info("detached synthetic disk", "file", file, "device", l.dev)
		lines = append(lines, fmt.Sprintf("loop device %s of %s (detached)", l.dev, file))
	}
	return lines, errors.Join(errs...)
}

package btrfs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// CreatePool makes pool poolID on a blank disk: a btrfs filesystem with
// UUID poolID and label oxp_<poolID>, mounted, with quotas enabled. What
// the disk holds is checked again right before the write; mkfs.btrfs is
// run without --force, so it too refuses a disk holding a filesystem or a
// partition table.
func (b *Backend) CreatePool(ctx context.Context, disk storage.DiskIdentity, poolID string) error {
	if err := validUUID(poolID); err != nil {
		return fmt.Errorf("create pool: %w", err)
	}
	d, err := b.find(ctx, disk)
	if err != nil {
		return err
	}
	c, err := b.probe(ctx, d.path)
	if err != nil {
		return fmt.Errorf("create pool %s on %s: %w", poolID, disk, err)
	}
	if c.kind != storage.ContentBlank {
		what := c.what
		if c.kind == storage.ContentPool {
			what = "pool " + c.poolID
		}
		return fmt.Errorf("create pool %s on %s (%s): it holds %s: %w", poolID, disk, d.path, what, storage.ErrNotBlank)
	}
	// A loop device left holding this pool by a deleted vdev file would
	// make mkfs refuse the UUID (release.go).
	if err := b.releaseStale(ctx, poolID); err != nil {
		return fmt.Errorf("create pool %s on %s: %w", poolID, disk, err)
	}
	// --nodiscard: a blank disk has nothing to discard, and discarding a
	// large one can take longer than any deadline we would set.
	if _, err := b.command(ctx, "mkfs.btrfs", "--nodiscard", "-U", poolID, "-L", poolLabel(poolID), d.path); err != nil {
		return fmt.Errorf("create pool %s on %s: %w", poolID, disk, err)
	}
	b.log.Info("created pool", "pool", poolID, "disk", disk.String(), "device", d.path)
	_, err = b.open(ctx, d, poolID)
	return err
}

// OpenPool mounts pool poolID at <PoolRoot>/ext/<poolID> unless it is
// mounted there already, adopting it as it is, and enables quotas if a
// crash came between mkfs and enabling them. Nothing is formatted.
func (b *Backend) OpenPool(ctx context.Context, disk storage.DiskIdentity, poolID string) (storage.Pool, error) {
	if err := validUUID(poolID); err != nil {
		return storage.Pool{}, fmt.Errorf("open pool: %w", err)
	}
	d, err := b.find(ctx, disk)
	if err != nil {
		return storage.Pool{}, err
	}
	return b.open(ctx, d, poolID)
}

func (b *Backend) open(ctx context.Context, d blockDev, poolID string) (storage.Pool, error) {
	mnt := b.mountpoint(poolID)
	m, mounted, err := mountAt(mnt)
	if err != nil {
		return storage.Pool{}, err
	}
	if mounted && (m.fstype != "btrfs" || !sameDevice(m.source, d.path)) {
		// The stale loop device of a deleted vdev file of the pool, if
		// that is what is mounted there, is let go (release.go).
		if err := b.releaseStale(ctx, poolID); err != nil {
			return storage.Pool{}, fmt.Errorf("open pool %s: %w", poolID, err)
		}
		if m, mounted, err = mountAt(mnt); err != nil {
			return storage.Pool{}, err
		}
	}
	if mounted {
		if m.fstype != "btrfs" || !sameDevice(m.source, d.path) {
			return storage.Pool{}, fmt.Errorf("pool %s: %s holds %s from %s, not %s", poolID, mnt, m.fstype, m.source, d.path)
		}
	} else {
		c, err := b.probe(ctx, d.path)
		if err != nil {
			return storage.Pool{}, fmt.Errorf("open pool %s: %w", poolID, err)
		}
		switch {
		case c.kind == storage.ContentPool && c.poolID == poolID && c.halfMade:
			// A crash during CreatePool: make it again (--force: mkfs
			// would refuse its own half-made superblock).
			b.log.Warn("making again a pool whose making was cut short", "pool", poolID, "disk", d.identity.String(), "device", d.path)
			if _, err := b.command(ctx, "mkfs.btrfs", "--nodiscard", "--force", "-U", poolID, "-L", poolLabel(poolID), d.path); err != nil {
				return storage.Pool{}, fmt.Errorf("open pool %s: making again after an interrupted mkfs: %w", poolID, err)
			}
		case c.kind == storage.ContentPool && c.poolID == poolID:
		case c.kind == storage.ContentPool:
			return storage.Pool{}, fmt.Errorf("open pool %s: disk %s holds pool %s (unexpected pool id)", poolID, d.identity, c.poolID)
		case c.kind == storage.ContentBlank:
			return storage.Pool{}, fmt.Errorf("open pool %s: disk %s is blank", poolID, d.identity)
		default:
			return storage.Pool{}, fmt.Errorf("open pool %s: disk %s holds %s", poolID, d.identity, c.what)
		}
		if _, err := syscallOn(ctx, b, poolID, func() (struct{}, error) { return struct{}{}, os.MkdirAll(mnt, 0o755) }); err != nil {
			return storage.Pool{}, fmt.Errorf("open pool %s: %w", poolID, err)
		}
		if _, err := b.command(ctx, "mount", "-t", "btrfs", "-o", "noatime", d.path, mnt); err != nil {
			return storage.Pool{}, fmt.Errorf("open pool %s: %w", poolID, err)
		}
		b.log.Info("mounted pool", "pool", poolID, "device", d.path, "mountpoint", mnt)
	}
	if !exists(filepath.Join("/sys/fs/btrfs", poolID, "qgroups")) {
		if _, err := b.command(ctx, "btrfs", "quota", "enable", mnt); err != nil {
			return storage.Pool{}, fmt.Errorf("open pool %s: %w", poolID, err)
		}
		b.log.Info("enabled quotas", "pool", poolID)
	}
	return b.poolStatus(ctx, poolID, mnt)
}

// poolStatus reports a mounted pool. Health, in upstream's words:
//   - online: mounted read-write, statfs answers, the device has
//     recorded no errors;
//   - degraded: as online, but the device has recorded read, write, flush,
//     corruption or generation errors (btrfs goes on writing);
//   - faulted: btrfs made it read-only after an error, or statfs fails.
//
// A statfs that does not return by the deadline is an error (the pool's
// disk is hung), not a health.
func (b *Backend) poolStatus(ctx context.Context, poolID, mnt string) (storage.Pool, error) {
	p := storage.Pool{ID: poolID, Mountpoint: mnt}
	st, err := statfs(ctx, b, poolID, mnt)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, ErrHung) || errors.Is(err, context.DeadlineExceeded) {
			return p, fmt.Errorf("pool %s: %w", poolID, err)
		}
		p.Health = "faulted"
		return p, nil
	}
	p.TotalSize = st.Blocks * uint64(st.Bsize)
	switch {
	case st.Flags&unix.ST_RDONLY != 0:
		p.Health = "faulted"
	case deviceErrors(poolID) > 0:
		p.Health = "degraded"
	default:
		p.Health = "online"
	}
	return p, nil
}

func statfs(ctx context.Context, b *Backend, poolID, path string) (unix.Statfs_t, error) {
	return syscallOn(ctx, b, poolID, func() (unix.Statfs_t, error) {
		var st unix.Statfs_t
		err := unix.Statfs(path, &st)
		return st, err
	})
}

// deviceErrors sums the error counters btrfs keeps for the pool's devices
// (/sys/fs/btrfs/<fsid>/devinfo/*/error_stats).
func deviceErrors(poolID string) uint64 {
	files, _ := filepath.Glob(filepath.Join("/sys/fs/btrfs", poolID, "devinfo", "*", "error_stats"))
	var n uint64
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(line); len(fs) == 2 {
				v, _ := strconv.ParseUint(fs[1], 10, 64)
				n += v
			}
		}
	}
	return n
}

// ClosePool unmounts a pool that is no longer managed; lazily only if it
// is busy (files open in it). It destroys nothing, and a pool not mounted
// is not an error.
func (b *Backend) ClosePool(ctx context.Context, poolID string) error {
	if err := validUUID(poolID); err != nil {
		return fmt.Errorf("close pool: %w", err)
	}
	mnt := b.mountpoint(poolID)
	_, mounted, err := mountAt(mnt)
	if err != nil || !mounted {
		return err
	}
	if _, err := b.command(ctx, "umount", mnt); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("close pool %s: %w", poolID, err)
		}
		if _, lerr := b.command(ctx, "umount", "--lazy", mnt); lerr != nil {
			return fmt.Errorf("close pool %s: %w (then %v)", poolID, err, lerr)
		}
		b.log.Warn("unmounted busy pool lazily", "pool", poolID, "err", err)
		return nil
	}
	b.log.Info("unmounted pool", "pool", poolID)
	return nil
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point, fstype, source string
}

// mountAt returns what is mounted at dir (the topmost mount), reading
// /proc/self/mountinfo, which never waits on a disk.
func mountAt(dir string) (mount, bool, error) {
	mounts, err := mountinfo.current()
	if err != nil {
		return mount{}, false, err
	}
	var found mount
	ok := false
	for _, m := range mounts {
		if m.point == dir {
			found, ok = m, true // later lines are mounted over earlier ones
		}
	}
	return found, ok, nil
}

// Mounts lists the mount points under dir (tests, at cleanup), deepest
// first.
func Mounts(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, m := range parseMountinfo(data) {
		if strings.HasPrefix(m.point, dir+"/") {
			out = append([]string{m.point}, out...)
		}
	}
	return out
}

func parseMountinfo(data []byte) []mount {
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fs {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(fs) < sep+3 {
			continue
		}
		out = append(out, mount{point: unescape(fs[4]), fstype: fs[sep+1], source: unescape(fs[sep+2])})
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sameDevice reports whether two device paths name the same block device.
func sameDevice(a, b string) bool {
	if a == b {
		return true
	}
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	return sa.Mode&unix.S_IFMT == unix.S_IFBLK && sa.Rdev == sb.Rdev
}

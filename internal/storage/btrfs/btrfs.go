// Package btrfs is the Linux storage backend: disks found through sysfs
// or as file-backed synthetic disks on loop devices, a pool as a btrfs
// filesystem on a whole disk, a dataset as a btrfs subvolume.
//
// A pool is a btrfs filesystem whose filesystem UUID is the pool's id and
// whose label is "oxp_<pool id>" (the mark that it is ours), mounted at
// <PoolRoot>/ext/<pool id>. A dataset "oxp_<pool>/crypt/debug" is the
// subvolume <mountpoint>/crypt/debug; its id is in the xattr
// user.oxide.uuid, its quota is its qgroup's limit, its compression the
// btrfs property. btrfs has no reservations: they are recorded in an xattr
// and enforced as an admission check against the pool's size.
//
// The commands made for every dataset and pass are the ioctls those
// commands make, without a process (native.go); every other command runs
// in its own process group, killed at its deadline;
// every syscall that can block on a dead disk runs in a goroutine the
// caller stops waiting for at its deadline (see call). Upstream's agent
// could wedge for days behind one `zfs get` on a dead disk; this one gives
// up at the deadline and says so.
package btrfs

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// Options configure a Backend.
type Options struct {
	// VdevDir holds file-backed synthetic disks, u2_<name>.vdev and
	// m2_<name>.vdev (upstream's rule); "" for none.
	VdevDir string
	// PoolRoot is where pools are mounted: <PoolRoot>/ext/<pool id>.
	PoolRoot string
	// Tag, when set, limits the backend to synthetic disks whose name
	// begins with Tag, and lists no real disk: tests set it, so that they
	// never look at anything but their own files.
	Tag string
	// Log is where the backend says what it changed. Nil: discarded.
	Log *slog.Logger
	// CommandTimeout caps each command and blocking syscall within the
	// caller's deadline (default 2 minutes: mkfs of a large disk).
	CommandTimeout time.Duration
	// ProbeTimeout caps reading what one disk holds in Disks (default 10
	// s), so that one dead disk does not hide the others.
	ProbeTimeout time.Duration
	// SysBlock is the sysfs block directory (default /sys/block).
	SysBlock string
	// LoopRecord is a file where the backend records, durably, each vdev
	// file it attaches a loop device to, so that Release detaches it
	// whatever VdevDir is then ("" for no record; see record.go).
	LoopRecord string
}

// Backend is the Linux storage backend. Its methods may be called at once
// from several goroutines.
type Backend struct {
	opts Options
	log  *slog.Logger
	run  runFunc

	mu sync.Mutex
	// lingering counts, per key, calls abandoned at their deadline whose
	// syscall has not returned yet (see call).
	lingering map[string]int
	// attaching holds, per vdev file, a channel closed when the loop
	// device being attached for it is ready: one attach per file at once.
	attaching map[string]chan struct{}
	// loops is, per vdev file (its real path), the loop device last found
	// for it (see loopOf).
	loops map[string]string
	// recordSem serialises writes of the LoopRecord.
	recordSem chan struct{}
	// poolSem serialises dataset changes on one pool (the reservation
	// admission check reads every reservation, then records one).
	poolSem map[string]chan struct{}
}

var _ storage.Backend = (*Backend)(nil)

// New returns a backend. It touches nothing.
func New(opts Options) (*Backend, error) {
	if opts.PoolRoot == "" || !filepath.IsAbs(opts.PoolRoot) {
		return nil, fmt.Errorf("btrfs: pool root %q must be an absolute path", opts.PoolRoot)
	}
	if opts.VdevDir != "" && !filepath.IsAbs(opts.VdevDir) {
		return nil, fmt.Errorf("btrfs: vdev dir %q must be an absolute path", opts.VdevDir)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.CommandTimeout <= 0 {
		opts.CommandTimeout = 2 * time.Minute
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 10 * time.Second
	}
	if opts.SysBlock == "" {
		opts.SysBlock = "/sys/block"
	}
	b := &Backend{
		opts:      opts,
		log:       opts.Log.With("component", "storage-btrfs"),
		lingering: map[string]int{},
		attaching: map[string]chan struct{}{},
		loops:     map[string]string{},
		poolSem:   map[string]chan struct{}{},
		recordSem: make(chan struct{}, 1),
	}
	b.run = b.runTool
	return b, nil
}

// command runs argv under ctx, capped at CommandTimeout.
func (b *Backend) command(ctx context.Context, argv ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.CommandTimeout)
	defer cancel()
	return b.run(ctx, argv...)
}

// syscall runs fn as call does, capped at CommandTimeout.
func syscallOn[T any](ctx context.Context, b *Backend, key string, fn func() (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.CommandTimeout)
	defer cancel()
	return call(ctx, b, key, fn)
}

// lockPool takes the pool's dataset semaphore, waiting no longer than ctx.
func (b *Backend) lockPool(ctx context.Context, poolID string) (unlock func(), err error) {
	b.mu.Lock()
	sem, ok := b.poolSem[poolID]
	if !ok {
		sem = make(chan struct{}, 1)
		b.poolSem[poolID] = sem
	}
	b.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("pool %s: waiting for another change to its datasets: %w", poolID, ctx.Err())
	}
}

// mountpoint is where the pool is mounted.
func (b *Backend) mountpoint(poolID string) string {
	return filepath.Join(b.opts.PoolRoot, "ext", poolID)
}

// poolLabel is the filesystem label that marks a pool as ours.
func poolLabel(poolID string) string { return storage.PoolName(poolID) }

// validUUID reports whether s is a UUID in its canonical lowercase form:
// the only form that reaches a command line or a path.
func validUUID(s string) error {
	u, err := uuid.Parse(s)
	if err != nil || u.String() != s {
		return fmt.Errorf("%q is not a UUID in canonical form", s)
	}
	return nil
}

// component is one path component of a dataset's name within its pool:
// kinds (crucible, clickhouse_keeper, zone) and zone names (oxz_ntp_<id>).
var component = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$`)

// relName returns the dataset's name within pool poolID ("crypt/debug")
// from its full name ("oxp_<pool>/crypt/debug"), validated: each
// component is a plain name beginning with a letter or digit (never "."
// or "..", nor one of our temporary names, which begin with a dot).
func relName(poolID, name string) (string, error) {
	if err := validUUID(poolID); err != nil {
		return "", fmt.Errorf("pool id: %w", err)
	}
	rel, ok := strings.CutPrefix(name, storage.PoolName(poolID)+"/")
	if !ok || rel == "" {
		return "", fmt.Errorf("dataset %q is not on pool %s", name, storage.PoolName(poolID))
	}
	parts := strings.Split(rel, "/")
	if len(parts) > 8 {
		return "", fmt.Errorf("dataset %q: too deep", name)
	}
	for _, p := range parts {
		if !component.MatchString(p) || strings.Contains(p, "..") {
			return "", fmt.Errorf("dataset %q: %q is not a valid name component", name, p)
		}
	}
	return rel, nil
}

package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// ErrReservation: a dataset's reservation cannot be honoured: with the
// pool's other reservations it is more than the pool holds.
var ErrReservation = errors.New("reservation cannot be honoured")

// openMount returns the mountpoint of pool poolID, an error if it is not
// mounted (not opened, or closed).
func (b *Backend) openMount(poolID string) (string, error) {
	mnt := b.mountpoint(poolID)
	m, ok, err := mountAt(mnt)
	if err != nil {
		return "", err
	}
	if !ok || m.fstype != "btrfs" {
		return "", fmt.Errorf("pool %s is not open (nothing mounted at %s)", poolID, mnt)
	}
	return mnt, nil
}

// subvol is one line of `btrfs subvolume list`.
type subvol struct {
	id  uint64
	rel string // path from the pool's top
}

// isTemp reports whether a subvolume is one of ours being created (or
// left by a crash before its rename).
func isTemp(rel string) bool { return strings.Contains("/"+rel, "/.") }

// subvolumes lists the pool's subvolumes.
func (b *Backend) subvolumes(ctx context.Context, mnt string) ([]subvol, error) {
	out, err := b.command(ctx, "btrfs", "subvolume", "list", mnt)
	if err != nil {
		return nil, err
	}
	var subs []subvol
	for _, line := range strings.Split(string(out), "\n") {
		// ID 257 gen 12 top level 256 path crypt/debug
		fs := strings.Fields(line)
		if len(fs) < 9 || fs[0] != "ID" || fs[len(fs)-2] != "path" {
			continue
		}
		id, err := strconv.ParseUint(fs[1], 10, 64)
		if err != nil {
			continue
		}
		subs = append(subs, subvol{id: id, rel: fs[len(fs)-1]})
	}
	return subs, nil
}

// Datasets lists the datasets of an open pool: each of its subvolumes,
// but those made only to hold datasets (marked, without an id).
func (b *Backend) Datasets(ctx context.Context, poolID string) ([]storage.Dataset, error) {
	if err := validUUID(poolID); err != nil {
		return nil, fmt.Errorf("datasets: %w", err)
	}
	mnt, err := b.openMount(poolID)
	if err != nil {
		return nil, err
	}
	subs, err := b.subvolumes(ctx, mnt)
	if err != nil {
		return nil, fmt.Errorf("datasets of pool %s: %w", poolID, err)
	}
	st, err := statfs(ctx, b, poolID, mnt)
	if err != nil {
		return nil, fmt.Errorf("datasets of pool %s: %w", poolID, err)
	}
	free := st.Bavail * uint64(st.Bsize)
	var out []storage.Dataset
	for _, s := range subs {
		if isTemp(s.rel) {
			continue
		}
		path := filepath.Join(mnt, s.rel)
		a, err := b.readAttrsOn(ctx, poolID, path)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("datasets of pool %s: %w", poolID, err)
		}
		if a.parent != "" && a.id == "" {
			continue
		}
		out = append(out, observed(poolID, s.rel, path, a, free))
	}
	return out, nil
}

// observed is the dataset at path as its attrs say.
func observed(poolID, rel, path string, a attrs, free uint64) storage.Dataset {
	d := storage.Dataset{
		Name: storage.PoolName(poolID) + "/" + rel, ID: a.id, Path: path,
		Compression: observedCompression(a), Mounted: true,
	}
	d.Used, d.Quota = qgroup(poolID, a.subvolID)
	d.Available = free
	if d.Quota != nil {
		d.Available = min(free, *d.Quota-min(d.Used, *d.Quota))
	}
	if r, err := strconv.ParseUint(a.reservation, 10, 64); err == nil && r > 0 {
		d.Reservation = &r
	}
	return d
}

// EnsureDataset creates the dataset's subvolume if it is missing (with
// its parents, as subvolumes marked as parents), with its id recorded, and
// sets its quota, reservation and compression where they differ, and only
// those. A dataset recorded with another id is ErrOtherID, left as it is.
//
// Reservations are an admission check: a reservation that, added to the
// reservations of the pool's other datasets, is more than the pool's size
// is refused (ErrReservation, the dataset not created or changed). btrfs
// does not keep the space aside: other datasets' writes can still use it.
func (b *Backend) EnsureDataset(ctx context.Context, want storage.DatasetConfig) (storage.Dataset, error) {
	name := want.Name()
	if err := validUUID(want.ID); err != nil {
		return storage.Dataset{}, fmt.Errorf("dataset %s: id: %w", name, err)
	}
	rel, err := relName(want.PoolID, name)
	if err != nil {
		return storage.Dataset{}, err
	}
	comp, err := btrfsCompression(want.Compression)
	if err != nil {
		return storage.Dataset{}, fmt.Errorf("dataset %s: %w", name, err)
	}
	mnt, err := b.openMount(want.PoolID)
	if err != nil {
		return storage.Dataset{}, fmt.Errorf("dataset %s: %w", name, err)
	}
	unlock, err := b.lockPool(ctx, want.PoolID)
	if err != nil {
		return storage.Dataset{}, err
	}
	defer unlock()
	fail := func(err error) (storage.Dataset, error) {
		return storage.Dataset{}, fmt.Errorf("dataset %s: %w", name, err)
	}

	path := filepath.Join(mnt, rel)
	a, err := b.readAttrsOn(ctx, want.PoolID, path)
	found := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	if found && !a.subvol {
		return fail(fmt.Errorf("%s exists and is not a subvolume", path))
	}
	if found && a.id != "" && a.id != want.ID {
		return fail(fmt.Errorf("recorded id %s, configured %s: %w", a.id, want.ID, storage.ErrOtherID))
	}
	var res string
	if want.Reservation != nil && *want.Reservation > 0 {
		res = strconv.FormatUint(*want.Reservation, 10)
	}
	if res != "" && res != a.reservation {
		if err := b.admit(ctx, want.PoolID, mnt, rel, *want.Reservation); err != nil {
			return fail(err)
		}
	}
	if !found {
		if err := b.createDataset(ctx, want.PoolID, mnt, rel, want.ID, res); err != nil {
			return fail(err)
		}
		b.log.Info("created dataset", "dataset", name, "id", want.ID)
	} else if a.id == "" || a.parent != "" || a.reservation != res {
		kv := map[string]string{xattrID: want.ID, xattrParent: "", xattrReservation: res}
		if err := b.setxattrsOn(ctx, want.PoolID, path, kv); err != nil {
			return fail(err)
		}
		b.log.Info("recorded dataset", "dataset", name, "id", want.ID, "reservation", res)
	}
	if a, err = b.readAttrsOn(ctx, want.PoolID, path); err != nil {
		return fail(err)
	}
	// Quota: the subvolume's qgroup limit. Unlike a ZFS quota it does not
	// count nested subvolumes (each has its own qgroup).
	if _, limit := qgroup(want.PoolID, a.subvolID); !sameSize(limit, want.Quota) {
		arg := "none"
		if want.Quota != nil && *want.Quota > 0 {
			arg = strconv.FormatUint(*want.Quota, 10)
		}
		if _, err := b.command(ctx, "btrfs", "qgroup", "limit", arg, path); err != nil {
			return fail(err)
		}
		b.log.Info("set quota", "dataset", name, "quota", arg)
	}
	actual := a.btrfsComp
	if actual == "" {
		actual = "none"
	}
	if actual != comp {
		if _, err := b.command(ctx, "btrfs", "property", "set", path, "compression", comp); err != nil {
			return fail(err)
		}
		b.log.Info("set compression", "dataset", name, "compression", comp)
	}
	if enc := encodeCompression(want.Compression); a.compression != enc {
		if err := b.setxattrsOn(ctx, want.PoolID, path, map[string]string{xattrCompression: enc}); err != nil {
			return fail(err)
		}
	}
	if a, err = b.readAttrsOn(ctx, want.PoolID, path); err != nil {
		return fail(err)
	}
	st, err := statfs(ctx, b, want.PoolID, mnt)
	if err != nil {
		return fail(err)
	}
	return observed(want.PoolID, rel, path, a, st.Bavail*uint64(st.Bsize)), nil
}

func sameSize(have, want *uint64) bool {
	h, w := uint64(0), uint64(0)
	if have != nil {
		h = *have
	}
	if want != nil {
		w = *want
	}
	return h == w
}

// admit checks that reservation r for the dataset at rel, with every other
// reservation on the pool, fits in the pool.
func (b *Backend) admit(ctx context.Context, poolID, mnt, rel string, r uint64) error {
	subs, err := b.subvolumes(ctx, mnt)
	if err != nil {
		return err
	}
	var others uint64
	for _, s := range subs {
		if s.rel == rel || isTemp(s.rel) {
			continue
		}
		a, err := b.readAttrsOn(ctx, poolID, filepath.Join(mnt, s.rel))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if v, err := strconv.ParseUint(a.reservation, 10, 64); err == nil {
			others += v
		}
	}
	st, err := statfs(ctx, b, poolID, mnt)
	if err != nil {
		return err
	}
	size := st.Blocks * uint64(st.Bsize)
	if others > size || r > size-others {
		return fmt.Errorf("reservation of %d bytes: the pool holds %d bytes, of which other datasets reserve %d: %w", r, size, others, ErrReservation)
	}
	return nil
}

// createDataset makes the subvolume at rel, and any missing parent (marked
// as a parent, without an id). Each is created under a temporary name, its
// xattrs set, then renamed into place, so that a subvolume at a dataset's
// path is never without its id, whenever the agent stops.
func (b *Backend) createDataset(ctx context.Context, poolID, mnt, rel, id, res string) error {
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		prel := strings.Join(parts[:i], "/")
		a, err := b.readAttrsOn(ctx, poolID, filepath.Join(mnt, prel))
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := b.createSubvolume(ctx, poolID, mnt, prel, map[string]string{xattrParent: "1"}); err != nil {
				return err
			}
		case err != nil:
			return err
		case !a.subvol:
			return fmt.Errorf("%s exists and is not a subvolume", filepath.Join(mnt, prel))
		}
	}
	return b.createSubvolume(ctx, poolID, mnt, rel, map[string]string{xattrID: id, xattrReservation: res})
}

func (b *Backend) createSubvolume(ctx context.Context, poolID, mnt, rel string, kv map[string]string) error {
	final := filepath.Join(mnt, rel)
	tmp := filepath.Join(filepath.Dir(final), tmpPrefix+filepath.Base(final))
	if a, err := b.readAttrsOn(ctx, poolID, tmp); err == nil && a.subvol {
		// Left by a crash before its rename: never visible, ours by name.
		if _, err := b.command(ctx, "btrfs", "subvolume", "delete", tmp); err != nil {
			return err
		}
	}
	if _, err := b.command(ctx, "btrfs", "subvolume", "create", tmp); err != nil {
		return err
	}
	if err := b.setxattrsOn(ctx, poolID, tmp, kv); err != nil {
		return err
	}
	_, err := syscallOn(ctx, b, poolID, func() (struct{}, error) {
		return struct{}{}, unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE)
	})
	if errors.Is(err, unix.EEXIST) {
		// Made meanwhile by someone else: the caller reads what is there.
		_, derr := b.command(ctx, "btrfs", "subvolume", "delete", tmp)
		return derr
	}
	return err
}

// DestroyDataset deletes a dataset's subvolume with everything in it,
// nested subvolumes first. A dataset that does not exist is not an error.
func (b *Backend) DestroyDataset(ctx context.Context, poolID, name string) error {
	rel, err := relName(poolID, name)
	if err != nil {
		return err
	}
	mnt, err := b.openMount(poolID)
	if err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	unlock, err := b.lockPool(ctx, poolID)
	if err != nil {
		return err
	}
	defer unlock()
	path := filepath.Join(mnt, rel)
	a, err := b.readAttrsOn(ctx, poolID, path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	if !a.subvol {
		return fmt.Errorf("destroy %s: %s is not a subvolume", name, path)
	}
	subs, err := b.subvolumes(ctx, mnt)
	if err != nil {
		return fmt.Errorf("destroy %s: %w", name, err)
	}
	var doomed []string
	for _, s := range subs {
		if strings.HasPrefix(s.rel, rel+"/") {
			doomed = append(doomed, s.rel)
		}
	}
	sort.Slice(doomed, func(i, j int) bool { return strings.Count(doomed[i], "/") > strings.Count(doomed[j], "/") })
	for _, r := range append(doomed, rel) {
		if _, err := b.command(ctx, "btrfs", "subvolume", "delete", filepath.Join(mnt, r)); err != nil {
			return fmt.Errorf("destroy %s: %w", name, err)
		}
	}
	b.log.Info("destroyed dataset", "dataset", name, "nested", len(doomed))
	return nil
}

package btrfs

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

func TestSyntheticDisksIdentity(t *testing.T) {
	r := newRig(t, "a", "m2:b")
	ctx := testCtx(t)
	disks, err := r.b.Disks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(disks) != 2 {
		t.Fatalf("disks = %+v, want 2", disks)
	}
	// Sorted by file name: m2_ before u2_.
	want := []struct {
		id   storage.DiskIdentity
		v    storage.DiskVariant
		slot int64
	}{
		{storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-M2", Serial: "synthetic-serial-" + r.tag + "-b"}, storage.VariantM2, 1024},
		{storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: "synthetic-serial-" + r.tag + "-a"}, storage.VariantU2, 1025},
	}
	for i, d := range disks {
		if d.Identity != want[i].id || d.Variant != want[i].v || d.Slot != want[i].slot {
			t.Errorf("disk %d = %+v, want %+v", i, d, want[i])
		}
		if d.Content != storage.ContentBlank || d.Size != vdevSize || !strings.HasPrefix(d.Path, "/dev/loop") {
			t.Errorf("disk %d = %+v, want a blank %d-byte loop device", i, d, vdevSize)
		}
	}
	// Listing again finds the same loop devices; it attaches none.
	again, err := r.b.Disks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range again {
		if again[i].Path != disks[i].Path {
			t.Errorf("disk %d moved from %s to %s", i, disks[i].Path, again[i].Path)
		}
	}
	if n := len(LoopsBackedBy(r.dir)); n != 2 {
		t.Errorf("%d loop devices backed by the test's files, want 2", n)
	}
}

func TestBlankToDatasets(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	poolID, pool := r.pool(ctx, "a")
	if pool.Health != "online" || pool.TotalSize == 0 || pool.Mountpoint != filepath.Join(r.poolRoot, "ext", poolID) {
		t.Fatalf("pool = %+v", pool)
	}
	out, err := exec.Command("blkid", "-p", "-o", "export", r.vdev("a")).Output()
	if err != nil || !strings.Contains(string(out), "UUID="+poolID+"\n") || !strings.Contains(string(out), "LABEL=oxp_"+poolID+"\n") {
		t.Fatalf("blkid of the vdev: %v\n%s", err, out)
	}
	disks, _ := r.b.Disks(ctx)
	if len(disks) != 1 || disks[0].Content != storage.ContentPool || disks[0].PoolID != poolID {
		t.Fatalf("disks = %+v, want our pool %s", disks, poolID)
	}

	want := dataset(poolID, "debug")
	want.Quota = ptr(uint64(100 << 20))
	want.Compression = storage.Compression{Type: "gzip_n", Level: 5}
	got, err := r.b.EnsureDataset(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(pool.Mountpoint, "crypt", "debug")
	if got.Name != "oxp_"+poolID+"/crypt/debug" || got.ID != want.ID || got.Path != path || got.Quota == nil || *got.Quota != 100<<20 {
		t.Fatalf("dataset = %+v", got)
	}
	// What btrfs itself says.
	if v, _ := getxattr(path, "user.oxide.uuid"); v != want.ID {
		t.Errorf("user.oxide.uuid = %q, want %s", v, want.ID)
	}
	if out, _ := exec.Command("btrfs", "property", "get", path, "compression").Output(); strings.TrimSpace(string(out)) != "compression=zlib:5" {
		t.Errorf("compression property: %q", out)
	}
	if out, _ := exec.Command("btrfs", "qgroup", "show", "-re", "--raw", pool.Mountpoint).Output(); !qgroupLimited(string(out), "crypt/debug", "104857600") {
		t.Errorf("qgroup show:\n%s", out)
	}

	fileSync(t, filepath.Join(path, "data"), 4<<20)
	list, err := r.b.Datasets(ctx, poolID)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("datasets = %+v, want crypt/debug alone (crypt is a parent, not a dataset)", list)
	}
	d := list[0]
	if d.Name != got.Name || d.ID != want.ID || d.Compression != want.Compression || !d.Mounted {
		t.Errorf("listed %+v", d)
	}
	if d.Used < 4<<20 || d.Available == 0 || d.Available > 100<<20-d.Used {
		t.Errorf("used %d, available %d: want used ≥ 4 MiB and available ≤ quota - used", d.Used, d.Available)
	}

	// The same config again changes nothing.
	r.rec.take()
	if _, err := r.b.EnsureDataset(ctx, want); err != nil {
		t.Fatal(err)
	}
	if c := changes(r.rec.take()); len(c) != 0 {
		t.Errorf("a pass that changes nothing ran %q", c)
	}
	// Only what differs is set.
	want.Quota = ptr(uint64(200 << 20))
	if _, err := r.b.EnsureDataset(ctx, want); err != nil {
		t.Fatal(err)
	}
	if c := changes(r.rec.take()); len(c) != 1 || !strings.HasPrefix(c[0], "btrfs qgroup limit 209715200 ") {
		t.Errorf("changing the quota ran %q", c)
	}
}

// qgroupLimited reports whether `btrfs qgroup show -re --raw` shows path's
// qgroup with max referenced limit.
func qgroupLimited(out, path, limit string) bool {
	for _, line := range strings.Split(out, "\n") {
		fs := strings.Fields(line)
		if len(fs) >= 6 && fs[len(fs)-1] == path && fs[3] == limit {
			return true
		}
	}
	return false
}

func TestAdoptAfterRestart(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	poolID, pool := r.pool(ctx, "a")
	ds := []storage.DatasetConfig{dataset(poolID, "zone"), dataset(poolID, "zone/oxz_ntp_"+uuid.NewString()), dataset(poolID, "crucible")}
	for _, d := range ds {
		if _, err := r.b.EnsureDataset(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(pool.Mountpoint, "crucible", "extent")
	if err := os.WriteFile(data, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}

	check := func(stage string) {
		t.Helper()
		disks, err := r.b.Disks(ctx)
		if err != nil || len(disks) != 1 || disks[0].Content != storage.ContentPool || disks[0].PoolID != poolID {
			t.Fatalf("%s: disks = %+v, %v", stage, disks, err)
		}
		if _, err := r.b.OpenPool(ctx, r.id("a"), poolID); err != nil {
			t.Fatalf("%s: %v", stage, err)
		}
		for _, d := range ds {
			if _, err := r.b.EnsureDataset(ctx, d); err != nil {
				t.Fatalf("%s: %v", stage, err)
			}
		}
		cmds := r.rec.take()
		for _, bad := range []string{"mkfs", "btrfs subvolume create", "btrfs subvolume delete", "btrfs qgroup limit", "btrfs property set"} {
			if hasCommand(cmds, bad) {
				t.Errorf("%s: ran %s: %q", stage, bad, cmds)
			}
		}
		if b, err := os.ReadFile(data); err != nil || string(b) != "keep me" {
			t.Errorf("%s: data file: %q, %v", stage, b, err)
		}
	}
	// The agent restarts; the pool is still mounted.
	r.b = r.newBackend()
	check("restart")
	if hasCommand(r.rec.take(), "mount") {
		t.Error("restart mounted the pool again")
	}
	// The machine restarts: nothing mounted, the loop device gone.
	if err := r.b.ClosePool(ctx, poolID); err != nil {
		t.Fatal(err)
	}
	r.detach()
	r.b = r.newBackend()
	check("reboot")
}

func TestForeignDiskNeverWritten(t *testing.T) {
	needTools(t, "mkfs.ext4")
	r := newRig(t)
	ctx := testCtx(t)
	ext4 := r.addVdev("ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", ext4).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	other := r.addVdev("otherbtrfs")
	if out, err := exec.Command("mkfs.btrfs", "-q", "-L", "not-ours", other).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.btrfs: %v %s", err, out)
	}
	junk := r.addVdev("junk")
	f, _ := os.OpenFile(junk, os.O_WRONLY, 0)
	f.WriteAt([]byte("something nobody recognises"), 4096)
	f.Close()
	before := map[string]string{}
	for _, p := range []string{ext4, other, junk} {
		before[p] = sha(t, p)
	}

	disks, err := r.b.Disks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	whats := map[string]string{"ext4": "ext4 filesystem", "otherbtrfs": `labelled "not-ours"`, "junk": "unrecognised data at byte 4096"}
	for _, d := range disks {
		name := strings.TrimPrefix(d.Identity.Serial, "synthetic-serial-"+r.tag+"-")
		if d.Content != storage.ContentForeign || !strings.Contains(d.Foreign, whats[name]) {
			t.Errorf("%s: %s %q, want foreign %q", name, d.Content, d.Foreign, whats[name])
		}
		err := r.b.CreatePool(ctx, d.Identity, uuid.NewString())
		if !errors.Is(err, storage.ErrNotBlank) {
			t.Errorf("%s: CreatePool = %v, want ErrNotBlank", name, err)
		}
		if _, err := r.b.OpenPool(ctx, d.Identity, uuid.NewString()); err == nil {
			t.Errorf("%s: OpenPool succeeded", name)
		}
	}
	if len(disks) != 3 {
		t.Errorf("%d disks, want 3", len(disks))
	}
	if c := changes(r.rec.take()); len(c) != 0 {
		t.Errorf("ran %q on foreign disks", c)
	}
	r.detach()
	for p, h := range before {
		if sha(t, p) != h {
			t.Errorf("%s changed", filepath.Base(p))
		}
	}
}

func TestOtherIDLeftAlone(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	poolID, pool := r.pool(ctx, "a")
	first := dataset(poolID, "cockroachdb")
	if _, err := r.b.EnsureDataset(ctx, first); err != nil {
		t.Fatal(err)
	}
	second := first
	second.ID = uuid.NewString()
	second.Quota = ptr(uint64(1 << 20))
	r.rec.take()
	_, err := r.b.EnsureDataset(ctx, second)
	if !errors.Is(err, storage.ErrOtherID) {
		t.Fatalf("EnsureDataset = %v, want ErrOtherID", err)
	}
	if c := changes(r.rec.take()); len(c) != 0 {
		t.Errorf("ran %q", c)
	}
	if v, _ := getxattr(filepath.Join(pool.Mountpoint, "crypt", "cockroachdb"), xattrID); v != first.ID {
		t.Errorf("id is now %q, want %s", v, first.ID)
	}
}

func TestReservationBeyondPoolRefused(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	poolID, pool := r.pool(ctx, "a")
	huge := dataset(poolID, "crucible")
	huge.Reservation = ptr(pool.TotalSize + 1)
	_, err := r.b.EnsureDataset(ctx, huge)
	if !errors.Is(err, ErrReservation) || !strings.Contains(err.Error(), "reservation of") {
		t.Fatalf("EnsureDataset = %v, want ErrReservation naming the reservation", err)
	}
	sixty := pool.TotalSize / 10 * 6
	a := dataset(poolID, "crucible")
	a.Reservation = &sixty
	got, err := r.b.EnsureDataset(ctx, a)
	if err != nil || got.Reservation == nil || *got.Reservation != sixty {
		t.Fatalf("EnsureDataset = %+v, %v", got, err)
	}
	b := dataset(poolID, "debug")
	b.Reservation = &sixty
	if _, err := r.b.EnsureDataset(ctx, b); !errors.Is(err, ErrReservation) {
		t.Fatalf("a second 60%% reservation: %v, want ErrReservation", err)
	}
	list, _ := r.b.Datasets(ctx, poolID)
	if len(list) != 1 || list[0].Name != a.Name() {
		t.Errorf("datasets = %+v, want %s alone: a refused dataset is not created", list, a.Name())
	}
	// Once the first is lowered, the second fits.
	a.Reservation = ptr(sixty / 2)
	if _, err := r.b.EnsureDataset(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.EnsureDataset(ctx, b); err != nil {
		t.Fatalf("after lowering: %v", err)
	}
}

func TestParentsAndDestroy(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	poolID, pool := r.pool(ctx, "a")
	zoneA := dataset(poolID, "zone/oxz_a")
	zoneB := dataset(poolID, "zone/oxz_b")
	for _, d := range []storage.DatasetConfig{zoneA, zoneB} {
		if _, err := r.b.EnsureDataset(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	names := func() []string {
		list, err := r.b.Datasets(ctx, poolID)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, d := range list {
			n = append(n, strings.TrimPrefix(d.Name, "oxp_"+poolID+"/"))
		}
		return n
	}
	if n := names(); strings.Join(n, " ") != "crypt/zone/oxz_a crypt/zone/oxz_b" {
		t.Fatalf("datasets %q: the parents crypt and crypt/zone are not datasets", n)
	}
	zone := dataset(poolID, "zone")
	if _, err := r.b.EnsureDataset(ctx, zone); err != nil {
		t.Fatal(err)
	}
	if n := names(); strings.Join(n, " ") != "crypt/zone crypt/zone/oxz_a crypt/zone/oxz_b" {
		t.Fatalf("datasets %q: ensuring zone makes its parent subvolume a dataset", n)
	}
	if err := r.b.DestroyDataset(ctx, poolID, zoneA.Name()); err != nil {
		t.Fatal(err)
	}
	if n := names(); strings.Join(n, " ") != "crypt/zone crypt/zone/oxz_b" {
		t.Fatalf("after destroying oxz_a: %q", n)
	}
	if err := r.b.DestroyDataset(ctx, poolID, zone.Name()); err != nil {
		t.Fatal(err)
	}
	if n := names(); len(n) != 0 {
		t.Fatalf("after destroying zone: %q, want none", n)
	}
	if exists(filepath.Join(pool.Mountpoint, "crypt", "zone")) {
		t.Error("crypt/zone is still there")
	}
	if err := r.b.DestroyDataset(ctx, poolID, zone.Name()); err != nil {
		t.Fatalf("destroying it again: %v", err)
	}
	if err := r.b.DestroyDataset(ctx, poolID, "oxp_"+poolID+"/crypt/../x"); err == nil {
		t.Error("a name with .. was accepted")
	}
}

func TestClosePoolKeepsIt(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	poolID, pool := r.pool(ctx, "a")
	if _, err := r.b.EnsureDataset(ctx, dataset(poolID, "debug")); err != nil {
		t.Fatal(err)
	}
	if err := r.b.ClosePool(ctx, poolID); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := mountAt(pool.Mountpoint); ok {
		t.Fatal("still mounted")
	}
	if err := r.b.ClosePool(ctx, poolID); err != nil {
		t.Fatalf("closing a closed pool: %v", err)
	}
	if _, err := r.b.Datasets(ctx, poolID); err == nil || !strings.Contains(err.Error(), "not open") {
		t.Fatalf("Datasets of a closed pool: %v", err)
	}
	if _, err := r.b.OpenPool(ctx, r.id("a"), poolID); err != nil {
		t.Fatal(err)
	}
	if list, _ := r.b.Datasets(ctx, poolID); len(list) != 1 {
		t.Fatalf("datasets after reopening: %+v", list)
	}
	// Another pool id for the same disk is refused, and nothing is done.
	r.b.ClosePool(ctx, poolID)
	r.rec.take()
	if _, err := r.b.OpenPool(ctx, r.id("a"), uuid.NewString()); err == nil || !strings.Contains(err.Error(), "unexpected pool id") {
		t.Fatalf("OpenPool with another id: %v", err)
	}
	if c := changes(r.rec.take()); len(c) != 0 {
		t.Errorf("ran %q", c)
	}
}

// makeHalfMade turns the pool on the vdev file into what a killed
// mkfs.btrfs leaves: its superblock with mkfs's temporary magic (and a
// valid checksum, as mkfs writes it; checked against a real killed mkfs
// with btrfs-progs 6.2).
func makeHalfMade(t *testing.T, vdev string) {
	t.Helper()
	f, err := os.OpenFile(vdev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb := make([]byte, superSize)
	if _, err := f.ReadAt(sb, superOffset); err != nil {
		t.Fatal(err)
	}
	copy(sb[superMagicAt:], superMagicTemp)
	binary.LittleEndian.PutUint32(sb[:4], crc32.Checksum(sb[superCsumLen:], crc32.MakeTable(crc32.Castagnoli)))
	if _, err := f.WriteAt(sb, superOffset); err != nil {
		t.Fatal(err)
	}
}

// A crash of the agent during mkfs.btrfs leaves a superblock that no tool
// recognises; a pool whose making was cut short is made again by OpenPool
// with the same id, and never by anything else.
func TestInterruptedMkfsIsMadeAgain(t *testing.T) {
	r := newRig(t, "a", "b")
	ctx := testCtx(t)
	ids := map[string]string{"a": uuid.NewString(), "b": uuid.NewString()}
	for name, id := range ids {
		if err := r.b.CreatePool(ctx, r.id(name), id); err != nil {
			t.Fatal(err)
		}
		if err := r.b.ClosePool(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	r.detach()
	for name := range ids {
		makeHalfMade(t, r.vdev(name))
	}
	r.b = r.newBackend()
	disks, err := r.b.Disks(ctx)
	if err != nil || len(disks) != 2 {
		t.Fatalf("disks %+v, %v", disks, err)
	}
	for _, d := range disks {
		name := strings.TrimPrefix(d.Identity.Serial, syntheticSerial+r.tag+"-")
		if d.Content != storage.ContentPool || d.PoolID != ids[name] {
			t.Errorf("disk %s: %+v, want pool %s", name, d, ids[name])
		}
	}
	// Another id than the half-made pool's: refused, nothing written.
	before := sha(t, r.vdev("b"))
	if _, err := r.b.OpenPool(ctx, r.id("b"), uuid.NewString()); err == nil || !strings.Contains(err.Error(), "unexpected pool id") {
		t.Fatalf("OpenPool with another id: %v", err)
	}
	if hasCommand(r.rec.take(), "mkfs") || sha(t, r.vdev("b")) != before {
		t.Fatal("a half-made pool was written for another pool id")
	}
	// Its own id: made again, then usable.
	p, err := r.b.OpenPool(ctx, r.id("a"), ids["a"])
	if err != nil {
		t.Fatalf("OpenPool of the half-made pool: %v", err)
	}
	if !hasCommand(r.rec.take(), "mkfs.btrfs --nodiscard --force -U "+ids["a"]) {
		t.Error("the half-made pool was not made again")
	}
	if _, err := r.b.EnsureDataset(ctx, dataset(ids["a"], "debug")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.Mountpoint, "crypt", "debug")); err != nil {
		t.Fatal(err)
	}
}

package btrfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// probe reads regular files as it reads disks: no root needed.
func TestProbeTellsWhatADiskHolds(t *testing.T) {
	needTools(t, "blkid", "mkfs.ext4", "mkfs.btrfs")
	dir := t.TempDir()
	b, _ := New(Options{PoolRoot: "/nonexistent"})
	file := func(name string, setup ...string) string {
		p := filepath.Join(dir, name)
		f, _ := os.Create(p)
		f.Truncate(vdevSize)
		f.Close()
		if len(setup) > 0 {
			if out, err := exec.Command(setup[0], append(setup[1:], p)...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v %s", setup, err, out)
			}
		}
		return p
	}
	pool := uuid.NewString()
	junk := file("junk")
	f, _ := os.OpenFile(junk, os.O_WRONLY, 0)
	f.WriteAt([]byte{1}, 700<<10)
	f.Close()
	tests := []struct {
		path string
		want content
	}{
		{file("blank"), content{kind: storage.ContentBlank}},
		{file("ours", "mkfs.btrfs", "-q", "-U", pool, "-L", "oxp_"+pool), content{kind: storage.ContentPool, poolID: pool}},
		{file("mislabelled", "mkfs.btrfs", "-q", "-L", "oxp_"+uuid.NewString()), content{kind: storage.ContentForeign}},
		{file("ext4", "mkfs.ext4", "-q", "-F"), content{kind: storage.ContentForeign, what: "ext4 filesystem"}},
		{junk, content{kind: storage.ContentForeign, what: "unrecognised data at byte 716800"}},
	}
	for _, tt := range tests {
		got, err := b.probe(context.Background(), tt.path)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(tt.path), err)
		}
		if tt.want.what == "" && got.kind == storage.ContentForeign {
			got.what = ""
		}
		if got != tt.want {
			t.Errorf("%s: %+v, want %+v", filepath.Base(tt.path), got, tt.want)
		}
	}
}

func TestSuperblockChecksumChecked(t *testing.T) {
	needTools(t, "mkfs.btrfs")
	p := filepath.Join(t.TempDir(), "d")
	f, _ := os.Create(p)
	f.Truncate(vdevSize)
	f.Close()
	id := uuid.NewString()
	if out, err := exec.Command("mkfs.btrfs", "-q", "-U", id, "-L", "oxp_"+id, p).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	head, err := readHead(p)
	if err != nil {
		t.Fatal(err)
	}
	if fsid, label, _, ok := parseSuper(head); !ok || fsid != id || label != "oxp_"+id {
		t.Fatalf("parseSuper = %q %q %v", fsid, label, ok)
	}
	head[superOffset+superLabelAt] ^= 1
	if _, _, _, ok := parseSuper(head); ok {
		t.Fatal("a superblock with a bad checksum was taken")
	}
}

func TestVdevNames(t *testing.T) {
	for file, want := range map[string]storage.DiskIdentity{
		"u2_a.vdev":     {Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: "synthetic-serial-a"},
		"m2_0.vdev":     {Vendor: "synthetic-vendor", Model: "synthetic-model-M2", Serial: "synthetic-serial-0"},
		"u2_a.img":      {},
		"x2_a.vdev":     {},
		"u2_.vdev":      {},
		"u2_../x.vdev":  {},
		"u2_a b.vdev":   {},
		"u2_.hide.vdev": {},
	} {
		name, v, ok := parseVdevName(file)
		var got storage.DiskIdentity
		if ok {
			got = syntheticIdentity(name, v)
		}
		if got != want {
			t.Errorf("%s: %+v, want %+v", file, got, want)
		}
	}
}

func TestSysfsDisks(t *testing.T) {
	root := t.TempDir()
	write := func(rel, v string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(v+"\n"), 0o644)
	}
	write("nvme0n1/device/model", "WUS4C6432DSP3X3     ")
	write("nvme0n1/device/serial", "A079E3F8")
	write("nvme0n1/device/firmware_rev", "R2210000")
	write("nvme0n1/device/device/vendor", "0x1b96")
	write("nvme0c0n1/hidden", "1")
	write("sda/device/vendor", "ATA     ")
	write("sda/device/model", "Samsung SSD")
	write("sda/device/wwid", "naa.5002538")
	write("vda/device/vendor", "0x1af4")
	write("vda/serial", "rootdisk")
	write("vdb/device/vendor", "0x1af4") // no serial: cannot be told apart
	write("loop0/loop/backing_file", "/x")
	write("dm-0/dev", "253:0")
	write("zram0/dev", "252:0")
	write("ram0/dev", "1:0")
	got, err := sysfsDisks(root)
	if err != nil {
		t.Fatal(err)
	}
	rev := "R2210000"
	want := []blockDev{
		{name: "nvme0n1", path: "/dev/nvme0n1", identity: storage.DiskIdentity{Vendor: "1b96", Model: "WUS4C6432DSP3X3", Serial: "A079E3F8"},
			variant: storage.VariantU2, slot: 0, firmware: storage.Firmware{ActiveSlot: 1, Slots: 1, Versions: []*string{&rev}}},
		{name: "sda", path: "/dev/sda", identity: storage.DiskIdentity{Vendor: "ATA", Model: "Samsung SSD", Serial: "naa.5002538"}, variant: storage.VariantU2, slot: 1},
		{name: "vda", path: "/dev/vda", identity: storage.DiskIdentity{Vendor: "1af4", Serial: "rootdisk"}, variant: storage.VariantU2, slot: 2},
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(blockDev{})); d != "" {
		t.Errorf("sysfsDisks (-want +got):\n%s", d)
	}
}

func TestCompressionTable(t *testing.T) {
	for _, tt := range []struct {
		c     storage.Compression
		btrfs string
	}{
		{storage.Compression{}, "none"},
		{storage.Compression{Type: "off"}, "none"},
		{storage.Compression{Type: "on"}, "lzo"},
		{storage.Compression{Type: "gzip"}, "zlib:6"},
		{storage.Compression{Type: "gzip_n", Level: 1}, "zlib:1"},
		{storage.Compression{Type: "gzip_n", Level: 9}, "zlib:9"},
		{storage.Compression{Type: "lz4"}, "lzo"},
		{storage.Compression{Type: "lzjb"}, "lzo"},
		{storage.Compression{Type: "zle"}, "lzo"},
	} {
		got, err := btrfsCompression(tt.c)
		if err != nil || got != tt.btrfs {
			t.Errorf("%v → %q, %v; want %q", tt.c, got, err, tt.btrfs)
		}
		// Reported as configured while btrfs still has what it maps to.
		want := tt.c
		if want.Type == "" {
			want.Type = "off"
		}
		a := attrs{compression: encodeCompression(tt.c), btrfsComp: tt.btrfs}
		if got := observedCompression(a); got != want {
			t.Errorf("%v reported as %v", tt.c, got)
		}
	}
	for _, bad := range []storage.Compression{{Type: "gzip_n", Level: 0}, {Type: "gzip_n", Level: 10}, {Type: "zstd"}} {
		if _, err := btrfsCompression(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	// Changed behind our back: reported as btrfs has it.
	for btrfs, want := range map[string]storage.Compression{
		"": {Type: "off"}, "zlib": {Type: "gzip_n", Level: 3}, "zlib:7": {Type: "gzip_n", Level: 7},
		"lzo": {Type: "lz4"}, "zstd:3": {Type: "on"},
	} {
		if got := observedCompression(attrs{compression: "off", btrfsComp: btrfs}); got != want {
			t.Errorf("btrfs %q reported as %v, want %v", btrfs, got, want)
		}
	}
}

func TestNamesValidated(t *testing.T) {
	pool := uuid.NewString()
	for name, ok := range map[string]bool{
		"oxp_" + pool + "/crypt/debug":                true,
		"oxp_" + pool + "/crypt/zone/oxz_ntp_" + pool: true,
		"oxp_" + pool + "/crucible":                   true,
		"oxp_" + pool + "/":                           false,
		"oxp_" + pool + "/crypt/../../etc":            false,
		"oxp_" + pool + "/crypt/.oxide-new-debug":     false,
		"oxp_" + pool + "/crypt//debug":               false,
		"oxp_" + pool + "/crypt/a b":                  false,
		"oxp_" + uuid.NewString() + "/crypt/debug":    false,
		"crypt/debug":                                 false,
	} {
		if _, err := relName(pool, name); (err == nil) != ok {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := relName(strings.ToUpper(pool), "oxp_"+strings.ToUpper(pool)+"/crypt/debug"); err == nil {
		t.Error("a pool id not in canonical form was accepted")
	}
}

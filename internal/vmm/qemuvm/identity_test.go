package qemuvm

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/qemu"
)

func TestParseIDRange(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want IDRange
		err  string
	}{
		{"1879048192:16777216", DefaultIDs, ""},
		{"100000:65536", IDRange{100000, 65536}, ""},
		{"1000:1", IDRange{1000, 1}, ""},
		{"4294967294:1", IDRange{4294967294, 1}, ""},
		{"0:1000", IDRange{}, "holds root's or the system's users' ids"},
		{"999:10", IDRange{}, "holds root's or the system's users' ids"},
		{"65000:1000", IDRange{}, "holds nobody's id"},
		{"65535:1", IDRange{}, "holds nobody's id"},
		{"4294967295:1", IDRange{}, "past the last id"},
		{"4294967000:1000", IDRange{}, "past the last id"},
		{"2000:0", IDRange{}, "no ids"},
		{"2000", IDRange{}, "want FIRST:COUNT"},
		{"2000-3000", IDRange{}, "want FIRST:COUNT"},
		{"-1:5", IDRange{}, "want FIRST:COUNT"},
		{"4294967296:1", IDRange{}, "want FIRST:COUNT"},
		{"", IDRange{}, "want FIRST:COUNT"},
	} {
		got, err := ParseIDRange(tt.in)
		if tt.err != "" {
			if !errors.Is(err, ErrIDRange) || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseIDRange(%q) = %v, %v; want an error saying %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseIDRange(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	if s := DefaultIDs.String(); s != "1879048192:16777216" || DefaultIDs.Last() != 1895825407 {
		t.Errorf("DefaultIDs %s, last %d", s, DefaultIDs.Last())
	}
}

// A VM's id is its own, the same on every start, within the range; one a
// process holds is passed over for the next one up, wrapping at the end.
func TestPick(t *testing.T) {
	free := func(uint32) bool { return false }
	r := IDRange{First: 100000, Count: 1000}
	const vmm = "4F1A7D4E-6A53-4D0C-9D57-5D6E4F1B2C01"
	id, err := r.Pick(vmm, free)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := r.Pick(strings.ToLower(vmm), free); again != id {
		t.Errorf("Pick = %d, then %d for the same VMM in lower case", id, again)
	}
	if id < r.First || id > r.Last() {
		t.Errorf("Pick = %d, outside %d–%d", id, r.First, r.Last())
	}
	// Different VMMs spread over the range.
	seen := map[uint32]bool{}
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		n, _ := r.Pick(name, free)
		seen[n] = true
	}
	if len(seen) < 6 {
		t.Errorf("eight names took %d ids of 1000", len(seen))
	}
	// Taken: the next one up; at the end, the first.
	next := func(n, by uint32) uint32 { return r.First + (n-r.First+by)%r.Count }
	taken := map[uint32]bool{id: true, next(id, 1): true}
	if got, _ := r.Pick(vmm, func(n uint32) bool { return taken[n] }); got != next(id, 2) {
		t.Errorf("with %d and %d taken, Pick = %d, want %d", id, next(id, 1), got, next(id, 2))
	}
	one := IDRange{First: 5000, Count: 2}
	first, _ := one.Pick(vmm, free)
	other := 5000 + (first-5000+1)%2
	if got, _ := one.Pick(vmm, func(n uint32) bool { return n == first }); got != other {
		t.Errorf("range of two, %d taken: Pick = %d, want %d", first, got, other)
	}
	if _, err := one.Pick(vmm, func(uint32) bool { return true }); !errors.Is(err, ErrIDRange) || !strings.Contains(err.Error(), "all held") {
		t.Errorf("every id taken: %v", err)
	}
	if _, err := (IDRange{}).Pick(vmm, free); !errors.Is(err, ErrIDRange) {
		t.Errorf("empty range: %v", err)
	}
}

// fakeProc is a /proc of processes with the given status lines.
func fakeProc(t *testing.T, procs map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, status := range procs {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if status == "" {
			continue // a process that ended while /proc was read
		}
		if err := os.WriteFile(filepath.Join(root, pid, "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestIdsInUse(t *testing.T) {
	proc := fakeProc(t, map[string]string{
		"1":    "Name:\tinit\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n",
		"42":   "Name:\tqemu\nUid:\t100007\t100007\t100007\t100007\nGid:\t100007\t100007\t100007\t100007\nGroups:\t36\n",
		"43":   "Name:\tsu\nUid:\t1000\t0\t2000\t0\nGid:\t1001\t1001\t1001\t3000\n",
		"44":   "",
		"self": "Uid:\t9\t9\t9\t9\n",
	})
	got, err := idsInUse(proc)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint32
	for id := range got {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if want := []uint32{0, 1000, 1001, 2000, 3000, 100007}; !slices.Equal(ids, want) {
		t.Errorf("ids in use %v, want %v", ids, want)
	}
}

// A VM's identity: its id for uid and gid, passing over ids in use, and
// under KVM /dev/kvm's group; a /dev/kvm QEMU cannot open is an error.
func TestIdentity(t *testing.T) {
	r := IDRange{First: 100000, Count: 10}
	first, _ := r.Pick("vm", func(uint32) bool { return false })
	proc := fakeProc(t, map[string]string{"7": "Uid:\t1\t1\t1\t1\nGid:\t" + itoa(first) + "\t" + itoa(first) + "\t0\t0\n"})
	noKVM := func() ([]uint32, error) { t.Error("/dev/kvm looked at under TCG"); return nil, nil }
	id, err := identity(r, "vm", qemu.TCG, proc, noKVM)
	want := r.First + (first-r.First+1)%r.Count
	if err != nil || id.UID != want || id.GID != want || id.Groups != nil {
		t.Fatalf("identity = %+v, %v; want uid and gid %d (%d is a process's group), no groups", id, err, want, first)
	}
	if s := id.String(); s != "uid "+itoa(want)+" gid "+itoa(want) {
		t.Errorf("String = %q", s)
	}
	id, err = identity(r, "vm", qemu.KVM, proc, func() ([]uint32, error) { return []uint32{36}, nil })
	if err != nil || !slices.Equal(id.Groups, []uint32{36}) || !strings.HasSuffix(id.String(), " and group 36 (/dev/kvm's)") {
		t.Errorf("identity under KVM = %+v (%s), %v", id, id, err)
	}
	kvmErr := errors.New("/dev/kvm is root's alone")
	if _, err := identity(r, "vm", qemu.KVM, proc, func() ([]uint32, error) { return nil, kvmErr }); !errors.Is(err, kvmErr) {
		t.Errorf("identity with /dev/kvm closed to QEMU = %v", err)
	}
	if _, err := identity(r, "vm", qemu.TCG, filepath.Join(proc, "missing"), noKVM); err == nil {
		t.Error("identity with no /proc")
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

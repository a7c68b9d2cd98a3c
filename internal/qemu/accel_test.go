package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fakeHost makes a tree with the given files (directories for sys/module/…,
// empty regular files for dev/…, open to everyone unless the name ends in
// =MODE, such as dev/kvm=0600); a dev file ending in "!" is made
// unopenable.
func fakeHost(t *testing.T, files ...string) Host {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		mode := os.FileMode(0o666)
		if name, m, ok := strings.Cut(f, "="); ok {
			n, err := strconv.ParseUint(m, 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			f, mode = name, os.FileMode(n)
		}
		unopenable := strings.HasSuffix(f, "!")
		p := filepath.Join(root, strings.TrimSuffix(f, "!"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if strings.HasPrefix(f, "sys/") {
			err = os.Mkdir(p, 0o755)
		} else if unopenable {
			// A directory: opening it for writing fails even for root.
			err = os.Mkdir(p, 0o755)
		} else if err = os.WriteFile(p, nil, 0o600); err == nil {
			err = os.Chmod(p, mode)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return Host{Root: root}
}

func TestChooseAccel(t *testing.T) {
	tests := []struct {
		name    string
		files   []string
		mode    string
		want    Accel
		why     string
		wantErr error
	}{
		{"intel", []string{"sys/module/kvm_intel", "dev/kvm"}, "auto", KVM, "kvm_intel loaded and /dev/kvm opens", nil},
		{"amd forced", []string{"sys/module/kvm_amd", "dev/kvm"}, "kvm", KVM, "kvm_amd loaded and /dev/kvm opens", nil},
		{"tcg asked for", []string{"sys/module/kvm_intel", "dev/kvm"}, "tcg", TCG, "TCG asked for", nil},
		{"pvm", []string{"sys/module/kvm", "sys/module/kvm_pvm", "dev/kvm"}, "auto", TCG,
			"kvm_pvm serves /dev/kvm: a paravirtual KVM that runs only specially built guest kernels; using TCG", nil},
		{"pvm forced", []string{"sys/module/kvm_pvm", "dev/kvm"}, "kvm", "", "kvm_pvm serves /dev/kvm", ErrKVMUnusable},
		{"no /dev/kvm", []string{"sys/module/kvm_intel"}, "auto", TCG, "no /dev/kvm; using TCG", nil},
		{"nothing at all", nil, "auto", TCG, "no /dev/kvm; using TCG", nil},
		{"nothing, forced", nil, "kvm", "", "no /dev/kvm", ErrKVMUnusable},
		{"/dev/kvm without a module", []string{"dev/kvm"}, "auto", TCG,
			"/dev/kvm opens but neither kvm_intel nor kvm_amd is loaded: no hardware virtualisation; using TCG", nil},
		{"module but /dev/kvm does not open", []string{"sys/module/kvm_intel", "dev/kvm!"}, "auto", TCG,
			"kvm_intel loaded but /dev/kvm does not open", nil},
		{"module but /dev/kvm does not open, forced", []string{"sys/module/kvm_amd", "dev/kvm!"}, "kvm", "",
			"kvm_amd loaded but /dev/kvm does not open", ErrKVMUnusable},
		{"/dev/kvm root's alone", []string{"sys/module/kvm_intel", "dev/kvm=0600"}, "auto", TCG,
			"kvm_intel loaded and /dev/kvm opens, but not for QEMU, which runs unprivileged: KVM is not usable here: /dev/kvm (mode 0600, ", nil},
		{"/dev/kvm root's alone, forced", []string{"sys/module/kvm_amd", "dev/kvm=0600"}, "kvm", "",
			"a group QEMU may be given: make it 0660 and give it to a kvm group", ErrKVMUnusable},
		{"unknown mode", nil, "hvf", "", `accelerator mode "hvf"`, ErrAccelMode},
		{"empty mode", nil, "", "", `accelerator mode ""`, ErrAccelMode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := fakeHost(t, tt.files...)
			got, why, err := h.ChooseAccel(tt.mode)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.why) {
					t.Fatalf("ChooseAccel(%q) = %q, %q, %v; want an error wrapping %v that says %q", tt.mode, got, why, err, tt.wantErr, tt.why)
				}
				return
			}
			if err != nil || got != tt.want || !strings.HasPrefix(why, tt.why) {
				t.Fatalf("ChooseAccel(%q) = %q, %q, %v; want %q, %q", tt.mode, got, why, err, tt.want, tt.why)
			}
		})
	}
}

// An unprivileged QEMU opens /dev/kvm through its group, a group that is
// not root's, or because everyone may.
func TestKVMGroups(t *testing.T) {
	for _, tt := range []struct {
		mode  string
		gid   int // chowned to it, as root; -1 leaves it
		want  []uint32
		wrong string
	}{
		{"0666", -1, nil, ""},
		{"0660", 4242, []uint32{4242}, ""},
		{"0660", 0, nil, "open to root's group alone"},
		{"0600", -1, nil, "opens for reading and writing to neither everyone nor a group"},
		{"0604", -1, nil, "opens for reading and writing to neither everyone nor a group"},
		{"0606", -1, nil, ""}, // QEMU's own group is not the file's: the others' bits are QEMU's
	} {
		t.Run(tt.mode+"/"+strconv.Itoa(tt.gid), func(t *testing.T) {
			h := fakeHost(t, "dev/kvm="+tt.mode)
			if tt.gid >= 0 {
				if os.Geteuid() != 0 {
					t.Skip("needs root to give the file a group")
				}
				if err := os.Chown(h.path("dev/kvm"), -1, tt.gid); err != nil {
					t.Fatal(err)
				}
			}
			got, err := h.KVMGroups()
			if tt.wrong != "" {
				if !errors.Is(err, ErrKVMUnusable) || !strings.Contains(err.Error(), tt.wrong) {
					t.Fatalf("KVMGroups = %v, %v; want an error saying %q", got, err, tt.wrong)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("KVMGroups = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	if _, err := fakeHost(t).KVMGroups(); !errors.Is(err, ErrKVMUnusable) {
		t.Errorf("KVMGroups without /dev/kvm = %v", err)
	}
}

func TestVhostNet(t *testing.T) {
	if fakeHost(t).VhostNet() {
		t.Error("VhostNet without /dev/vhost-net")
	}
	if !fakeHost(t, "dev/vhost-net").VhostNet() {
		t.Error("no VhostNet with /dev/vhost-net")
	}
}

// TestChooseAccelHere says what this host has; it asserts only that auto
// never fails.
func TestChooseAccelHere(t *testing.T) {
	a, why, err := ChooseAccel("auto")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("auto: %s (%s); vhost-net: %v", a, why, VhostNet())
}

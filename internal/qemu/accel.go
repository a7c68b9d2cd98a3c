package qemu

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

var (
	// ErrAccelMode is an accelerator mode other than auto, kvm or tcg.
	ErrAccelMode = errors.New("accelerator mode")
	// ErrKVMUnusable is KVM asked for where it cannot run a guest.
	ErrKVMUnusable = errors.New("KVM is not usable here")
)

// Host is where the probes look: Root ("" for /) holds sys/module and dev.
// Tests point it at a fake tree.
type Host struct {
	Root string
}

// ChooseAccel decides the accelerator for mode auto, kvm or tcg on this
// host. See [Host.ChooseAccel].
func ChooseAccel(mode string) (Accel, string, error) { return Host{}.ChooseAccel(mode) }

// VhostNet says whether /dev/vhost-net opens on this host.
func VhostNet() bool { return Host{}.VhostNet() }

// KVMGroups are the supplementary groups QEMU needs for /dev/kvm on this
// host. See [Host.KVMGroups].
func KVMGroups() ([]uint32, error) { return Host{}.KVMGroups() }

// ChooseAccel decides the accelerator and says why. auto takes KVM only
// where hardware virtualisation is really there: kvm_intel or kvm_amd
// loaded and /dev/kvm opening, for QEMU's unprivileged user too (see
// [Host.KVMGroups]). A /dev/kvm alone proves nothing: kvm_pvm
// serves one that runs only specially built guest kernels. Otherwise auto
// takes TCG. kvm where KVM is unusable is an error wrapping ErrKVMUnusable
// that says why; tcg is always TCG.
func (h Host) ChooseAccel(mode string) (Accel, string, error) {
	switch mode {
	case "tcg":
		return TCG, "TCG asked for", nil
	case "kvm", "auto":
	default:
		return "", "", fmt.Errorf("%w %q: want auto, kvm or tcg", ErrAccelMode, mode)
	}
	ok, why := h.kvm()
	switch {
	case ok:
		return KVM, why, nil
	case mode == "kvm":
		return "", "", fmt.Errorf("%w: %s", ErrKVMUnusable, why)
	default:
		return TCG, why + "; using TCG", nil
	}
}

// kvm says whether KVM can run a stock guest here, and what it found.
func (h Host) kvm() (bool, string) {
	var hw []string
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if h.exists("sys/module/" + m) {
			hw = append(hw, m)
		}
	}
	err := h.opens("dev/kvm")
	_, gerr := h.KVMGroups()
	switch {
	case len(hw) > 0 && err == nil && gerr != nil:
		return false, fmt.Sprintf("%s loaded and /dev/kvm opens, but not for QEMU, which runs unprivileged: %v", strings.Join(hw, " and "), gerr)
	case len(hw) > 0 && err == nil:
		return true, strings.Join(hw, " and ") + " loaded and /dev/kvm opens"
	case errors.Is(err, fs.ErrNotExist):
		return false, "no /dev/kvm"
	case len(hw) > 0:
		return false, fmt.Sprintf("%s loaded but /dev/kvm does not open: %v", strings.Join(hw, " and "), err)
	case h.exists("sys/module/kvm_pvm"):
		return false, "kvm_pvm serves /dev/kvm: a paravirtual KVM that runs only specially built guest kernels"
	case err != nil:
		return false, fmt.Sprintf("neither kvm_intel nor kvm_amd is loaded, and /dev/kvm does not open: %v", err)
	default:
		return false, "/dev/kvm opens but neither kvm_intel nor kvm_amd is loaded: no hardware virtualisation"
	}
}

// KVMGroups are the supplementary groups a QEMU that runs as neither root
// nor /dev/kvm's owner needs to open /dev/kvm: none where everyone may
// read and write it, its group where that group may (a kvm group), and
// otherwise an error wrapping ErrKVMUnusable that says why. Root's group
// is never one: it would give QEMU whatever else root's group may read.
func (h Host) KVMGroups() ([]uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat(h.path("dev/kvm"), &st); err != nil {
		return nil, fmt.Errorf("%w: /dev/kvm: %w", ErrKVMUnusable, err)
	}
	mode := st.Mode & 0o777
	switch {
	case mode&0o006 == 0o006:
		return nil, nil
	case mode&0o060 == 0o060 && st.Gid != 0:
		return []uint32{st.Gid}, nil
	case mode&0o060 == 0o060:
		return nil, fmt.Errorf("%w: /dev/kvm (mode %04o) is open to root's group alone, which QEMU is not given: give it to a kvm group", ErrKVMUnusable, mode)
	default:
		return nil, fmt.Errorf("%w: /dev/kvm (mode %04o, uid %d, gid %d) opens for reading and writing to neither everyone nor a group QEMU may be given: make it 0660 and give it to a kvm group", ErrKVMUnusable, mode, st.Uid, st.Gid)
	}
}

// VhostNet says whether /dev/vhost-net opens, as a NIC's Vhost needs.
func (h Host) VhostNet() bool { return h.opens("dev/vhost-net") == nil }

func (h Host) path(rel string) string { return filepath.Join(cmp.Or(h.Root, "/"), rel) }

func (h Host) exists(rel string) bool {
	_, err := os.Stat(h.path(rel))
	return err == nil
}

func (h Host) opens(rel string) error {
	f, err := os.OpenFile(h.path(rel), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

package qemu

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// ChooseAccel decides the accelerator and says why. auto takes KVM only
// where hardware virtualisation is really there: kvm_intel or kvm_amd
// loaded and /dev/kvm opening. A /dev/kvm alone proves nothing: kvm_pvm
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
	switch {
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

// Package testguest builds the small guest that tests of real VMs boot through OVMF.
//
// The guest is a raw GPT disk whose EFI System Partition holds a unified kernel
// image (Debian's kernel and a busybox initramfs) that OVMF boots as
// \EFI\BOOT\BOOTX64.EFI; scripts/build-test-guest builds it from Debian
// packages. On every boot it prints [ReadyPrefix] and its first NIC's MAC on
// the serial console (COM1), then runs the commands it reads there line by
// line: [CmdPoweroff], [CmdReboot], [CmdPanic], [CmdEcho] and [CmdPing]. In
// the background it asks for its NIC's address by DHCP, as a rack's guest
// does of its VPC's gateway, and prints [NetPrefix] once it has a lease;
// where nothing answers it keeps asking, quietly. The ACPI power button
// (QMP system_powerdown) powers it off; a panic is reported to QEMU's
// pvpanic device and the guest halts.
package testguest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// What the guest prints on its serial console, each on a line of its own.
const (
	// ReadyPrefix starts the line printed on every boot once the guest reads
	// commands; the MAC of its first NIC follows, lowercase with colons, or
	// "none" when it has no NIC.
	ReadyPrefix = "SLED-AGENT-TEST-GUEST READY mac="
	// NoMAC is printed before the READY line when no NIC appeared within
	// five seconds.
	NoMAC = "SLED-AGENT-TEST-GUEST NOMAC"
	// PowerButton is printed when the ACPI power button is pressed, just
	// before the guest powers off.
	PowerButton = "SLED-AGENT-TEST-GUEST POWERBUTTON"
	// UnknownPrefix starts the answer to a line that is no command.
	UnknownPrefix = "SLED-AGENT-TEST-GUEST UNKNOWN "
	// NetPrefix starts the line printed when the guest's NIC is given an
	// address by DHCP: "NET ip=ADDR router=GATEWAY", the gateway being the
	// default route's (from option 121, else option 3), or "none". The
	// NIC has the address as a /32 when the lease says so, as a rack's
	// leases do, with the gateway on-link.
	NetPrefix = "SLED-AGENT-TEST-GUEST NET ip="
	// PingPrefix starts the answer to [CmdPing]: "PING ADDR ok avg=RTTms"
	// and busybox ping's packet count, or "PING ADDR failed: " and why.
	PingPrefix = "SLED-AGENT-TEST-GUEST PING "
)

// The commands the guest reads from its serial console, one a line.
const (
	// CmdPoweroff powers the guest off at once (ACPI S5: QEMU's SHUTDOWN
	// event, reason guest-shutdown).
	CmdPoweroff = "poweroff"
	// CmdReboot resets it at once (a RESET event; it boots again through
	// OVMF and prints READY again).
	CmdReboot = "reboot"
	// CmdPanic panics its kernel: QEMU's pvpanic device raises
	// GUEST_PANICKED, and the guest halts.
	CmdPanic = "panic"
	// CmdEcho followed by a word makes the guest print the word on a line.
	CmdEcho = "echo "
	// CmdPing followed by an IPv4 address makes the guest send it three
	// ICMP echoes, a second apart, and print a [PingPrefix] line.
	CmdPing = "ping "
)

// CacheDir holds the built images (test-guest-<hash>.raw, one per version of
// the script, each with its stamp, removed once unused for two weeks), the
// downloaded packages (debs/) and the lock that serializes builds between
// test binaries.
const CacheDir = "/var/cache/sled-agent/test-guest"

// QEMU is the emulator the guest is built for.
const QEMU = "qemu-system-x86_64"

// ovmfPairs are Debian's OVMF firmware files (package ovmf), code and vars,
// in order of preference.
var ovmfPairs = [][2]string{
	{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"},
	{"/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd"},
}

// ErrNoOVMF is returned by OVMF when none of Debian's OVMF files are found.
var ErrNoOVMF = errors.New("no OVMF firmware (Debian's ovmf package; scripts/setup installs it as root)")

// OVMF returns Debian's OVMF code and vars files. The code is meant as
// read-only pflash; the vars file is a template that each VM copies, as its
// writable pflash.
func OVMF() (code, vars string, err error) {
	for _, p := range ovmfPairs {
		if regular(p[0]) && regular(p[1]) {
			return p[0], p[1], nil
		}
	}
	return "", "", fmt.Errorf("%w: looked for %q", ErrNoOVMF, ovmfPairs)
}

func regular(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// built remembers the image this process has made sure of.
var built struct {
	sync.Mutex
	path string
}

// Why Build cannot give the image on this machine.
var (
	ErrNotRoot = errors.New("building and booting the test guest needs root")
	ErrNoQEMU  = errors.New("no " + QEMU + " (Debian's qemu-system-x86; scripts/setup installs it as root)")
)

// Image returns the path of the built test guest image, as [Build] does, and
// skips the test where Build cannot give one: without root, QEMU or OVMF.
func Image(t testing.TB) string {
	t.Helper()
	path, err := Build(t.Logf)
	switch {
	case errors.Is(err, ErrNotRoot), errors.Is(err, ErrNoQEMU), errors.Is(err, ErrNoOVMF):
		t.Skipf("testguest: %v", err)
	case err != nil:
		t.Fatalf("testguest: %v", err)
	}
	return path
}

// Build returns the path of the built test guest image, building it first
// when the cache has none built by the current scripts/build-test-guest (a
// few minutes at most: it downloads Debian's kernel); logf, if not nil, is
// told of a build. The image is shared: whoever boots it boots a copy (see
// TempCopy and CopyTo). It fails with ErrNotRoot, ErrNoQEMU or ErrNoOVMF
// where the guest cannot be built or booted.
func Build(logf func(format string, args ...any)) (string, error) {
	if os.Geteuid() != 0 {
		return "", ErrNotRoot
	}
	if _, err := exec.LookPath(QEMU); err != nil {
		return "", ErrNoQEMU
	}
	if _, _, err := OVMF(); err != nil {
		return "", err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	built.Lock()
	defer built.Unlock()
	if built.path != "" {
		return built.path, nil
	}
	path, err := build(logf)
	if err != nil {
		return "", err
	}
	built.path = path
	return path, nil
}

// build brings CacheDir's image up to date with the script, under the
// cache's lock, and returns its path.
func build(logf func(format string, args ...any)) (string, error) {
	script, err := scriptPath()
	if err != nil {
		return "", err
	}
	src, err := os.ReadFile(script)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(src)
	hash := hex.EncodeToString(sum[:])

	if err := os.MkdirAll(CacheDir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(CacheDir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	// Named by the script's hash: checkouts whose scripts differ (branches,
	// worktrees) each keep their own image instead of rebuilding the one
	// another is about to copy. The packages are shared.
	img := filepath.Join(CacheDir, "test-guest-"+hash[:16]+".raw")
	if stamp, err := os.ReadFile(img + ".stamp"); err == nil && strings.TrimSpace(string(stamp)) == hash && regular(img) {
		// The stamp's time is the image's last use: images of other
		// versions unused for a while are removed.
		now := time.Now()
		os.Chtimes(img+".stamp", now, now)
		for _, p := range prune(CacheDir, img, now) {
			logf("testguest: removed %s, unused since %s", p, pruneAfter)
		}
		return img, nil
	}
	logf("testguest: building %s with %s", img, script)
	start := time.Now()
	var out bytes.Buffer
	cmd := exec.Command("bash", script, img)
	cmd.Env = append(os.Environ(), "TEST_GUEST_DEBS="+filepath.Join(CacheDir, "debs"))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", script, img, err, out.Bytes())
	}
	logf("testguest: built in %v:\n%s", time.Since(start).Round(time.Second), out.Bytes())
	return img, nil
}

// pruneAfter is how long an image of another version of the script is
// kept unused: a checkout of an older branch within it finds its image.
const pruneAfter = 14 * 24 * time.Hour

// prune removes, from the cache dir, the images other than keep whose
// stamps are older than pruneAfter at now (or that have none), with their
// stamps, and the single unversioned image older caches held. It returns
// what it removed. The cache's lock is held.
func prune(dir, keep string, now time.Time) []string {
	imgs, _ := filepath.Glob(filepath.Join(dir, "test-guest-*.raw"))
	imgs = append(imgs, filepath.Join(dir, "test-guest.raw"))
	var removed []string
	for _, img := range imgs {
		if img == keep || !regular(img) {
			continue
		}
		if st, err := os.Stat(img + ".stamp"); err == nil && now.Sub(st.ModTime()) < pruneAfter {
			continue
		}
		if os.Remove(img) == nil {
			os.Remove(img + ".stamp")
			os.RemoveAll(img + ".debs") // the unversioned image's own packages
			removed = append(removed, img)
		}
	}
	return removed
}

// scriptPath finds scripts/build-test-guest from this source file, or else
// from the working directory up.
func scriptPath() (string, error) {
	const rel = "scripts/build-test-guest"
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		p := filepath.Join(filepath.Dir(file), "..", "..", rel)
		if regular(p) {
			return p, nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if p := filepath.Join(dir, rel); regular(p) {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s above %s or the package's source", rel, dir)
		}
		dir = parent
	}
}

// TempCopy copies src into a new t.TempDir() under the same name and
// returns the copy's path: a guest's disk and OVMF vars are files the test
// made.
func TempCopy(t testing.TB, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := CopyTo(dst, src); err != nil {
		t.Fatalf("testguest: %v", err)
	}
	return dst
}

// CopyTo copies src to dst, a file that must not exist yet.
func CopyTo(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Close()
}

package bench

// What the guest benchmark reads of guests and processes: consoles, the
// spec and disks it gives them, resident sets and command lines.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// consoleTimes times a console's output from t0: its first byte and the
// marker.
type consoleTimes struct {
	t0            time.Time
	first, marker time.Duration
	seen          []byte // the output's end, enough to find the marker across reads
}

// add takes output read at now and reports whether the marker has been
// seen.
func (c *consoleTimes) add(out []byte, now time.Time) bool {
	if c.marker != 0 {
		return true
	}
	if len(out) == 0 {
		return false
	}
	if c.first == 0 {
		c.first = now.Sub(c.t0)
	}
	c.seen = append(c.seen, out...)
	if bytes.Contains(c.seen, []byte(marker)) {
		c.marker = now.Sub(c.t0)
		return true
	}
	if len(c.seen) > 64<<10 {
		c.seen = append(c.seen[:0], c.seen[len(c.seen)-4<<10:]...)
	}
	return false
}

// tail is the end of the output, for errors.
func (c *consoleTimes) tail() string {
	return string(c.seen[max(0, len(c.seen)-500):])
}

// guestSpec is vmmtest's instance spec with disk as its boot disk's file
// and its NIC's backend named vnic.
func guestSpec(disk, vnic string) map[string]any {
	s := vmmtest.Spec()
	comps := s["components"].(map[string]any)
	comps["boot-disk-backend"] = map[string]any{"type": "file_storage_backend", "component": map[string]any{"path": disk, "readonly": false, "block_size": 512}}
	comps["net0-backend"] = map[string]any{"type": "virtio_network_backend", "component": map[string]any{"vnic_name": vnic}}
	return s
}

// copyDisk makes dst a copy of the test guest's image, on disk before any
// boot is timed.
func copyDisk(dst, image string) error {
	if err := testguest.CopyTo(dst, image); err != nil {
		return err
	}
	f, err := os.Open(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// rssKiB is a process's resident set (VmRSS), in KiB.
func rssKiB(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 && f[1] == "kB" {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS for process %d", pid)
}

// cmdline is a process's command line.
func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
}

// vmmProcs are the processes of a VMM zone, by what they run.
type vmmProcs struct {
	qemu, service, supervisor []int
}

// zoneProcs sorts the processes of the VMM zone whose namespace is at
// path by their program: runsv (the zone's supervisor) and the VMM service
// (the agent's binary), which live in the namespace, and QEMU, which runs
// shut in, in a namespace of its own: a child of the zone's service whose
// command is qemu-system-*.
func zoneProcs(path string) (vmmProcs, error) {
	var out vmmProcs
	pids, err := namespacePIDs(path)
	if err != nil {
		return out, err
	}
	for _, pid := range pids {
		exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		if err != nil {
			continue // gone
		}
		switch base := filepath.Base(strings.TrimSuffix(exe, " (deleted)")); {
		case strings.HasPrefix(base, "qemu-system"):
			out.qemu = append(out.qemu, pid)
		case base == "runsv":
			out.supervisor = append(out.supervisor, pid)
		default:
			out.service = append(out.service, pid)
		}
	}
	for _, svc := range out.service {
		kids, err := children(svc)
		if err != nil {
			return out, err
		}
		for _, k := range kids {
			if argv, err := cmdline(k); err == nil && strings.HasPrefix(filepath.Base(argv[0]), "qemu-system") {
				out.qemu = append(out.qemu, k)
			}
		}
	}
	return out, nil
}

// children are the processes whose parent is pid.
func children(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	want := strconv.Itoa(pid)
	var out []int
	for _, e := range ents {
		kid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue // gone
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PPid:"); ok && strings.TrimSpace(v) == want {
				out = append(out, kid)
			}
		}
	}
	return out, nil
}

// add samples a VMM zone's processes.
func (m *GuestMemory) add(p vmmProcs) {
	for _, s := range []struct {
		pids []int
		to   *[]int
	}{{p.qemu, &m.QEMUKiB}, {p.service, &m.ServiceKiB}, {p.supervisor, &m.SupervisorKiB}} {
		for _, pid := range s.pids {
			if kib, err := rssKiB(pid); err == nil {
				*s.to = append(*s.to, kib)
			}
		}
	}
}

// procFD is a directory by a descriptor's name, as qemuvm names a VM's
// directory whose path is too long for a socket.
var procFD = regexp.MustCompile(`/proc/[0-9]+/fd/[0-9]+`)

// byPath is a QEMU command line whose descriptors (the agent's QEMU,
// unprivileged, is handed every file, socket and tap it uses) are written
// as the paths and names they stand for, as the floor's QEMU, run as root,
// opens them itself: an fd set as its opaque path, a listening socket as
// its path in the VM's directory (qemuvm makes it there), a tap as its
// name (the NIC's vnic name, from its MAC). A command line without
// descriptors is returned as it is.
func byPath(argv []string) []string {
	sets := map[string]string{} // "/dev/fdset/N" → path
	var out []string
	for i := 0; i < len(argv); i++ {
		if argv[i] == "-add-fd" && i+1 < len(argv) {
			var set, path string
			for _, kv := range strings.Split(argv[i+1], ",") {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "set":
					set = v
				case "opaque":
					path = v
				}
			}
			sets["/dev/fdset/"+set] = path
			i++
			continue
		}
		out = append(out, argv[i])
	}
	taps := []string{}
	for _, a := range out {
		if _, mac, ok := strings.Cut(a, ",mac="); ok && strings.HasPrefix(a, "virtio-net-pci,") {
			mac, _, _ = strings.Cut(mac, ",")
			if hw, err := net.ParseMAC(mac); err == nil {
				taps = append(taps, spec.VNICName(hw))
			}
		}
	}
	for i, a := range out {
		for set, path := range sets {
			a = strings.ReplaceAll(a, "file.filename="+set+",", "file.filename="+path+",")
			if strings.HasSuffix(a, "file.filename="+set) {
				a = strings.TrimSuffix(a, set) + path
			}
		}
		out[i] = a
	}
	dir := fwVarsDir(out)
	for i, a := range out {
		if rest, ok := strings.CutPrefix(a, "socket,id="); ok {
			id, opts, _ := strings.Cut(rest, ",")
			if fd, more, ok := strings.Cut(opts, ","); ok && strings.HasPrefix(fd, "fd=") {
				out[i] = "socket,id=" + id + ",path=" + filepath.Join(dir, id+".sock") + "," + more
			}
		}
		if rest, ok := strings.CutPrefix(a, "tap,id="); ok && len(taps) > 0 {
			id, opts, _ := strings.Cut(rest, ",")
			if fd, more, ok := strings.Cut(opts, ","); ok && strings.HasPrefix(fd, "fd=") {
				// The agent's tap has no virtio-net header
				// (qemu.OpenTap), as vnet_hdr=off makes QEMU's.
				out[i] = "tap,id=" + id + ",ifname=" + taps[0] + ",script=no,downscript=no,vnet_hdr=off," + more
				taps = taps[1:]
			}
		}
	}
	return out
}

// fwVarsDir is the directory of the firmware variables' file (the VM's
// directory) on a QEMU command line whose descriptors are written as paths
// (byPath), or "" if it names none.
func fwVarsDir(argv []string) string {
	dir := ""
	for _, a := range argv {
		if strings.Contains(a, "node-name=fw-vars,") {
			if _, f, ok := strings.Cut(a, "file.filename="); ok {
				f, _, _ = strings.Cut(f, ",")
				dir = filepath.Dir(f)
			}
		}
	}
	return dir
}

// normaliseArgv is a QEMU command line with what differs between two VMs
// of one spec replaced: the disk's path, the VM's directory (where its
// firmware variables are, or by a descriptor's name), and its name; and
// its descriptors written as the paths they stand for (byPath).
func normaliseArgv(argv []string, name, disk string) []string {
	argv = byPath(argv)
	dir := fwVarsDir(argv)
	out := make([]string, len(argv))
	for i, a := range argv {
		a = strings.ReplaceAll(a, disk, "{disk}")
		if dir != "" {
			a = strings.ReplaceAll(a, dir, "{dir}")
		}
		a = procFD.ReplaceAllString(a, "{dir}")
		out[i] = strings.ReplaceAll(a, name, "{name}")
	}
	return out
}

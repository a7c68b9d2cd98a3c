package qemu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrInvalid wraps every refusal of [Machine.Args]; the message lists each
// problem found.
var ErrInvalid = errors.New("invalid machine")

// Chipset is the board's chipset.
//
// Propolis offers one chipset, an i440FX whose enable_pcie flag lets the
// guest reach PCI configuration space through PCIe's enhanced configuration
// mechanism (ECAM, MMCONFIG). QEMU's i440FX ("pc") has no ECAM at all; its
// Q35 ("q35") has one, programmed by OVMF. So the flag chooses QEMU's
// chipset: [ChipsetFor] maps it, I440FX is the flag off and Q35 the flag on.
// Both names are QEMU's aliases for its newest version of that board.
type Chipset string

const (
	I440FX Chipset = "i440fx" // QEMU "pc": configuration space through ports 0xcf8/0xcfc only
	Q35    Chipset = "q35"    // QEMU "q35": the same ports plus ECAM
)

// ChipsetFor is the chipset for propolis's i440FX with enable_pcie set or not.
func ChipsetFor(enablePCIe bool) Chipset {
	if enablePCIe {
		return Q35
	}
	return I440FX
}

// Accel is QEMU's accelerator.
type Accel string

const (
	KVM Accel = "kvm" // hardware virtualisation; the guest gets -cpu host
	TCG Accel = "tcg" // emulation; the guest gets -cpu max, all TCG can do
)

// DiskKind is how a disk looks to the guest.
type DiskKind string

const (
	VirtioBlk DiskKind = "virtio-blk"
	NVMe      DiskKind = "nvme"
)

// NICKind is how a NIC looks to the guest.
type NICKind string

const VirtioNet NICKind = "virtio-net"

// PCIPath is a PCI bus/device/function. Every device goes on the root bus,
// bus 0: another bus exists in QEMU only behind a bridge (pci-bridge,
// pcie-root-port), with its number given by the guest's firmware as it
// enumerates, not by us, so a bus number in a description names no QEMU
// bus. The root bus's 32 slots of 8 functions are more than a guest's
// disks and NICs need. Slots 0 and 1 (i440FX: host bridge, PIIX3) and 0
// and 31 (Q35: host bridge, LPC/SATA/SMBus) belong to the board.
type PCIPath struct {
	Bus, Device, Function uint8
}

func (p PCIPath) String() string {
	return fmt.Sprintf("%d.%d.%d", p.Bus, p.Device, p.Function)
}

// Firmware is the guest's UEFI firmware.
type Firmware struct {
	// Code is the OVMF code image (OVMF_CODE_4M.fd), mapped read-only as
	// pflash0; one file serves every guest.
	Code string
	// Vars is this VMM's own copy of the variable store (from
	// OVMF_VARS_4M.fd, see [PrepareVars]), writable pflash1. Boot entries
	// the guest writes live here.
	Vars string
}

// Disk is a disk backed by a file.
//
// Caching: the file is opened without O_DIRECT (cache.direct=off) and
// guest flushes reach the file as fsync (cache.no-flush=off): QEMU's
// writeback mode, in which the guest sees a volatile write cache and what it
// flushed is on stable storage. O_DIRECT would be refused by file systems
// that lack it and needs aligned I/O; ignoring flushes would lose data on a
// host crash. aio=threads works on every file system and kernel; io_uring
// and native AIO do not (native needs O_DIRECT). Errors are reported to the
// guest (werror/rerror=report) instead of QEMU's default of pausing the
// guest when the host's disk is full, a pause that nobody would be told of.
// QEMU locks the file, so two QEMUs cannot write one disk.
//
// Its block node is drive<N>, N its index in [Machine.Disks].
type Disk struct {
	ID   string // the QEMU device id
	Kind DiskKind
	PCI  PCIPath
	Path string // the backing file
	// File is the backing file opened by the caller, read-write or
	// read-only as the disk is, which QEMU is given (an fd set of its own,
	// as Start would open Path): with Machine.Descriptors, nothing opens
	// Path by name then, which names the file in QEMU's arguments only.
	// Refused without Descriptors. Start leaves it open.
	File      *os.File
	ReadOnly  bool
	BlockSize int // logical and physical block size: 512 or 4096
	// Serial is what the guest reads as the disk's serial: printable
	// ASCII, at most 20 bytes. NVMe needs one; virtio-blk may have none.
	Serial string
	// NoWriteCache is an NVMe disk without a volatile write cache
	// (upstream's has_write_cache false): the device's write-cache=off,
	// so QEMU writes through to the file, every write durable before it
	// completes, and the controller's Volatile Write Cache feature reads
	// disabled. Otherwise write-cache=on: the guest must flush, as it
	// must on upstream's NVMe disks. Only NVMe disks take it.
	//
	// Where we differ: QEMU's controller reports a volatile write cache
	// present in Identify Controller whatever the setting (hw/nvme/ctrl.c
	// sets VWC unconditionally), so a guest still flushes a disk without
	// one, where propolis tells it it need not. Such a disk is as safe
	// as upstream's; the guest only does flushes it could skip.
	NoWriteCache bool
}

// NIC is a network interface backed by a tap.
type NIC struct {
	ID   string // the QEMU device and netdev id
	Kind NICKind
	PCI  PCIPath
	MAC  string // a unicast MAC, as net.ParseMAC reads it
	// Tap is the tap's interface name. QEMU makes it (ifname=), or with
	// Machine.Descriptors File is it.
	Tap string
	// File is the tap opened by the caller ([OpenTap]) in the network
	// namespace QEMU runs in, which QEMU is given (fd=): required with
	// Machine.Descriptors, refused without. Start leaves it open.
	File *os.File
	// Vhost lets the kernel's vhost-net move the packets. Set it only
	// where [VhostNet] says /dev/vhost-net opens: QEMU 7.2 aborts on an
	// assertion when vhost=on and vhost-net cannot be opened. With
	// Machine.Descriptors Start opens it and QEMU is given it (vhostfd=).
	Vhost bool
}

// SerialPort is one of the guest's COM ports, served on a unix socket on
// which QEMU listens (server=on,wait=off). QEMU serves one connection at a
// time and drops the guest's output while none is open, so the caller
// keeps one connection, its own history and its own users.
type SerialPort struct {
	Port   string // com1, com2, com3 or com4
	Socket string
}

// comPorts are the ports' isa-serial indexes: com1 is index 0 (0x3f8, IRQ 4)
// and so on, whatever other ports the guest has.
var comPorts = map[string]int{"com1": 0, "com2": 1, "com3": 2, "com4": 3}

// Sandbox is QEMU's seccomp filter as Machine.Sandbox asks for it.
const Sandbox = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// Machine describes one QEMU guest.
type Machine struct {
	// Name names the guest (-name guest=) and the QEMU process (its first
	// 15 bytes, in ps): letters, digits, '.', '_', '-', at most 64 bytes.
	Name      string
	CPUs      int // 1 to 255, one socket
	MemoryMiB int
	Chipset   Chipset
	Firmware  Firmware
	Accel     Accel
	Disks     []Disk
	NICs      []NIC
	Serial    []SerialPort
	// Pvpanic adds QEMU's ISA pvpanic device (I/O port 0x505). A guest's
	// panic then shows as a GUEST_PANICKED event and nothing else: QEMU
	// is told to take no action (-action panic=none), as propolis does;
	// the guest's kernel decides whether to reboot.
	Pvpanic bool
	// BootOrder lists the ids of disks and NICs that OVMF tries in turn
	// (bootindex 0, 1, … on those devices); others are not tried.
	BootOrder []string
	// QMPSocket is the unix socket QEMU listens on for QMP.
	QMPSocket string
	// Sandbox turns QEMU's seccomp filter on ([Sandbox]).
	Sandbox bool
	// Descriptors makes QEMU open nothing by path, so that it can run as
	// a user who may reach none of the machine's files (StartOptions.Start
	// setting the command's Credential). Start opens the firmware and disk
	// files, the firmware code and read-only disks O_RDONLY and the rest
	// O_RDWR, and QEMU is given each as an fd set of its own (-add-fd,
	// file.filename=/dev/fdset/N; QEMU takes from a set only a descriptor
	// of the access mode it opens the file with, so the mode must be
	// right); Start makes the QMP and serial sockets and QEMU is given the
	// listening descriptors (-chardev socket,fd=N); and each NIC is its
	// File, with /dev/vhost-net opened by Start where it has Vhost. The
	// descriptors are fds 3 on, in the order of the arguments.
	Descriptors bool
	// RunAs is a user QEMU switches to once set up (-runas). QEMU 7.2
	// switches after installing its seccomp filter, which forbids it with
	// elevateprivileges=deny (QEMU dies of SIGSYS), so RunAs and Sandbox
	// are refused together: to have both, leave RunAs empty and start
	// QEMU as the user (StartOptions.Start setting the command's
	// Credential), with Descriptors.
	RunAs string
}

var (
	nameRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	idRe     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]{0,63}$`) // QEMU's id_wellformed, bounded
	tapRe    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	userRe   = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	reserved = map[string]bool{"com1": true, "com2": true, "com3": true, "com4": true, "pvpanic": true}
)

// validTap says whether name can be a tap's name: an interface name of 1
// to 15 letters, digits, '.', '_' or '-', other than "." and "..".
func validTap(name string) bool {
	return tapRe.MatchString(name) && name != "." && name != ".."
}

// maxSocketPath is the longest unix socket path Linux binds (sun_path less
// its terminating NUL).
const maxSocketPath = 107

// Args validates m and returns QEMU's arguments (without the program name).
// QEMU always starts with -nodefaults -no-user-config -display none, and
// paused (-S), so the caller decides when the guest runs.
func (m Machine) Args() ([]string, error) {
	a, _, err := m.command()
	return a, err
}

// passed is a descriptor QEMU is given (Machine.Descriptors): fd 3 + its
// index in the list command returns.
type passed struct {
	what   string   // what it is, for errors: "disk \"boot\"", "QMP socket"
	path   string   // the file Start opens, or the socket it makes
	write  bool     // the file is opened for writing too
	socket bool     // path is a socket to listen on
	device bool     // path is a device (/dev/vhost-net), not a regular file
	file   *os.File // the caller's (a tap, a disk): neither opened nor closed by Start
}

// command validates m and returns QEMU's arguments and, with
// Descriptors, the descriptors they name.
func (m Machine) command() ([]string, []passed, error) {
	if err := m.validate(); err != nil {
		return nil, nil, err
	}
	var a []string
	var pass []passed
	give := func(p passed) int {
		pass = append(pass, p)
		return 2 + len(pass)
	}
	// file is how the block layer is told a file: its path, or an fd set
	// of its own whose -add-fd goes first.
	file := func(what, path string, write bool, f *os.File) string {
		if !m.Descriptors {
			return esc(path)
		}
		fd := give(passed{what: what, path: path, write: write, file: f})
		a = append(a, "-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s", fd, fd, esc(path)))
		return fmt.Sprintf("/dev/fdset/%d", fd)
	}
	// socket is where a server chardev listens: a path QEMU binds, or a
	// socket already listening.
	socket := func(what, path string) string {
		if !m.Descriptors {
			return "path=" + esc(path)
		}
		return fmt.Sprintf("fd=%d", give(passed{what: what + " socket", path: path, socket: true}))
	}

	bus := "pci.0"
	machine := "pc"
	if m.Chipset == Q35 {
		bus, machine = "pcie.0", "q35"
	}
	cpu := "max"
	if m.Accel == KVM {
		cpu = "host"
	}
	a = append(a,
		"-name", "guest="+m.Name+",process="+m.Name+",debug-threads=on",
		"-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-msg", "timestamp=on",
		"-machine", machine+",pflash0=fw-code,pflash1=fw-vars",
		"-accel", string(m.Accel),
		"-cpu", cpu,
		"-smp", fmt.Sprintf("cpus=%d,sockets=1,cores=%d,threads=1", m.CPUs, m.CPUs),
		"-m", fmt.Sprintf("size=%dM", m.MemoryMiB),
		"-action", "panic=none",
	)
	code := file("firmware code", m.Firmware.Code, false, nil)
	a = append(a, "-blockdev", "driver=raw,node-name=fw-code,read-only=on,file.driver=file,file.filename="+code+",file.read-only=on")
	vars := file("firmware vars", m.Firmware.Vars, true, nil)
	a = append(a, "-blockdev", "driver=raw,node-name=fw-vars,read-only=off,file.driver=file,file.filename="+vars)
	a = append(a,
		"-chardev", "socket,id=qmp,"+socket("QMP", m.QMPSocket)+",server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
	)
	serial := slices.Clone(m.Serial)
	slices.SortFunc(serial, func(x, y SerialPort) int { return comPorts[x.Port] - comPorts[y.Port] })
	for _, s := range serial {
		a = append(a,
			"-chardev", "socket,id="+s.Port+","+socket(s.Port, s.Socket)+",server=on,wait=off",
			"-device", fmt.Sprintf("isa-serial,id=%s,chardev=%s,index=%d", s.Port, s.Port, comPorts[s.Port]))
	}
	if m.Pvpanic {
		a = append(a, "-device", "pvpanic,id=pvpanic")
	}
	boot := make(map[string]int, len(m.BootOrder))
	for i, id := range m.BootOrder {
		boot[id] = i
	}
	// A slot with more than one function needs multifunction=on on its
	// function 0, or QEMU refuses the others.
	perSlot := make(map[uint8]int)
	for _, p := range m.pciPaths() {
		perSlot[p.Device]++
	}
	dev := func(kind, id string, p PCIPath, extra ...string) string {
		s := fmt.Sprintf("%s,id=%s,bus=%s,addr=0x%x.%x", kind, id, bus, p.Device, p.Function)
		if p.Function == 0 && perSlot[p.Device] > 1 {
			s += ",multifunction=on"
		}
		for _, e := range extra {
			s += "," + e
		}
		if i, ok := boot[id]; ok {
			s += ",bootindex=" + strconv.Itoa(i)
		}
		return s
	}
	for i, d := range m.Disks {
		node := fmt.Sprintf("drive%d", i)
		ro := onOff(d.ReadOnly)
		path := file(fmt.Sprintf("disk %q", d.ID), d.Path, !d.ReadOnly, d.File)
		a = append(a, "-blockdev", "driver=raw,node-name="+node+",read-only="+ro+
			",cache.direct=off,cache.no-flush=off,file.driver=file,file.filename="+path+
			",file.read-only="+ro+",file.aio=threads")
		bs := strconv.Itoa(d.BlockSize)
		extra := []string{"drive=" + node, "logical_block_size=" + bs, "physical_block_size=" + bs}
		if d.Serial != "" {
			extra = append(extra, "serial="+esc(d.Serial))
		}
		kind := "nvme"
		if d.Kind == NVMe {
			extra = append(extra, "write-cache="+onOff(!d.NoWriteCache))
		}
		if d.Kind == VirtioBlk {
			kind = "virtio-blk-pci"
			extra = append(extra, "werror=report", "rerror=report")
		}
		a = append(a, "-device", dev(kind, d.ID, d.PCI, extra...))
	}
	for _, n := range m.NICs {
		mac, _ := net.ParseMAC(n.MAC) // validated
		// vnet_hdr=off: whole frames on the tap (OpenTap).
		netdev := "tap,id=" + n.ID + ",ifname=" + n.Tap + ",script=no,downscript=no,vnet_hdr=off,vhost=" + onOff(n.Vhost)
		if m.Descriptors {
			// fd= takes no ifname, script or downscript.
			what := fmt.Sprintf("NIC %q", n.ID)
			// With fd= QEMU reads from the tap whether it has the
			// virtio-net header (OpenTap's has none).
			netdev = fmt.Sprintf("tap,id=%s,fd=%d,vhost=%s", n.ID, give(passed{what: what + ": tap " + n.Tap, file: n.File}), onOff(n.Vhost))
			if n.Vhost {
				netdev += fmt.Sprintf(",vhostfd=%d", give(passed{what: what + ": vhost-net", path: vhostNet, write: true, device: true}))
			}
		}
		a = append(a,
			"-netdev", netdev,
			// romfile= leaves out iPXE's option ROM: OVMF drives
			// virtio-net itself, and QEMU would refuse to start where
			// the ROM's package is not installed.
			"-device", dev("virtio-net-pci", n.ID, n.PCI, "netdev="+n.ID, "mac="+mac.String(), "romfile="))
	}
	if m.Sandbox {
		a = append(a, "-sandbox", Sandbox)
	}
	if m.RunAs != "" {
		a = append(a, "-runas", m.RunAs)
	}
	return a, pass, nil
}

// esc escapes a value inside QEMU's comma-separated options.
func esc(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// pciPaths lists every device's PCI path, disks first.
func (m Machine) pciPaths() []PCIPath {
	var ps []PCIPath
	for _, d := range m.Disks {
		ps = append(ps, d.PCI)
	}
	for _, n := range m.NICs {
		ps = append(ps, n.PCI)
	}
	return ps
}

// validate returns ErrInvalid with every problem it finds, or nil.
func (m Machine) validate() error {
	var bad []string
	add := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	if !nameRe.MatchString(m.Name) {
		add("name %q: want 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", m.Name)
	}
	if m.CPUs < 1 || m.CPUs > 255 {
		add("%d CPUs: want 1 to 255", m.CPUs)
	}
	if m.MemoryMiB < 1 {
		add("%d MiB of memory: want at least 1", m.MemoryMiB)
	}
	if m.Chipset != I440FX && m.Chipset != Q35 {
		add("chipset %q: want %q or %q", m.Chipset, I440FX, Q35)
	}
	if m.Accel != KVM && m.Accel != TCG {
		add("accelerator %q: want %q or %q", m.Accel, KVM, TCG)
	}
	checkPath := func(what, p string) {
		if p == "" {
			add("%s: no path", what)
		} else if !filepath.IsAbs(p) || strings.ContainsAny(p, "\x00\n") {
			add("%s %q: want an absolute path", what, p)
		}
	}
	checkPath("firmware code", m.Firmware.Code)
	checkPath("firmware vars", m.Firmware.Vars)
	if m.Firmware.Code != "" && m.Firmware.Code == m.Firmware.Vars {
		add("firmware code and vars are one file %q: the vars must be this machine's own writable copy", m.Firmware.Code)
	}

	// Sockets: QMP and serial ports, each its own path.
	sockets := map[string]string{}
	checkSocket := func(what, p string) {
		checkPath(what+" socket", p)
		if len(p) > maxSocketPath {
			add("%s socket %q: longer than the %d bytes a unix socket path may have", what, p, maxSocketPath)
		}
		if other, ok := sockets[p]; ok && p != "" {
			add("%s socket %q: already %s's", what, p, other)
		}
		sockets[p] = what
	}
	checkSocket("QMP", m.QMPSocket)
	ports := map[string]bool{}
	for _, s := range m.Serial {
		if _, ok := comPorts[s.Port]; !ok {
			add("serial port %q: want com1, com2, com3 or com4", s.Port)
			continue
		}
		if ports[s.Port] {
			add("serial port %s: given twice", s.Port)
		}
		ports[s.Port] = true
		checkSocket(s.Port, s.Socket)
	}

	// Device ids: disks and NICs share QEMU's device namespace with the
	// serial ports and pvpanic.
	ids := map[string]bool{}
	checkID := func(what, id string) {
		switch {
		case !idRe.MatchString(id):
			add("%s id %q: want a letter then up to 63 letters, digits, '.', '_' or '-'", what, id)
		case reserved[id]:
			add("%s id %q: reserved for the machine's own device", what, id)
		case ids[id]:
			add("%s id %q: used twice", what, id)
		}
		ids[id] = true
	}
	// PCI paths: root bus, a free slot, one device each, function 0 in
	// every slot used.
	boardSlots := map[Chipset][2]uint8{I440FX: {0, 1}, Q35: {0, 31}}[m.Chipset]
	used := map[PCIPath]string{}
	checkPCI := func(what string, p PCIPath) {
		switch {
		case p.Bus != 0:
			add("%s at PCI %s: bus %d: devices go on the root bus, 0 (the machine has no bridges)", what, p, p.Bus)
		case p.Device > 31 || p.Function > 7:
			add("%s at PCI %s: want device 0-31 and function 0-7", what, p)
		case p.Device == boardSlots[0] || p.Device == boardSlots[1]:
			add("%s at PCI %s: slot %d belongs to the %s board", what, p, p.Device, m.Chipset)
		case used[p] != "":
			add("%s at PCI %s: %s is there already", what, p, used[p])
		default:
			used[p] = what
		}
	}
	type fileUse struct {
		disks  int
		writer bool
	}
	files := map[string]fileUse{}
	for _, d := range m.Disks {
		what := fmt.Sprintf("disk %q", d.ID)
		checkID("disk", d.ID)
		if d.Kind != VirtioBlk && d.Kind != NVMe {
			add("%s: kind %q: want %q or %q", what, d.Kind, VirtioBlk, NVMe)
		}
		checkPCI(what, d.PCI)
		checkPath(what+": backing file", d.Path)
		if d.Path != "" {
			u := files[d.Path]
			u.disks, u.writer = u.disks+1, u.writer || !d.ReadOnly
			files[d.Path] = u
		}
		if d.Path != "" && (d.Path == m.Firmware.Code || d.Path == m.Firmware.Vars) {
			add("%s: backing file %q is the firmware's", what, d.Path)
		}
		if d.BlockSize != 512 && d.BlockSize != 4096 {
			add("%s: block size %d: want 512 or 4096", what, d.BlockSize)
		}
		if !m.Descriptors && d.File != nil {
			add("%s: a descriptor, but QEMU is to open %q itself (Descriptors off)", what, d.Path)
		}
		if d.Kind == NVMe && d.Serial == "" {
			add("%s: an NVMe disk needs a serial", what)
		}
		if d.Kind != NVMe && d.NoWriteCache {
			add("%s: only an NVMe disk can be without a write cache", what)
		}
		if len(d.Serial) > 20 || strings.ContainsFunc(d.Serial, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
			add("%s: serial %q: want at most 20 printable ASCII characters", what, d.Serial)
		}
	}
	for path, u := range files {
		if u.disks > 1 && u.writer {
			add("backing file %q: %d disks have it and one writes it", path, u.disks)
		}
	}
	for _, n := range m.NICs {
		what := fmt.Sprintf("NIC %q", n.ID)
		checkID("NIC", n.ID)
		if n.Kind != VirtioNet {
			add("%s: kind %q: want %q", what, n.Kind, VirtioNet)
		}
		checkPCI(what, n.PCI)
		mac, err := net.ParseMAC(n.MAC)
		switch {
		case err != nil || len(mac) != 6:
			add("%s: MAC %q: want six bytes such as 02:08:20:ab:cd:ef", what, n.MAC)
		case mac[0]&1 != 0:
			add("%s: MAC %s is a multicast address", what, mac)
		case mac.String() == "00:00:00:00:00:00":
			add("%s: MAC %s is all zeros", what, mac)
		}
		if !validTap(n.Tap) {
			add("%s: tap %q: want an interface name of 1 to 15 letters, digits, '.', '_' or '-'", what, n.Tap)
		}
		switch {
		case m.Descriptors && n.File == nil:
			add("%s: tap %q: no descriptor (QEMU is given every file it uses, and makes no tap)", what, n.Tap)
		case !m.Descriptors && n.File != nil:
			add("%s: tap %q: a descriptor, but QEMU is to make the tap itself (Descriptors off)", what, n.Tap)
		}
	}
	for p := range used {
		if p.Function != 0 {
			if _, ok := used[PCIPath{Device: p.Device}]; !ok {
				add("%s at PCI %s: slot %d has no function 0, so the guest would not look for it", used[p], p, p.Device)
			}
		}
	}

	seen := map[string]bool{}
	for _, id := range m.BootOrder {
		isDev := slices.ContainsFunc(m.Disks, func(d Disk) bool { return d.ID == id }) ||
			slices.ContainsFunc(m.NICs, func(n NIC) bool { return n.ID == id })
		switch {
		case !isDev:
			add("boot order: %q is neither a disk nor a NIC of this machine", id)
		case seen[id]:
			add("boot order: %q given twice", id)
		}
		seen[id] = true
	}

	if m.RunAs != "" {
		if !userRe.MatchString(m.RunAs) {
			add("run as %q: want a user name", m.RunAs)
		}
		if m.Sandbox {
			add("run as %q with the sandbox: QEMU 7.2 changes user after its seccomp filter forbids it; start QEMU as the user instead", m.RunAs)
		}
	}

	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad) // map order must not decide the message
	return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(bad, "; "))
}

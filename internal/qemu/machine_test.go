package qemu

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden argument lists in testdata")

// minimal is a q35 TCG machine with firmware, a QMP socket and nothing else.
func minimal() Machine {
	return Machine{
		Name:      "vm0",
		CPUs:      1,
		MemoryMiB: 256,
		Chipset:   Q35,
		Accel:     TCG,
		Firmware:  Firmware{Code: "/usr/share/OVMF/OVMF_CODE_4M.fd", Vars: "/var/vmm/vm0/vars.fd"},
		QMPSocket: "/var/vmm/vm0/qmp.sock",
	}
}

// full is a machine with every kind of device.
func full() Machine {
	m := minimal()
	m.Name = "0b7c5c4e-7d0e-4d5e-9c1a-2f3b4c5d6e7f"
	m.CPUs, m.MemoryMiB = 4, 8192
	m.Disks = []Disk{
		{ID: "boot", Kind: VirtioBlk, PCI: PCIPath{0, 4, 0}, Path: "/pool/disks/boot.raw", BlockSize: 512},
		{ID: "data", Kind: NVMe, PCI: PCIPath{0, 5, 0}, Path: "/pool/disks/data,1.raw", BlockSize: 4096, Serial: "data-0001"},
		{ID: "cidata", Kind: VirtioBlk, PCI: PCIPath{0, 5, 1}, Path: "/pool/disks/cidata.raw", ReadOnly: true, BlockSize: 512, Serial: "cidata"},
	}
	m.NICs = []NIC{
		{ID: "net0", Kind: VirtioNet, PCI: PCIPath{0, 8, 0}, MAC: "A8:40:25:F0:00:01", Tap: "vtap0", Vhost: true},
		{ID: "net1", Kind: VirtioNet, PCI: PCIPath{0, 9, 0}, MAC: "a8:40:25:f0:00:02", Tap: "vtap1"},
	}
	m.Serial = []SerialPort{
		{Port: "com4", Socket: "/var/vmm/vm0/com4.sock"},
		{Port: "com1", Socket: "/var/vmm/vm0/com1.sock"},
		{Port: "com2", Socket: "/var/vmm/vm0/com2.sock"},
		{Port: "com3", Socket: "/var/vmm/vm0/com3.sock"},
	}
	m.Pvpanic = true
	m.BootOrder = []string{"boot", "net0"}
	m.Sandbox = true
	return m
}

// i440fx is a KVM machine on the older board that drops privileges.
func i440fx() Machine {
	m := minimal()
	m.Name = "legacy"
	m.Chipset = I440FX
	m.Accel = KVM
	m.CPUs, m.MemoryMiB = 2, 1024
	m.Disks = []Disk{{ID: "root", Kind: VirtioBlk, PCI: PCIPath{0, 2, 0}, Path: "/pool/root.img", BlockSize: 4096}}
	m.Serial = []SerialPort{{Port: "com1", Socket: "/var/vmm/vm0/com1.sock"}}
	m.BootOrder = []string{"root"}
	m.RunAs = "qemu"
	return m
}

// descriptors is full, opening nothing itself: every file, socket and tap
// is given to QEMU as a descriptor.
func descriptors(t *testing.T) Machine {
	m := full()
	m.Descriptors = true
	for i := range m.NICs {
		f, err := os.Open(os.DevNull) // stands for the tap: only its place counts
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		m.NICs[i].File = f
	}
	return m
}

func TestArgsGolden(t *testing.T) {
	for name, m := range map[string]Machine{"minimal": minimal(), "full": full(), "i440fx": i440fx(), "descriptors": descriptors(t)} {
		t.Run(name, func(t *testing.T) {
			args, err := m.Args()
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(args, "\n") + "\n"
			path := filepath.Join("testdata", name+".args")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("arguments differ from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

func TestArgsRefusals(t *testing.T) {
	disk := func(id string, dev, fn uint8) Disk {
		return Disk{ID: id, Kind: VirtioBlk, PCI: PCIPath{0, dev, fn}, Path: "/d/" + id, BlockSize: 512}
	}
	nic := func(id string, dev uint8) NIC {
		return NIC{ID: id, Kind: VirtioNet, PCI: PCIPath{0, dev, 0}, MAC: "02:00:00:00:00:01", Tap: "tap" + id}
	}
	tests := []struct {
		name   string
		change func(m *Machine)
		want   string
	}{
		{"no name", func(m *Machine) { m.Name = "" }, `name ""`},
		{"name with a comma", func(m *Machine) { m.Name = "a,b" }, `name "a,b"`},
		{"name too long", func(m *Machine) { m.Name = strings.Repeat("a", 65) }, "want 1 to 64"},
		{"zero CPUs", func(m *Machine) { m.CPUs = 0 }, "0 CPUs"},
		{"too many CPUs", func(m *Machine) { m.CPUs = 256 }, "256 CPUs"},
		{"zero memory", func(m *Machine) { m.MemoryMiB = 0 }, "0 MiB of memory"},
		{"no chipset", func(m *Machine) { m.Chipset = "" }, `chipset ""`},
		{"unknown chipset", func(m *Machine) { m.Chipset = "microvm" }, `chipset "microvm"`},
		{"unknown accel", func(m *Machine) { m.Accel = "hvf" }, `accelerator "hvf"`},
		{"no firmware code", func(m *Machine) { m.Firmware.Code = "" }, "firmware code: no path"},
		{"relative vars", func(m *Machine) { m.Firmware.Vars = "vars.fd" }, `firmware vars "vars.fd": want an absolute path`},
		{"shared vars", func(m *Machine) { m.Firmware.Vars = m.Firmware.Code }, "code and vars are one file"},
		{"no QMP socket", func(m *Machine) { m.QMPSocket = "" }, "QMP socket: no path"},
		{"QMP socket too long", func(m *Machine) { m.QMPSocket = "/" + strings.Repeat("s", 107) }, "longer than the 107 bytes"},
		{"unknown serial port", func(m *Machine) { m.Serial = []SerialPort{{Port: "com5", Socket: "/s"}} }, `serial port "com5"`},
		{"serial port twice", func(m *Machine) {
			m.Serial = []SerialPort{{Port: "com1", Socket: "/a"}, {Port: "com1", Socket: "/b"}}
		}, "serial port com1: given twice"},
		{"serial socket is the QMP socket", func(m *Machine) {
			m.Serial = []SerialPort{{Port: "com2", Socket: m.QMPSocket}}
		}, "already QMP's"},
		{"serial without socket", func(m *Machine) { m.Serial = []SerialPort{{Port: "com1"}} }, "com1 socket: no path"},
		{"bad disk id", func(m *Machine) { m.Disks = []Disk{disk("0disk", 4, 0)} }, `disk id "0disk"`},
		{"disk id of a serial port", func(m *Machine) { m.Disks = []Disk{disk("com1", 4, 0)} }, `disk id "com1": reserved`},
		{"duplicate ids", func(m *Machine) {
			m.Disks = []Disk{disk("a", 4, 0)}
			m.NICs = []NIC{nic("a", 5)}
		}, `NIC id "a": used twice`},
		{"unknown disk kind", func(m *Machine) { d := disk("a", 4, 0); d.Kind = "ide"; m.Disks = []Disk{d} }, `kind "ide"`},
		{"disk without file", func(m *Machine) { d := disk("a", 4, 0); d.Path = ""; m.Disks = []Disk{d} }, "backing file: no path"},
		{"disk on the firmware", func(m *Machine) { d := disk("a", 4, 0); d.Path = m.Firmware.Vars; m.Disks = []Disk{d} }, "is the firmware's"},
		{"one file written by two disks", func(m *Machine) {
			d, e := disk("a", 4, 0), disk("b", 5, 0)
			e.Path, e.ReadOnly = d.Path, true
			m.Disks = []Disk{d, e}
		}, `backing file "/d/a": 2 disks have it and one writes it`},
		{"block size", func(m *Machine) { d := disk("a", 4, 0); d.BlockSize = 1024; m.Disks = []Disk{d} }, "block size 1024"},
		{"no block size", func(m *Machine) { d := disk("a", 4, 0); d.BlockSize = 0; m.Disks = []Disk{d} }, "block size 0"},
		{"NVMe without serial", func(m *Machine) { d := disk("a", 4, 0); d.Kind = NVMe; m.Disks = []Disk{d} }, "needs a serial"},
		{"virtio-blk without write cache", func(m *Machine) { d := disk("a", 4, 0); d.NoWriteCache = true; m.Disks = []Disk{d} }, "only an NVMe disk can be without a write cache"},
		{"long serial", func(m *Machine) { d := disk("a", 4, 0); d.Serial = strings.Repeat("s", 21); m.Disks = []Disk{d} }, "at most 20 printable"},
		{"serial with a newline", func(m *Machine) { d := disk("a", 4, 0); d.Serial = "a\nb"; m.Disks = []Disk{d} }, "at most 20 printable"},
		{"PCI bus 1", func(m *Machine) { d := disk("a", 4, 0); d.PCI.Bus = 1; m.Disks = []Disk{d} }, "bus 1: devices go on the root bus"},
		{"PCI device 32", func(m *Machine) { m.Disks = []Disk{disk("a", 32, 0)} }, "want device 0-31 and function 0-7"},
		{"PCI function 8", func(m *Machine) { m.Disks = []Disk{disk("a", 4, 8)} }, "want device 0-31 and function 0-7"},
		{"q35 host bridge slot", func(m *Machine) { m.Disks = []Disk{disk("a", 0, 0)} }, "slot 0 belongs to the q35 board"},
		{"q35 LPC slot", func(m *Machine) { m.Disks = []Disk{disk("a", 31, 2)} }, "slot 31 belongs to the q35 board"},
		{"i440fx PIIX3 slot", func(m *Machine) { m.Chipset = I440FX; m.Disks = []Disk{disk("a", 1, 0)} }, "slot 1 belongs to the i440fx board"},
		{"two devices on one path", func(m *Machine) {
			m.Disks = []Disk{disk("a", 4, 0)}
			m.NICs = []NIC{nic("n", 4)}
		}, `NIC "n" at PCI 0.4.0: disk "a" is there already`},
		{"function without function 0", func(m *Machine) { m.Disks = []Disk{disk("a", 4, 3)} }, "slot 4 has no function 0"},
		{"bad MAC", func(m *Machine) { n := nic("n", 4); n.MAC = "02:00:00:00:01"; m.NICs = []NIC{n} }, `MAC "02:00:00:00:01"`},
		{"long MAC", func(m *Machine) { n := nic("n", 4); n.MAC = "02:00:00:00:00:00:00:01"; m.NICs = []NIC{n} }, "want six bytes"},
		{"multicast MAC", func(m *Machine) { n := nic("n", 4); n.MAC = "01:00:5e:00:00:01"; m.NICs = []NIC{n} }, "is a multicast address"},
		{"zero MAC", func(m *Machine) { n := nic("n", 4); n.MAC = "00:00:00:00:00:00"; m.NICs = []NIC{n} }, "all zeros"},
		{"unknown NIC kind", func(m *Machine) { n := nic("n", 4); n.Kind = "e1000"; m.NICs = []NIC{n} }, `kind "e1000"`},
		{"no tap", func(m *Machine) { n := nic("n", 4); n.Tap = ""; m.NICs = []NIC{n} }, `tap ""`},
		{"long tap", func(m *Machine) { n := nic("n", 4); n.Tap = "tap0123456789abc"; m.NICs = []NIC{n} }, "1 to 15"},
		{"tap with a slash", func(m *Machine) { n := nic("n", 4); n.Tap = "a/b"; m.NICs = []NIC{n} }, `tap "a/b"`},
		{"boot from a missing device", func(m *Machine) { m.BootOrder = []string{"nope"} }, `"nope" is neither a disk nor a NIC`},
		{"boot from a serial port", func(m *Machine) {
			m.Serial = []SerialPort{{Port: "com1", Socket: "/s"}}
			m.BootOrder = []string{"com1"}
		}, `"com1" is neither`},
		{"boot entry twice", func(m *Machine) {
			m.Disks = []Disk{disk("a", 4, 0)}
			m.BootOrder = []string{"a", "a"}
		}, `"a" given twice`},
		{"tap without descriptor", func(m *Machine) { m.Descriptors = true; m.NICs = []NIC{nic("n", 4)} }, `NIC "n": tap "tapn": no descriptor`},
		{"tap descriptor unused", func(m *Machine) { n := nic("n", 4); n.File = os.Stdin; m.NICs = []NIC{n} }, `NIC "n": tap "tapn": a descriptor, but QEMU is to make the tap itself`},
		{"disk descriptor unused", func(m *Machine) { d := disk("a", 4, 0); d.File = os.Stdin; m.Disks = []Disk{d} }, `disk "a": a descriptor, but QEMU is to open`},
		{"bad user", func(m *Machine) { m.RunAs = "Root Admin" }, `run as "Root Admin"`},
		{"run as with the sandbox", func(m *Machine) { m.RunAs, m.Sandbox = "qemu", true }, "start QEMU as the user instead"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := minimal()
			tt.change(&m)
			args, err := m.Args()
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Args = %q, %v; want an error wrapping ErrInvalid", args, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

// With Descriptors the arguments name fds 3 on, in the order of the
// descriptors Start opens and makes: the access mode of each file is the
// one QEMU opens it with (an fd set gives QEMU only a descriptor of the
// mode it asks for).
func TestDescriptors(t *testing.T) {
	m := descriptors(t)
	args, pass, err := m.command()
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		what, path            string
		write, socket, device bool
		tap                   bool
	}
	var got []want
	for _, p := range pass {
		got = append(got, want{p.what, p.path, p.write, p.socket, p.device, p.file != nil})
	}
	wants := []want{
		{what: "firmware code", path: "/usr/share/OVMF/OVMF_CODE_4M.fd"},
		{what: "firmware vars", path: "/var/vmm/vm0/vars.fd", write: true},
		{what: "QMP socket", path: "/var/vmm/vm0/qmp.sock", socket: true},
		{what: "com1 socket", path: "/var/vmm/vm0/com1.sock", socket: true},
		{what: "com2 socket", path: "/var/vmm/vm0/com2.sock", socket: true},
		{what: "com3 socket", path: "/var/vmm/vm0/com3.sock", socket: true},
		{what: "com4 socket", path: "/var/vmm/vm0/com4.sock", socket: true},
		{what: `disk "boot"`, path: "/pool/disks/boot.raw", write: true},
		{what: `disk "data"`, path: "/pool/disks/data,1.raw", write: true},
		{what: `disk "cidata"`, path: "/pool/disks/cidata.raw"},
		{what: `NIC "net0": tap vtap0`, tap: true},
		{what: `NIC "net0": vhost-net`, path: "/dev/vhost-net", write: true, device: true},
		{what: `NIC "net1": tap vtap1`, tap: true},
	}
	if diff := cmp.Diff(wants, got, cmp.AllowUnexported(want{})); diff != "" {
		t.Errorf("descriptors (-want +got):\n%s", diff)
	}
	// Each descriptor is named once, at its number; and no path is left
	// for QEMU to open but in an fd set's label.
	named := map[string]int{}
	for _, a := range args {
		for _, o := range strings.Split(a, ",") {
			if fd, ok := strings.CutPrefix(o, "fd="); ok {
				named[fd]++
			}
			if fd, ok := strings.CutPrefix(o, "vhostfd="); ok {
				named[fd]++
			}
			if strings.HasPrefix(o, "path=") || strings.HasPrefix(o, "file.filename=/") && !strings.HasPrefix(o, "file.filename=/dev/fdset/") || strings.HasPrefix(o, "ifname=") {
				t.Errorf("QEMU is left a path to open: %q", a)
			}
		}
	}
	for i := range pass {
		if fd := strconv.Itoa(3 + i); named[fd] != 1 {
			t.Errorf("fd %s (%s) named %d times", fd, pass[i].what, named[fd])
		}
	}
	if len(named) != len(pass) {
		t.Errorf("%d fds named, %d given", len(named), len(pass))
	}
	if !m.NICs[0].Vhost || m.NICs[1].Vhost {
		t.Fatal("full() changed: want vhost on net0 alone")
	}
}

func TestArgsListsEveryProblem(t *testing.T) {
	m := minimal()
	m.CPUs, m.MemoryMiB = 0, 0
	_, err := m.Args()
	if err == nil || !strings.Contains(err.Error(), "0 CPUs") || !strings.Contains(err.Error(), "0 MiB") {
		t.Fatalf("error %v does not name both problems", err)
	}
}

func TestChipsetFor(t *testing.T) {
	if ChipsetFor(false) != I440FX || ChipsetFor(true) != Q35 {
		t.Errorf("ChipsetFor(false, true) = %q, %q", ChipsetFor(false), ChipsetFor(true))
	}
}

func TestPrepareVars(t *testing.T) {
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "template.fd")
	vars := filepath.Join(dir, "vars.fd")
	if err := os.WriteFile(tmpl, []byte("template"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := PrepareVars(tmpl, vars); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(vars); string(b) != "template" {
		t.Fatalf("vars = %q after the first copy", b)
	}
	// The guest's variables survive a second start.
	if err := os.WriteFile(vars, []byte("guest's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := PrepareVars(tmpl, vars); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(vars); string(b) != "guest's" {
		t.Fatalf("vars = %q: overwritten", b)
	}
	if err := PrepareVars(filepath.Join(dir, "missing"), filepath.Join(dir, "other.fd")); err == nil {
		t.Error("a missing template copied")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("left %d files in the directory, want 2", len(ents))
	}
}

// TestNVMeWriteCache: an NVMe disk's write cache is the device's
// write-cache setting, on unless the disk has none (upstream's
// has_write_cache); virtio-blk disks keep QEMU's default.
func TestNVMeWriteCache(t *testing.T) {
	m := full()
	m.Disks = append(m.Disks, Disk{ID: "scratch", Kind: NVMe, PCI: PCIPath{0, 6, 0}, Path: "/pool/disks/scratch.raw", BlockSize: 512, Serial: "scratch", NoWriteCache: true})
	args, err := m.Args()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"boot": "", "data": "write-cache=on", "cidata": "", "scratch": "write-cache=off"}
	seen := 0
	for _, a := range args {
		for id, w := range want {
			if !strings.Contains(a, ",id="+id+",") {
				continue
			}
			seen++
			got := ""
			for _, p := range strings.Split(a, ",") {
				if strings.HasPrefix(p, "write-cache=") {
					got = p
				}
			}
			if got != w {
				t.Errorf("disk %q: device %q: write cache %q, want %q", id, a, got, w)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of the %d disks' devices in %q", seen, len(want), args)
	}
}

package spec

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const nicID = "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e01"

// testSpec is a spec as the control plane sends one: a boot disk on a file,
// a cloud-init seed as a blob, a NIC, com1, pvpanic and a boot order.
func testSpec(disk string) map[string]any {
	return map[string]any{
		"board": map[string]any{"cpus": 1, "memory_mb": 256, "chipset": map[string]any{"type": "i440_fx", "value": map[string]any{"enable_pcie": false}}},
		"components": map[string]any{
			"boot-disk":          comp("virtio_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x10)}),
			"boot-disk-backend":  comp("file_storage_backend", map[string]any{"path": disk, "readonly": false, "block_size": 512}),
			"cloud-init":         comp("virtio_disk", map[string]any{"backend_id": "cloud-init-backend", "pci_path": pci(0x18)}),
			"cloud-init-backend": comp("blob_storage_backend", map[string]any{"base64": "aGVsbG8=", "readonly": true}),
			"net0":               comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": nicID, "pci_path": pci(8)}),
			"net0-backend":       comp("virtio_network_backend", map[string]any{"vnic_name": "vopte0"}),
			"com1":               comp("serial_port", map[string]any{"num": "com1"}),
			"pvpanic":            comp("qemu_pvpanic", map[string]any{"enable_isa": true}),
			"boot-settings":      comp("boot_settings", map[string]any{"order": []any{map[string]any{"id": "boot-disk"}}}),
		},
	}
}

func comp(typ string, c map[string]any) map[string]any {
	return map[string]any{"type": typ, "component": c}
}

func pci(dev int) map[string]any { return map[string]any{"bus": 0, "device": dev, "function": 0} }

type world struct {
	disk string
	sled Sled
}

// newWorld makes a pool's local_storage dataset and an image directory
// with a disk file in the first.
func newWorld(t *testing.T) world {
	dir := t.TempDir()
	local := filepath.Join(dir, "pool", "local_storage")
	images := filepath.Join(dir, "images")
	for _, d := range []string{local, images} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	disk := filepath.Join(local, "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("a8:40:25:ff:00:01")
	return world{disk: disk, sled: Sled{Threads: 2, FileRoots: []string{local, images}, NICs: map[string]net.HardwareAddr{nicID: mac}}}
}

func decodeCheck(t *testing.T, doc map[string]any, sled Sled) (*Spec, error) {
	t.Helper()
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Decode(raw)
	if err != nil {
		return nil, err
	}
	return s, Check(s, sled)
}

func TestGoodSpec(t *testing.T) {
	w := newWorld(t)
	s, err := decodeCheck(t, testSpec(w.disk), w.sled)
	if err != nil {
		t.Fatal(err)
	}
	if s.Board != (Board{CPUs: 1, MemoryMiB: 256}) {
		t.Errorf("board = %+v", s.Board)
	}
	if got := s.Components["cloud-init-backend"].Blob; got == nil || string(got.Data) != "hello" || !got.ReadOnly {
		t.Errorf("blob = %+v", got)
	}
	if got := s.Components["boot-settings"].Boot; len(got) != 1 || got[0] != "boot-disk" {
		t.Errorf("boot order = %v", got)
	}
	if got := s.Components["net0"].NIC; got == nil || got.PCI != (PCIPath{Device: 8}) {
		t.Errorf("nic = %+v", got)
	}
}

// A virtio socket, which upstream's Nexus gives every instance (guest CID
// 16, device 0x19), is accepted and listed as not realised.
func TestVirtioSocketAcceptedNotRealised(t *testing.T) {
	w := newWorld(t)
	doc := testSpec(w.disk)
	set("vsock", comp("virtio_socket", map[string]any{"guest_cid": 16, "pci_path": pci(0x19)}))(doc)
	s, err := decodeCheck(t, doc, w.sled)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Components["vsock"].Vsock; got == nil || *got != (Vsock{GuestCID: 16, PCI: PCIPath{Device: 0x19}}) {
		t.Errorf("vsock = %+v", got)
	}
	if _, ok := NotRealised[TypeVirtioSocket]; !ok {
		t.Error("a virtio socket is not listed as not realised")
	}
}

// Every refusal names the component and the problem.
func TestRefusals(t *testing.T) {
	w := newWorld(t)
	outside := filepath.Join(t.TempDir(), "outside.raw")
	if err := os.WriteFile(outside, make([]byte, 512), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(w.sled.FileRoots[0], "shadow.raw")
	if err := os.Symlink("/etc/shadow", link); err != nil {
		t.Fatal(err)
	}
	dirLink := filepath.Join(w.sled.FileRoots[1], "up")
	if err := os.Symlink("..", dirLink); err != nil {
		t.Fatal(err)
	}
	// Links inside the sled's storage to files inside it are refused too:
	// a link can be changed between the check and the open.
	inLink := filepath.Join(w.sled.FileRoots[1], "boot.raw")
	if err := os.Symlink(w.disk, inLink); err != nil {
		t.Fatal(err)
	}
	dirIn := filepath.Join(w.sled.FileRoots[1], "pool")
	if err := os.Symlink(filepath.Dir(w.disk), dirIn); err != nil {
		t.Fatal(err)
	}
	// A hard link in the sled's storage to a host file is that file.
	hard := filepath.Join(w.sled.FileRoots[1], "passwd.raw")
	if err := os.Link(outside, hard); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func(doc map[string]any)
		want   string
	}{
		{"no cpus", board("cpus", 0), "board.cpus 0"},
		{"too many cpus", board("cpus", 3), "board.cpus 3: this sled has 2 hardware threads"},
		{"no memory", board("memory_mb", 0), "board.memory_mb 0"},
		{"other chipset", board("chipset", map[string]any{"type": "q35"}), `board.chipset`},
		{"two on one path", set("net0", comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": nicID, "pci_path": pci(0x10)})), `components "boot-disk" and "net0" are both at pci_path 00:10.0`},
		{"bridge bus", set("net0", comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": nicID, "pci_path": map[string]any{"bus": 1, "device": 8, "function": 0}})), "devices sit on bus 0"},
		{"host bridge slot", set("net0", comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": nicID, "pci_path": pci(0)})), "slot 0 is the host bridge"},
		{"boot names nothing", set("boot-settings", comp("boot_settings", map[string]any{"order": []any{map[string]any{"id": "nope"}}})), `boot entry "nope" names no component`},
		{"boot names a nic", set("boot-settings", comp("boot_settings", map[string]any{"order": []any{map[string]any{"id": "net0"}}})), `boot entry "net0" is a virtio_nic, not a disk`},
		{"backend names nothing", set("boot-disk", comp("virtio_disk", map[string]any{"backend_id": "nope", "pci_path": pci(0x10)})), `backend_id "nope" names no component`},
		{"backend of another kind", set("boot-disk", comp("virtio_disk", map[string]any{"backend_id": "net0-backend", "pci_path": pci(0x10)})), `backend_id "net0-backend" is a virtio_network_backend`},
		{"backend twice", set("cloud-init", comp("virtio_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x18)})), `both use backend "boot-disk-backend"`},
		{"nic of no local nic", set("net0", comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": "00000000-0000-0000-0000-000000000009", "pci_path": pci(8)})), "names no NIC of local_config.nics"},
		{"crucible", set("boot-disk-backend", comp("crucible_storage_backend", map[string]any{"readonly": false, "request_json": "{}"})), `component "boot-disk-backend" (crucible_storage_backend): cannot be realised on this sled`},
		{"dlpi", set("net0-backend", comp("dlpi_network_backend", map[string]any{"vnic_name": "x"})), "(dlpi_network_backend): cannot be realised"},
		{"p9fs", set("p9", comp("p9fs", map[string]any{})), "(p9fs): cannot be realised"},
		{"softnpu", set("npu", comp("soft_npu_port", map[string]any{})), "(soft_npu_port): cannot be realised"},
		{"failure injector", set("inj", comp("migration_failure_injector", map[string]any{"fail_exports": 1, "fail_imports": 0})), "(migration_failure_injector): cannot be realised"},
		{"unknown type", set("x", comp("floppy", map[string]any{})), "not a component type"},
		{"unknown member", set("com1", comp("serial_port", map[string]any{"num": "com1", "baud": 9600})), `unknown field "baud"`},
		{"serial twice", set("com1b", comp("serial_port", map[string]any{"num": "com1"})), "both serial port com1"},
		{"bad com", set("com1", comp("serial_port", map[string]any{"num": "com5"})), `num "com5"`},
		{"host file", backendPath("/etc/shadow"), `path "/etc/shadow" (/etc/shadow) is outside this sled's guest storage`},
		{"file outside", backendPath(outside), "is outside this sled's guest storage"},
		{"symlink out", backendPath(link), `shadow.raw": a symbolic link is on the way`},
		{"symlink inside", backendPath(inLink), `boot.raw": a symbolic link is on the way`},
		{"directory link inside", backendPath(filepath.Join(dirIn, "disk.raw")), `a symbolic link is on the way`},
		{"hard link", backendPath(hard), "has more than one hard link (2)"},
		{"same file twice", set("cloud-init-backend", comp("file_storage_backend", map[string]any{"path": w.disk, "readonly": true, "block_size": 512})), `components "boot-disk-backend" and "cloud-init-backend" are one file (device`},
		{"dotdot through a link", backendPath(dirLink + strings.Repeat("/..", 20) + "/etc/passwd"), "(/etc/passwd) is outside"},
		{"relative", backendPath("disk.raw"), "is not absolute"},
		{"root itself", backendPath(w.sled.FileRoots[1]), "outside"},
		{"missing file", backendPath(filepath.Join(w.sled.FileRoots[0], "nope.raw")), "no such file"},
		{"block size", set("boot-disk-backend", comp("file_storage_backend", map[string]any{"path": w.disk, "readonly": false, "block_size": 1000})), "block_size 1000"},
		{"bad base64", set("cloud-init-backend", comp("blob_storage_backend", map[string]any{"base64": "!!", "readonly": true})), "base64"},
		{"nvme serial", set("boot-disk", comp("nvme_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x10), "serial_number": []int{1, 2}, "has_write_cache": true})), "serial_number: want 20 bytes"},
		{"nvme without write cache member", set("boot-disk", comp("nvme_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x10), "serial_number": make([]int, 20)})), "missing field `has_write_cache`"},
		{"virtio disk with write cache member", set("boot-disk", comp("virtio_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x10), "has_write_cache": true})), `unknown field "has_write_cache"`},
		{"vsock cid of the host", set("vsock", comp("virtio_socket", map[string]any{"guest_cid": 2, "pci_path": pci(0x19)})), "guest_cid 2: want 3 to 4294967294"},
		{"vsock cid of any", set("vsock", comp("virtio_socket", map[string]any{"guest_cid": 0xffffffff, "pci_path": pci(0x19)})), "guest_cid 4294967295"},
		{"vsock on a disk's path", set("vsock", comp("virtio_socket", map[string]any{"guest_cid": 16, "pci_path": pci(0x10)})), `components "boot-disk" and "vsock" are both at pci_path 00:10.0`},
		{"vsock unknown member", set("vsock", comp("virtio_socket", map[string]any{"guest_cid": 16, "pci_path": pci(0x19), "port": 1})), `unknown field "port"`},
		{"two boot settings", set("boot2", comp("boot_settings", map[string]any{"order": []any{}})), "at most one boot_settings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := testSpec(w.disk)
			tc.change(doc)
			_, err := decodeCheck(t, doc, w.sled)
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("err = %v; want a *spec.Error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want it to say %q", err, tc.want)
			}
		})
	}
}

func board(field string, v any) func(map[string]any) {
	return func(doc map[string]any) { doc["board"].(map[string]any)[field] = v }
}

func set(key string, c map[string]any) func(map[string]any) {
	return func(doc map[string]any) { doc["components"].(map[string]any)[key] = c }
}

func backendPath(p string) func(map[string]any) {
	return set("boot-disk-backend", comp("file_storage_backend", map[string]any{"path": p, "readonly": false, "block_size": 512}))
}

// Two disks may read one file; two reading it as two backends of one spec
// too.
func TestReadOnlySharing(t *testing.T) {
	w := newWorld(t)
	doc := testSpec(w.disk)
	set("boot-disk-backend", comp("file_storage_backend", map[string]any{"path": w.disk, "readonly": true, "block_size": 512}))(doc)
	set("cloud-init-backend", comp("file_storage_backend", map[string]any{"path": w.disk, "readonly": true, "block_size": 512}))(doc)
	if _, err := decodeCheck(t, doc, w.sled); err != nil {
		t.Fatal(err)
	}
}

// CheckOpen returns each file backend's file open as judged, read-write
// or read-only as the backend is.
func TestCheckOpen(t *testing.T) {
	w := newWorld(t)
	raw, _ := json.Marshal(testSpec(w.disk))
	s, err := Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	files, err := CheckOpen(s, w.sled)
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	f := files["boot-disk-backend"]
	if len(files) != 1 || f == nil || f.Path != w.disk {
		t.Fatalf("files = %v", files)
	}
	fi, err := os.Stat(w.disk)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Ino != f.ID.Ino || uint64(st.Dev) != f.ID.Dev {
		t.Errorf("opened %s; the disk is %d:%d", f.ID, st.Dev, st.Ino)
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_ACCMODE != unix.O_RDWR {
		t.Errorf("flags %#x, %v: want read-write", fl, err)
	}
}

func TestNotASpec(t *testing.T) {
	for _, raw := range []string{`[]`, `{}`, `{"board": {"cpus": 1}}`, `{"board":{"cpus":1,"memory_mb":1,"chipset":{"type":"i440_fx","value":{"enable_pcie":false}}}}`} {
		if _, err := Decode([]byte(raw)); err == nil {
			t.Errorf("Decode(%s) succeeded", raw)
		}
	}
}

// An NVMe disk of propolis-server 6.0.0 (sled-agent 48's vmm_spec) carries
// has_write_cache, which the spec keeps.
func TestNVMeWriteCache(t *testing.T) {
	w := newWorld(t)
	for _, wc := range []bool{true, false} {
		doc := testSpec(w.disk)
		set("boot-disk", comp("nvme_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x10), "serial_number": make([]int, 20), "has_write_cache": wc}))(doc)
		s, err := decodeCheck(t, doc, w.sled)
		if err != nil {
			t.Fatalf("has_write_cache %v: %v", wc, err)
		}
		if d := s.Components["boot-disk"].Disk; d.WriteCache != wc {
			t.Errorf("has_write_cache %v: WriteCache %v", wc, d.WriteCache)
		}
	}
}

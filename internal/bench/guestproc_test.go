package bench

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The agent's QEMU, handed descriptors, and the floor's, opening paths,
// compare equal once the descriptors are read as what they stand for; a
// real difference still shows.
func TestDescriptorsReadAsThePathsTheyStandFor(t *testing.T) {
	floor := strings.Fields(`qemu-system-x86_64 -name guest=floor-1 -machine pc,pflash0=fw-code,pflash1=fw-vars -m size=256M` +
		` -blockdev driver=raw,node-name=fw-code,read-only=on,file.driver=file,file.filename=/usr/share/OVMF/OVMF_CODE_4M.fd,file.read-only=on` +
		` -blockdev driver=raw,node-name=fw-vars,read-only=off,file.driver=file,file.filename=/tmp/f/floor-1/vars.fd` +
		` -chardev socket,id=qmp,path=/tmp/f/floor-1/qmp.sock,server=on,wait=off -mon chardev=qmp,mode=control` +
		` -chardev socket,id=com1,path=/tmp/f/floor-1/com1.sock,server=on,wait=off` +
		` -blockdev driver=raw,node-name=drive0,read-only=off,file.driver=file,file.filename=/tmp/f/floor-1/disk.raw,file.read-only=off` +
		` -netdev tap,id=net0,ifname=vna84025f00007,script=no,downscript=no,vnet_hdr=off,vhost=off` +
		` -device virtio-net-pci,id=net0,bus=pci.0,addr=0x8.0,netdev=net0,mac=a8:40:25:f0:00:07,romfile=`)
	agent := strings.Fields(`qemu-system-x86_64 -name guest=vm-2 -machine pc,pflash0=fw-code,pflash1=fw-vars -m size=256M` +
		` -add-fd fd=3,set=3,opaque=/usr/share/OVMF/OVMF_CODE_4M.fd` +
		` -blockdev driver=raw,node-name=fw-code,read-only=on,file.driver=file,file.filename=/dev/fdset/3,file.read-only=on` +
		` -add-fd fd=4,set=4,opaque=/data/zones/vm-2/guest/vars.fd` +
		` -blockdev driver=raw,node-name=fw-vars,read-only=off,file.driver=file,file.filename=/dev/fdset/4` +
		` -chardev socket,id=qmp,fd=5,server=on,wait=off -mon chardev=qmp,mode=control` +
		` -chardev socket,id=com1,fd=6,server=on,wait=off` +
		` -add-fd fd=7,set=7,opaque=/images/d.raw` +
		` -blockdev driver=raw,node-name=drive0,read-only=off,file.driver=file,file.filename=/dev/fdset/7,file.read-only=off` +
		` -netdev tap,id=net0,fd=8,vhost=off` +
		` -device virtio-net-pci,id=net0,bus=pci.0,addr=0x8.0,netdev=net0,mac=a8:40:25:f0:00:07,romfile=`)
	f := normaliseArgv(floor, "floor-1", "/tmp/f/floor-1/disk.raw")
	a := normaliseArgv(agent, "vm-2", "/images/d.raw")
	if diff := cmp.Diff(f, a); diff != "" {
		t.Fatalf("floor and agent differ (-floor +agent):\n%s", diff)
	}
	other := append([]string(nil), agent...)
	other[len(other)-1] = strings.Replace(other[len(other)-1], "addr=0x8.0", "addr=0x9.0", 1)
	if cmp.Equal(f, normaliseArgv(other, "vm-2", "/images/d.raw")) {
		t.Fatal("a NIC at another PCI address compares equal")
	}
}

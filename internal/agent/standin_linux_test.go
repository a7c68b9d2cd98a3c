package agent_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vmm/service"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// With --vmm-stand-in and the linux runtime, a VMM's guest is a stand-in:
// registered and run through the API as any, its NIC is a veth pair whose
// host end is named as the tap (vn<mac>) and lies in the VMM's zone, and
// whose guest end, eth0 with the NIC's MAC, is in a namespace the guest's
// console names; stopped, the guest's namespace goes with it.
func TestLinuxStandInGuest(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	a := newAgent(t, agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		VMMStandIn: true, UnderlayIP: "fd00:1122:3344:1d9::1"})
	run(t, a)
	const addr = "[fd00:1122:3344:1d9::9]:12400"
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, string(vmmtest.Body(testInstance, addr, vmmtest.Spec(), nil))); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK {
		t.Fatalf("run: %d %s", code, b)
	}
	waitVMM(t, a, "running")

	// The console says where the guest's namespace is.
	var path string
	deadline := time.Now().Add(30 * time.Second)
	for path == "" {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		data, _, err := propolisapi.NewClient(addr).SerialHistory(ctx, propolisapi.SerialFromStart(0), 1<<20)
		cancel()
		if err == nil {
			for _, l := range strings.Split(string(data), "\n") {
				if p, ok := strings.CutPrefix(strings.TrimSpace(l), standin.NotePrefix); ok {
					path = p
				}
			}
		}
		if path == "" && time.Now().After(deadline) {
			t.Fatalf("no %q line on the console: %q (%v)", standin.NotePrefix, data, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	guest, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	gh, err := netlink.NewHandleAt(guest)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := gh.LinkByName("eth0"); err != nil || l.Attrs().HardwareAddr.String() != vmmtest.MAC {
		t.Errorf("the guest's eth0: %v (%v), want MAC %s", l, err, vmmtest.MAC)
	}
	gh.Close()
	guest.Close()
	zone, err := netns.GetFromPath(zonenet.NetnsPath(prefix + service.ZoneName(testVMM)))
	if err != nil {
		t.Fatal(err)
	}
	zh, err := netlink.NewHandleAt(zone)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zh.LinkByName(spec.VNICName(vmmtest.MustMAC())); err != nil {
		t.Errorf("the tap's stand-in %s in the VMM's zone: %v", spec.VNICName(vmmtest.MustMAC()), err)
	}
	zh.Close()
	zone.Close()
	holder := strings.TrimSuffix(strings.TrimPrefix(path, "/proc/"), "/ns/net")

	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"stopped"}}`); code != http.StatusOK {
		t.Fatalf("stop: %d %s", code, b)
	}
	waitVMM(t, a, "destroyed")
	waitFor(t, "the guest's namespace gone", func() (bool, string) {
		_, err := os.Stat("/proc/" + holder)
		return err != nil, "its holder, pid " + holder + ", still runs"
	})
}

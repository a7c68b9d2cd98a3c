package agent_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// natPeriod is short, so that "within one period" is quick; the hang
// detector of waitFor bounds every wait.
const natPeriod = 200 * time.Millisecond

// switches are the simulated neighbours of a NAT test: a DNS server and
// switch daemons on IPv6 loopback.
type switches struct {
	t   *testing.T
	dns *dns.Server
	dpd []*dpdsim.Server
}

func startSwitches(t *testing.T, n int) *switches {
	t.Helper()
	s := &switches{t: t, dns: dns.NewServer(nil)}
	if err := s.dns.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.dns.Close() })
	for i := range n {
		s.add(uint16(i % 2))
	}
	return s
}

// add starts one more switch daemon (not yet in DNS).
func (s *switches) add(slot uint16) *dpdsim.Server {
	s.t.Helper()
	d := dpdsim.New(nil, slot)
	if err := d.Start("[::1]:0"); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { d.Close() })
	s.dpd = append(s.dpd, d)
	return d
}

// publish makes DNS name exactly these switch daemons.
func (s *switches) publish(ds ...*dpdsim.Server) {
	s.t.Helper()
	var addrs []netip.AddrPort
	for _, d := range ds {
		addrs = append(addrs, netip.MustParseAddrPort(d.Addr()))
	}
	if err := s.dns.SetRecords(dns.SwitchRecords(addrs...)); err != nil {
		s.t.Fatal(err)
	}
}

func (s *switches) config(dir string) agent.Config {
	return agent.Config{DataDir: dir, DNSServers: []string{s.dns.Addr().String()}, NATPeriod: natPeriod}
}

// ours returns the entries of the default underlay address on d.
func ours(d *dpdsim.Server) []string {
	under := netip.MustParseAddr(agent.DefaultUnderlayIP)
	var out []string
	for _, e := range d.Entries() {
		if e.Target.InternalIP == under {
			out = append(out, fmt.Sprintf("%s %d-%d %s", e.External, e.Low, e.High, e.Target.InnerMAC))
		}
	}
	slices.Sort(out)
	return out
}

func waitEntries(t *testing.T, d *dpdsim.Server, want ...string) time.Duration {
	t.Helper()
	t0 := time.Now()
	waitFor(t, fmt.Sprintf("switch %s to hold %v", d.Addr(), want), func() (bool, string) {
		got := ours(d)
		return slices.Equal(got, want), fmt.Sprint(got)
	})
	return time.Since(t0)
}

var (
	nexusZone  = sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221")
	nexusEntry = "192.0.2.10 0-65535 a8:40:25:ff:80:05"
)

func TestOneSwitchReachableZonesStartAndItIsProgrammed(t *testing.T) {
	s := startSwitches(t, 2)
	s.publish(s.dpd...)
	if err := s.dpd[1].SetFault(dpdsim.FaultHang); err != nil {
		t.Fatal(err)
	}
	_, c := start(t, s.config(t.TempDir()))
	putZones(t, c, 1, nexusZone, sledconfigtest.Crucible(1))
	waitStates(t, c, map[string]string{nexusZone.Name(): "running", sledconfigtest.Crucible(1).Name(): "running"})
	waitEntries(t, s.dpd[0], nexusEntry)
	if err := s.dpd[1].SetFault(dpdsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	waitEntries(t, s.dpd[1], nexusEntry)
	inv, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inv.NAT == nil || inv.NAT.Discovery.Source != "dns" || len(inv.NAT.Switches) != 2 {
		t.Fatalf("inventory nat %+v", inv.NAT)
	}
	for _, sw := range inv.NAT.Switches {
		if sw.FoundBy != "dns" || sw.Slot == nil || sw.Desired != 1 {
			t.Errorf("switch %+v", sw)
		}
	}
}

func TestSwitchesAppearingOrReplacedAreProgrammed(t *testing.T) {
	s := startSwitches(t, 1)
	s.publish(s.dpd[0])
	_, c := start(t, s.config(t.TempDir()))
	putZones(t, c, 1, nexusZone)
	waitEntries(t, s.dpd[0], nexusEntry)

	second := s.add(1)
	s.publish(s.dpd[0], second)
	took := waitEntries(t, second, nexusEntry)
	t.Logf("a switch that appeared in DNS programmed %s later", took.Round(time.Millisecond))

	// The second switch is replaced: a new daemon at a new address, empty.
	replacement := s.add(1)
	s.publish(s.dpd[0], replacement)
	waitEntries(t, replacement, nexusEntry)
	waitFor(t, "the replaced switch gone from inventory", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.NAT == nil {
			return false, fmt.Sprint(err)
		}
		var addrs []string
		for _, sw := range inv.NAT.Switches {
			addrs = append(addrs, sw.Address)
		}
		return len(addrs) == 2 && !slices.Contains(addrs, second.Addr()), fmt.Sprint(addrs)
	})
}

func TestRestartedDpdIsReprogrammedAndRemovedZonesEntriesGo(t *testing.T) {
	s := startSwitches(t, 2)
	s.publish(s.dpd...)
	_, c := start(t, s.config(t.TempDir()))
	putZones(t, c, 1, nexusZone, sledconfigtest.Crucible(1))
	waitEntries(t, s.dpd[0], nexusEntry)
	waitEntries(t, s.dpd[1], nexusEntry)

	s.dpd[0].RestartEmpty()
	waitEntries(t, s.dpd[0], nexusEntry)

	putZones(t, c, 2, sledconfigtest.Crucible(1))
	waitEntries(t, s.dpd[0])
	waitEntries(t, s.dpd[1])
}

func TestFallbackSwitchesWhenDNSIsUnreachable(t *testing.T) {
	s := startSwitches(t, 1)
	s.dns.SetFault(dns.FaultDrop)
	cfg := s.config(t.TempDir())
	cfg.Switches = []string{s.dpd[0].Addr()}
	_, c := start(t, cfg)
	putZones(t, c, 1, nexusZone)
	waitEntries(t, s.dpd[0], nexusEntry)
	inv, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inv.NAT.Discovery.Source != "fallback" || inv.NAT.Discovery.DNSError == "" || inv.NAT.Switches[0].FoundBy != "fallback" {
		t.Fatalf("inventory nat %+v", inv.NAT)
	}
}

func TestAnotherSledsEntryIsReportedNotOverwritten(t *testing.T) {
	s := startSwitches(t, 1)
	s.publish(s.dpd[0])
	theirs := dpd.NatEntry{External: netip.MustParseAddr("192.0.2.10"), Low: 0, High: 65535,
		Target: dpd.NatTarget{InternalIP: netip.MustParseAddr("fd00:1122:3344:102::1"), InnerMAC: dpd.MacAddr{0xa8, 0x40, 0x25, 0xff, 0x80, 0x99}, VNI: 100}}
	s.dpd[0].Inject(theirs)
	_, c := start(t, s.config(t.TempDir()))
	putZones(t, c, 1, nexusZone)
	waitFor(t, "the conflict reported", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.NAT == nil || len(inv.NAT.Switches) == 0 {
			return false, fmt.Sprint(err)
		}
		sw := inv.NAT.Switches[0]
		return len(sw.Conflicts) == 1 && strings.Contains(sw.Conflicts[0], "192.0.2.10"), fmt.Sprintf("%+v", sw)
	})
	if got := s.dpd[0].Entries(); len(got) != 1 || got[0] != theirs {
		t.Fatalf("the switch holds %+v, want only the other sled's entry", got)
	}
}

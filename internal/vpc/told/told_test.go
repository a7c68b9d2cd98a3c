package told_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
	"github.com/sled-agent/sled-agent/internal/vpc/told/toldtest"
)

// sled is a sled with the VMMs and the config given.
type sled struct {
	vmms []told.VMM
	cfg  *sledconfig.Config
}

func (s *sled) VMMs() []told.VMM          { return s.vmms }
func (s *sled) ServicePorts() []told.Port { return told.ServicePorts(s.cfg) }

const (
	vmmA = "a0000000-0000-4000-8000-0000000000a1"
	nicA = `{"id":"a0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"a0000000-0000-4000-8000-000000000001"},
  "name":"net0","ip_config":{"type":"dual_stack","value":{"v4":{"ip":"172.30.0.5","subnet":"172.30.0.0/22","transit_ips":[]},
  "v6":{"ip":"fd77:e9d2:9cd9:1::5","subnet":"fd77:e9d2:9cd9:1::/64","transit_ips":[]}}},
  "mac":"A8:40:25:F0:00:01","vni":7777,"primary":true,"slot":0}`
	portA = "instance/a0000000-0000-4000-8000-0000000000c1"
	ntpZ  = "b0000000-0000-4000-8000-0000000000b1"
	portN = "service/b0000000-0000-4000-8000-0000000000c1"
)

// vmm is VMM A, registered at reg with rules, active.
func vmm(t *testing.T, reg time.Time, rules string) told.VMM {
	t.Helper()
	v, err := told.ParseVMM(vmmA, []byte(`{"local_config":{"nics":[`+nicA+`],"external_ips":{"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"ephemeral_ip":null,"floating_ips":[]},"v6":null},"firewall_rules":`+rules+`}}`))
	if err != nil {
		t.Fatal(err)
	}
	v.Active, v.Registered = true, reg
	return v
}

// ntpConfig is a sled config with VPC.md S7's boundary NTP zone.
func ntpConfig() *sledconfig.Config {
	nic := sledconfig.NIC{ID: "b0000000-0000-4000-8000-0000000000c1", Kind: sledconfig.NICKind{Type: "service", ID: ntpZ}, Name: "ntp",
		IPConfig: sledconfig.IPConfig{Type: "v4", Value: sledconfig.IPConfigValue{IP: "172.30.3.5", Subnet: "172.30.3.0/24"}},
		MAC:      "A8:40:25:FF:80:10", VNI: told.ServiceVNI, Primary: true}
	return &sledconfig.Config{Zones: map[string]sledconfig.Zone{ntpZ: {ID: ntpZ, ZoneType: sledconfig.ZoneType{
		Type: "boundary_ntp", NIC: &nic, SNAT: &sledconfig.SNAT{IP: "192.0.2.30", FirstPort: 0, LastPort: 16383}}}}}
}

// must is v, or a panic (which fails the test) for err.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func wantCalls(t *testing.T, dp *toldtest.Recorder, want ...string) {
	t.Helper()
	if got := dp.Took(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("data path calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A restarted store reads what it was told and, at its first sync, gives
// a new data path every mapping and every port with all its port needs:
// the rules told for its VNI, the routes applied, its external IPs and
// gateways, its attached subnets; a service port not yet routed by Nexus
// gets the services' default routes in each of its routers, as upstream's
// create_port gives a new RouterId of a service port (VPC.md S7).
func TestRestartGivesTheDataPathEverything(t *testing.T) {
	ctx := context.Background()
	dirs := []string{t.TempDir(), t.TempDir()}
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	s := &sled{vmms: []told.VMM{vmm(t, now.Add(-time.Hour), `[]`)}, cfg: ntpConfig()}
	st := must(told.Open(told.Options{Dirs: dirs, Sled: s, Now: func() time.Time { return now }}))

	if got := st.Routes(); len(got) != 5 {
		t.Errorf("routes needed: %+v, want the system and custom routers of VNI 7777 (v4, v6) and 100", got)
	}
	for _, err := range []error{
		st.SetV2P(ctx, must(told.V2P{VirtualIP: "172.30.0.6", VirtualMAC: "A8:40:25:F0:00:02", PhysicalHostIP: "fd00:1122:3344:102::1", VNI: 7777}.Check())),
		st.SetRoutes(ctx, []told.RouteSet{must(told.RouteSet{ID: told.RouterID{VNI: 7777, Kind: told.RouterKind{Type: "system"}},
			Version: &told.RouterVersion{RouterID: "5e5e0c5e-0000-4000-8000-000000000001", Version: 3},
			Routes:  []told.Route{{Dest: "172.30.0.0/22", Target: told.RouterTarget{Type: "vpc_subnet", Value: "172.30.0.0/22"}}}}.Check())}),
		st.SetEIPGateways(ctx, must(told.EIPGateways{Mappings: map[string]map[string][]string{"a0000000-0000-4000-8000-0000000000c1": {"192.0.2.20": {"1a5e0c5e-0000-4000-8000-0000000000a1"}}}}.Check())),
		st.SetFirewallRules(ctx, told.FirewallRulesBody{VNI: 7777, Rules: []told.FirewallRule{{Status: "enabled", Direction: "inbound", Targets: []told.NIC{}, Action: "allow", Priority: 65534}}}),
		st.SetFirewallRules(ctx, told.FirewallRulesBody{VNI: 100, Rules: []told.FirewallRule{{Status: "enabled", Direction: "inbound", Targets: []told.NIC{}, Action: "allow", Priority: 1}, {Status: "disabled", Direction: "inbound", Targets: []told.NIC{}, Action: "deny", Priority: 2}}}),
		st.PutExternalIP(ctx, vmmA, told.ExternalIPBody{Type: "floating", Value: "192.0.2.12"}),
		st.AttachSubnet(ctx, vmmA, told.AttachedSubnet{Subnet: "203.0.113.0/28", Kind: "external"}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}

	dp := &toldtest.Recorder{}
	again := must(told.Open(told.Options{Dirs: dirs, Sled: s, DataPath: dp}))
	if err := again.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, dp,
		"set-v2p 7777 172.30.0.6 A8:40:25:F0:00:02 fd00:1122:3344:102::1",
		`create `+portA+` rules=1 system=[172.30.0.0/22>vpc_subnet] custom=[] ext={"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"floating_ips":["192.0.2.12"]}} gw={"192.0.2.20":["1a5e0c5e-0000-4000-8000-0000000000a1"]} subnets=[{"subnet":"203.0.113.0/28","kind":"external"}]`,
		`create `+portN+` rules=2 system=[0.0.0.0/0>internet_gateway,::/0>internet_gateway] custom=[0.0.0.0/0>internet_gateway,::/0>internet_gateway] ext={"v4":{"source_nat":{"ip":"192.0.2.30","first_port":0,"last_port":16383},"floating_ips":[]}} gw=null subnets=null`)
	// Synced: nothing more to do.
	if err := again.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, dp)

	// The VMM stops: its port goes, its rules' VNI too at the next change.
	s.vmms[0].Active = false
	if err := again.SetV2P(ctx, must(told.V2P{VirtualIP: "172.30.0.7", VirtualMAC: "A8:40:25:F0:00:03", PhysicalHostIP: "fd00:1122:3344:102::1", VNI: 7777}.Check())); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, dp, "delete "+portA, "set-v2p 7777 172.30.0.7 A8:40:25:F0:00:03 fd00:1122:3344:102::1")
	v := again.View()
	if len(v.Firewall) != 1 || v.Firewall[0].VNI != 100 || len(v.Routes) != 0 || len(v.VMMs) != 1 {
		t.Errorf("after the VMM stopped, the record keeps %+v", v)
	}
	if err := again.PutExternalIP(ctx, vmmA, told.ExternalIPBody{Type: "floating", Value: "192.0.2.13"}); !errors.Is(err, told.ErrNoPort) {
		t.Errorf("an external IP for a stopped VMM: %v, want ErrNoPort", err)
	}
}

// Upstream's version gate (PM::vpc_routes_ensure): a set replaces the
// applied one unless both have versions of the same router and the new
// one is not above; another router replaces whatever its version; a set
// of a RouterId no port needs is ignored.
func TestVersionGate(t *testing.T) {
	ctx := context.Background()
	dp := &toldtest.Recorder{}
	st := must(told.Open(told.Options{Sled: &sled{vmms: []told.VMM{vmm(t, time.Time{}, `[]`)}}, DataPath: dp}))
	if err := st.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	dp.Took()
	set := func(router string, version uint64, dest string) told.RouteSet {
		return must(told.RouteSet{ID: told.RouterID{VNI: 7777, Kind: told.RouterKind{Type: "custom", Subnet: "fd77:e9d2:9cd9:1::/64"}},
			Version: &told.RouterVersion{RouterID: router, Version: version},
			Routes:  []told.Route{{Dest: dest, Target: told.RouterTarget{Type: "drop"}}}}.Check())
	}
	const r1, r2 = "5e5e0c5e-0000-4000-8000-000000000001", "5e5e0c5e-0000-4000-8000-000000000002"
	for _, c := range []struct {
		set  told.RouteSet
		want []string
	}{
		{set(r1, 3, "fd00::/16"), []string{"add-route " + portA + " custom fd00::/16 drop"}},
		{set(r1, 3, "fd01::/16"), nil},
		{set(r1, 2, "fd01::/16"), nil},
		{set(r1, 4, "fd01::/16"), []string{"del-route " + portA + " custom fd00::/16 drop", "add-route " + portA + " custom fd01::/16 drop"}},
		{set(r2, 1, "fd02::/16"), []string{"del-route " + portA + " custom fd01::/16 drop", "add-route " + portA + " custom fd02::/16 drop"}},
	} {
		ignored := must(told.RouteSet{ID: told.RouterID{VNI: 8888, Kind: told.RouterKind{Type: "system"}}, Routes: []told.Route{{Dest: "0.0.0.0/0", Target: told.RouterTarget{Type: "drop"}}}}.Check())
		if err := st.SetRoutes(ctx, []told.RouteSet{c.set, ignored}); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, dp, c.want...)
	}
	for _, r := range st.Routes() {
		if r.ID.VNI == 8888 {
			t.Errorf("a RouterId no port needs is listed: %+v", r)
		}
	}
}

// upstream's merge_existing_ip_stack_with_request and prune.
func TestExternalIPMergeAndPrune(t *testing.T) {
	var e told.ExternalIPs
	step := func(b told.ExternalIPBody, want string, wantErr error) {
		t.Helper()
		next, err := e.Merge(b)
		if !errors.Is(err, wantErr) {
			t.Fatalf("merge %+v: %v, want %v", b, err, wantErr)
		}
		if err != nil {
			return
		}
		e = next
		if got := toldJSON(t, e); got != want {
			t.Errorf("merge %+v: %s, want %s", b, got, want)
		}
	}
	step(told.ExternalIPBody{Type: "ephemeral", Value: "192.0.2.10"}, `{"v4":{"ephemeral_ip":"192.0.2.10","floating_ips":[]}}`, nil)
	step(told.ExternalIPBody{Type: "ephemeral", Value: "192.0.2.10"}, `{"v4":{"ephemeral_ip":"192.0.2.10","floating_ips":[]}}`, nil)
	step(told.ExternalIPBody{Type: "ephemeral", Value: "192.0.2.11"}, "", told.ErrEphemeralAttached)
	step(told.ExternalIPBody{Type: "floating", Value: "2001:db8::1"}, `{"v4":{"ephemeral_ip":"192.0.2.10","floating_ips":[]},"v6":{"floating_ips":["2001:db8::1"]}}`, nil)
	e = e.Prune(told.ExternalIPBody{Type: "ephemeral", Value: "192.0.2.11"})
	e = e.Prune(told.ExternalIPBody{Type: "floating", Value: "2001:db8::1"})
	if got := toldJSON(t, e); got != `{"v4":{"ephemeral_ip":"192.0.2.10","floating_ips":[]},"v6":{"floating_ips":[]}}` {
		t.Errorf("pruned: %s", got)
	}
}

// Firewall rules of a VNI the sled has no port in are answered and not
// kept; a VMM's port is made with the rules told for its VNI after its
// registration or while it had its port, else with its registration's.
func TestFirewallRulesRemembered(t *testing.T) {
	ctx := context.Background()
	dirs := []string{t.TempDir()}
	reg := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	now := reg.Add(-time.Minute)
	clock := func() time.Time { return now }
	s := &sled{vmms: []told.VMM{vmm(t, reg, `[{"status":"enabled","direction":"inbound","targets":[],"action":"allow","priority":1},{"status":"enabled","direction":"inbound","targets":[],"action":"allow","priority":2}]`)}}
	dp := &toldtest.Recorder{}
	st := must(told.Open(told.Options{Dirs: dirs, Sled: s, DataPath: dp, Now: clock}))
	deny := told.FirewallRulesBody{VNI: 7777, Rules: []told.FirewallRule{{Status: "enabled", Direction: "inbound", Targets: []told.NIC{}, Action: "deny", Priority: 9}}}
	if err := st.SetFirewallRules(ctx, told.FirewallRulesBody{VNI: 4242, Rules: []told.FirewallRule{}}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetFirewallRules(ctx, deny); err != nil {
		t.Fatal(err)
	}
	if v := st.View(); len(v.Firewall) != 1 || v.Firewall[0].VNI != 7777 {
		t.Errorf("rules kept: %+v", v.Firewall)
	}
	calls := dp.Took()
	if len(calls) != 2 || !strings.HasPrefix(calls[0], "create "+portA+" rules=2 ") || calls[1] != "fw "+portA+" 1" {
		t.Errorf("the port made with its registration's rules, then given the VNI's: %q", calls)
	}
	remade := func(want string) {
		t.Helper()
		dp := &toldtest.Recorder{}
		again := must(told.Open(told.Options{Dirs: dirs, Sled: s, DataPath: dp, Now: clock}))
		if err := again.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if calls := dp.Took(); len(calls) != 1 || !strings.HasPrefix(calls[0], "create "+portA+" "+want+" ") {
			t.Errorf("made again: %q, want %s", calls, want)
		}
	}
	// The rules were told while the VMM's port was there (its clock said
	// before its registration): the port had them, and is made with them
	// again.
	remade("rules=1")
	now = reg.Add(time.Minute)
	if err := st.SetFirewallRules(ctx, deny); err != nil {
		t.Fatal(err)
	}
	remade("rules=1")
}

func toldJSON(t *testing.T, v any) string {
	t.Helper()
	return string(must(json.Marshal(v)))
}

// stuckPath is a data path whose SetV2P waits until release is closed.
type stuckPath struct {
	toldtest.Recorder
	release chan struct{}
}

func (s *stuckPath) SetV2P(ctx context.Context, m told.V2P) error {
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Changes are made one at a time, but a change waits for the one before
// only until its own deadline; readers never wait.
func TestChangeWaitsWithItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dp := &stuckPath{release: make(chan struct{})}
		st := must(told.Open(told.Options{Sled: &sled{}, DataPath: dp}))
		m := must(told.V2P{VirtualIP: "172.30.0.6", VirtualMAC: "A8:40:25:F0:00:02", PhysicalHostIP: "fd00:1122:3344:102::1", VNI: 7777}.Check())
		first := make(chan error, 1)
		go func() { first <- st.SetV2P(context.Background(), m) }()
		synctest.Wait()
		if got := st.V2P(); len(got) != 1 {
			t.Errorf("a reader during a change: %+v, want the mapping written", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := st.ClearV2P(ctx, m); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a change behind a stuck one: %v, want its deadline", err)
		}
		close(dp.release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if got := st.V2P(); len(got) != 1 {
			t.Errorf("the change that gave up changed the record: %+v", got)
		}
	})
}

// A data path that does not answer is given up at CallTimeout, whatever
// the caller's deadline: the change is written, and answered an error.
func TestDataPathCallsHaveADeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dp := &stuckPath{release: make(chan struct{})}
		st := must(told.Open(told.Options{Sled: &sled{}, DataPath: dp, CallTimeout: time.Minute}))
		m := must(told.V2P{VirtualIP: "172.30.0.6", VirtualMAC: "A8:40:25:F0:00:02", PhysicalHostIP: "fd00:1122:3344:102::1", VNI: 7777}.Check())
		start := time.Now()
		if err := st.SetV2P(context.Background(), m); !errors.Is(err, told.ErrDataPath) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a stuck data path: %v, want ErrDataPath and the deadline", err)
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Errorf("gave up after %s, want CallTimeout", waited)
		}
		if len(st.V2P()) != 1 {
			t.Error("the mapping is not in the record")
		}
	})
}

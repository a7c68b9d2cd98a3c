package linux_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/timesync/ntpzone/ntpzonetest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Addresses of TestNTPZonesSyncToAReference, in /64s no other test of
// this package uses, all in the rack's /56 that a boundary zone serves.
var (
	refAddr      = netip.MustParseAddr("fd00:1122:3344:1f9::1")
	boundaryAddr = "[fd00:1122:3344:1fa::21]:123"
	internalAddr = "[fd00:1122:3344:1fb::22]:123"
)

// ntpZone is NTP zone number i of kind kind at addr.
func ntpZone(i int, kind, addr string, servers ...string) zone.Spec {
	z := sledconfigtest.Crucible(i)
	z.ZoneType = sledconfig.ZoneType{Type: kind, Address: addr}
	if kind == "boundary_ntp" {
		z.ZoneType.NTPServers = servers
		z.ZoneType.DNSServers = []string{refAddr.String()}
	}
	return zone.SpecFor(&z)
}

// TestNTPZonesSyncToAReference runs a reference chronyd (local stratum 7,
// -x) on an address of a link of its own on the host, a boundary_ntp zone whose
// ntp_servers is that address, and an internal_ntp zone that the host
// points at the boundary zone with chrony.SetServers, all through the
// runtime's default NTP image with NTPNoClock: each zone's /timesync
// reaches sync: true (stratum 8, then 9), and chronyd runs in each zone's
// namespace. No clock is ever set, and all NTP traffic stays on this host.
func TestNTPZonesSyncToAReference(t *testing.T) {
	bins, err := chrony.Find()
	if err != nil {
		t.Skipf("needs chronyd and chronyc (scripts/setup installs them): %v", err)
	}
	e := newEnvWith(t, nil, func(o *linux.Options) { o.NTPNoClock = true })

	ref := ntpzonetest.StartReference(t, bins, e.tag, refAddr, 7)
	t.Logf("reference at %s:123: %s", refAddr, ref)

	boundary := ntpZone(0x1fa, "boundary_ntp", boundaryAddr, refAddr.String())
	internal := ntpZone(0x1fb, "internal_ntp", internalAddr)
	for _, s := range []zone.Spec{boundary, internal} {
		dir := chrony.SocketDir(e.tag, s.ID)
		t.Cleanup(func() { os.RemoveAll(dir) })
	}

	t0 := time.Now()
	e.ensure(boundary)
	tReady := time.Since(t0)
	ts, tookSync := waitSynced(t, boundary, 60*time.Second)
	t.Logf("boundary_ntp zone: ready after %v, /timesync sync: true %v later (%v from Ensure): %+v",
		tReady.Round(time.Millisecond), tookSync.Round(time.Millisecond), (tReady + tookSync).Round(time.Millisecond), ts)
	if ts.Stratum != 8 || ts.IPAddr != refAddr {
		t.Errorf("boundary zone follows %s at stratum %d, want %s at 8", ts.IPAddr, ts.Stratum, refAddr)
	}
	chronydIn(t, e, boundary)

	t0 = time.Now()
	e.ensure(internal)
	tReady = time.Since(t0)
	// Zone to zone goes through the host: zonenet lets the host forward
	// from each zone's host end (force_forwarding, Linux 6.17).
	for _, s := range []zone.Spec{boundary, internal} {
		hostEnd, _ := zonenet.LinkNames(e.tag, s.ID)
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + hostEnd + "/force_forwarding")
		if errors.Is(err, fs.ErrNotExist) {
			t.Skipf("zone-to-zone traffic needs per-link IPv6 forwarding (force_forwarding, Linux 6.17): %v", err)
		}
		if err != nil || strings.TrimSpace(string(b)) != "1" {
			t.Fatalf("%s forwards %q (%v), want 1", hostEnd, b, err)
		}
	}
	host, err := chrony.New(chrony.Config{Root: rootOf(e, internal), Kind: chrony.Internal, SocketDir: chrony.SocketDir(e.tag, internal.ID)}, chrony.Options{Binaries: bins})
	if err != nil {
		t.Fatal(err)
	}
	bAddr := netip.MustParseAddrPort(boundaryAddr).Addr()
	// Until the zone's chronyd has its socket, SetServers only writes the
	// file, which chronyd reads when it starts.
	for deadline := time.Now().Add(20 * time.Second); ; {
		err := host.SetServers(t.Context(), []netip.Addr{bAddr})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SetServers: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tSet := time.Since(t0)
	ts, tookSync = waitSynced(t, internal, 60*time.Second)
	t.Logf("internal_ntp zone: ready after %v, servers set after %v, /timesync sync: true %v later (%v from Ensure): %+v",
		tReady.Round(time.Millisecond), tSet.Round(time.Millisecond), tookSync.Round(time.Millisecond), (tSet + tookSync).Round(time.Millisecond), ts)
	if ts.Stratum != 9 || ts.IPAddr != bAddr {
		t.Errorf("internal zone follows %s at stratum %d, want %s at 9", ts.IPAddr, ts.Stratum, bAddr)
	}
	chronydIn(t, e, internal)

	// Destroying an NTP zone removes its socket directory.
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, s := range []zone.Spec{internal, boundary} {
		if _, err := os.Stat(chrony.SocketDir(e.tag, s.ID)); err != nil {
			t.Errorf("%s: socket directory: %v", s.Name, err)
		}
		if err := e.rt.Destroy(ctx, s.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(chrony.SocketDir(e.tag, s.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: socket directory left after Destroy: %v", s.Name, err)
		}
	}
}

// waitSynced polls the zone's GET /timesync until it says sync: true, for
// at most limit; it returns the answer and how long that took.
func waitSynced(t *testing.T, s zone.Spec, limit time.Duration) (timesync.TimeSync, time.Duration) {
	t.Helper()
	addr, _ := s.Config.ServiceAddr()
	url := "http://" + netip.AddrPortFrom(addr.Addr(), timesync.AdminPort).String() + "/timesync"
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	start := time.Now()
	last := ""
	for time.Since(start) < limit {
		resp, err := client.Get(url)
		if err != nil {
			last = err.Error()
		} else {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			last = resp.Status + " " + string(b)
			var ts timesync.TimeSync
			if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &ts) == nil && ts.Sync {
				return ts, time.Since(start)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s: GET %s not sync: true after %v; last: %s", s.Name, url, limit, last)
	return timesync.TimeSync{}, 0
}

// chronydIn checks that a chronyd of the zone's root runs in the zone's
// network namespace, and with -x.
func chronydIn(t *testing.T, e *env, s zone.Spec) {
	t.Helper()
	conf := filepath.Join(rootOf(e, s), "chrony", "chrony.conf")
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if comm, _ := os.ReadFile(p + "/comm"); strings.TrimSpace(string(comm)) != "chronyd" {
			continue
		}
		cmdline, _ := os.ReadFile(p + "/cmdline")
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !containsArg(args, conf) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(p))
		in, err := zonenet.ProcessIn(pid, e.prefix+s.Name)
		if err != nil || !in {
			t.Errorf("%s: chronyd %d is not in the zone's namespace (%v)", s.Name, pid, err)
		}
		if !containsArg(args, "-x") {
			t.Errorf("%s: chronyd %d may set the clock: %q", s.Name, pid, args)
		}
		return
	}
	t.Errorf("%s: no chronyd runs with %s", s.Name, conf)
}

func containsArg(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}

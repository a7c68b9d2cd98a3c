package bench

// The VPC benchmark: two stand-in guests on two sleds (network namespaces
// joined by a veth pair with a 9000-byte MTU, as the underlay) exchange a
// TCP stream and UDP request/response pairs, three ways in one run: through
// the sleds' VPC data paths (Geneve between them), through the kernel's
// VXLAN between the same sleds (a bridge on each), and over a plain veth
// pair between the guests (the floor).

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// VPCOptions size the VPC benchmark.
type VPCOptions struct {
	// Stream is how long each path's TCP stream runs (5s).
	Stream time.Duration
	// Requests is how many UDP request/response pairs each path times
	// (2000).
	Requests int
	// CPUProfile, if set, is where the CPU profile taken during the VPC
	// way's stream is written (pprof's format).
	CPUProfile string
	Progress   io.Writer
}

// VPCPath is one path's figures.
type VPCPath struct {
	Path string `json:"path"`
	// StreamGbps is one TCP stream's throughput, Gbit/s.
	StreamGbps float64 `json:"stream_gbps"`
	// CPUSecondsPerGbit is this process's CPU (the data path, and the
	// guests' sockets, in kernel and user time) per Gbit carried.
	CPUSecondsPerGbit float64 `json:"cpu_seconds_per_gbit"`
	// RoundTrip is a 64-byte UDP request and its answer.
	RoundTrip Latency `json:"udp_round_trip"`
	// CPU is where the CPU went during the stream, from a profile of the
	// process (the VPC way only: its data paths run in the process).
	CPU []CPUPart `json:"cpu_breakdown,omitempty"`
}

// VPCResult is what `bench vpc` prints.
type VPCResult struct {
	Machine ZonesMachine `json:"machine"`
	Paths   []VPCPath    `json:"paths"`
}

// VPC runs the VPC benchmark (root: it makes network namespaces). The three
// ways are made at once; each carries its stream in turn, and then the round
// trips go in rounds that take each way in turn (requests/vpcRounds each),
// so that a load that comes and goes on a shared machine weighs on every way
// alike.
func VPC(ctx context.Context, opts VPCOptions) (*VPCResult, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("bench vpc makes network namespaces and links: it needs root")
	}
	opts.Stream = cmp.Or(opts.Stream, 5*time.Second)
	opts.Requests = cmp.Or(opts.Requests, 2000)
	var profOut *os.File
	if opts.CPUProfile != "" {
		f, err := os.Create(opts.CPUProfile)
		if err != nil {
			return nil, fmt.Errorf("the CPU profile's file: %w", err)
		}
		defer f.Close()
		profOut = f
	}
	res := &VPCResult{Machine: machine()}
	names := []string{"vpc", "kernel-vxlan", "veth"}
	var guests []*vpcGuests
	defer func() {
		for _, g := range guests {
			g.close()
		}
	}()
	for _, path := range names {
		progress(opts.Progress, "bench vpc: %s: setting up", path)
		t, err := newVPCTopology(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		g, err := openGuests(ctx, t)
		if err != nil {
			t.close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		guests = append(guests, g)
	}
	for i, g := range guests {
		progress(opts.Progress, "bench vpc: %s: %s of one TCP stream", names[i], opts.Stream)
		var prof *cpuProfile
		if names[i] == "vpc" {
			var w io.Writer
			if profOut != nil {
				w = profOut
			}
			var err error
			if prof, err = startCPUProfile(w); err != nil {
				return nil, err
			}
		}
		p, err := g.stream(ctx, opts.Stream)
		if prof != nil {
			pr, perr := prof.stop()
			if err == nil && perr != nil {
				err = perr
			}
			if pr != nil {
				p.CPU = cpuBreakdown(pr, p.CPUSecondsPerGbit)
				progress(opts.Progress, "bench vpc: %s: CPU: %s", names[i], cpuSummary(p.CPU))
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[i], err)
		}
		p.Path = names[i]
		res.Paths = append(res.Paths, p)
	}
	rounds := min(vpcRounds, opts.Requests)
	progress(opts.Progress, "bench vpc: %d UDP round trips each way, in %d rounds taking each way in turn", opts.Requests, rounds)
	ways := make([]func() (time.Duration, error), len(guests))
	for i, g := range guests {
		ways[i] = g.roundTrip
	}
	rtts := interleave(ctx, ways, opts.Requests, rounds)
	for i := range res.Paths {
		res.Paths[i].RoundTrip = summarize(rtts[i])
	}
	return res, ctx.Err()
}

// vpcRounds is how many rounds the round trips are timed in.
const vpcRounds = 10

// vpcTopology is one path's namespaces and, for the VPC path, its data
// paths.
type vpcTopology struct {
	namespaces []string
	gA, gB     string // the guests' namespace paths
	daemons    []*vpcd.Daemon
}

func (t *vpcTopology) close() {
	for _, d := range t.daemons {
		d.Close()
	}
	for _, ns := range t.namespaces {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

const (
	vpcGuestA = "172.30.0.5"
	vpcGuestB = "172.30.0.6"
	vpcMACA   = "a8:40:25:f0:00:01"
	vpcMACB   = "a8:40:25:f0:00:02"
)

// newVPCTopology makes the namespaces of one path.
func newVPCTopology(path string) (t *vpcTopology, err error) {
	b := make([]byte, 3)
	rand.Read(b)
	tag := "zb" + hex.EncodeToString(b)
	t = &vpcTopology{}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	ns := func(n string) (string, error) {
		name := tag + "-" + n
		if err := ipCmd("netns", "add", name); err != nil {
			return "", err
		}
		t.namespaces = append(t.namespaces, name)
		return name, ipCmd("-n", name, "link", "set", "lo", "up")
	}
	ga, err := ns("gA")
	if err != nil {
		return t, err
	}
	gb, err := ns("gB")
	if err != nil {
		return t, err
	}
	t.gA, t.gB = "/run/netns/"+ga, "/run/netns/"+gb
	if path == "veth" {
		cmds := [][]string{
			{"link", "add", "eth0", "netns", ga, "address", vpcMACA, "type", "veth", "peer", "name", "eth0", "netns", gb, "address", vpcMACB},
			{"-n", ga, "addr", "add", vpcGuestA + "/22", "dev", "eth0"},
			{"-n", gb, "addr", "add", vpcGuestB + "/22", "dev", "eth0"},
			{"-n", ga, "link", "set", "eth0", "up"},
			{"-n", gb, "link", "set", "eth0", "up"},
		}
		for _, c := range cmds {
			if err := ipCmd(c...); err != nil {
				return t, err
			}
		}
		return t, t.offloadsOff()
	}
	sa, err := ns("sledA")
	if err != nil {
		return t, err
	}
	sb, err := ns("sledB")
	if err != nil {
		return t, err
	}
	ulA, ulB := "fd00:1122:3344:1fd::1", "fd00:1122:3344:1fe::1"
	cmds := [][]string{
		{"link", "add", "ul0", "netns", sa, "type", "veth", "peer", "name", "ul0", "netns", sb},
		{"-n", sa, "link", "set", "ul0", "mtu", "9000", "up"},
		{"-n", sb, "link", "set", "ul0", "mtu", "9000", "up"},
		{"-n", sa, "addr", "add", ulA + "/64", "dev", "ul0", "nodad"},
		{"-n", sb, "addr", "add", ulB + "/64", "dev", "ul0", "nodad"},
		{"-n", sa, "route", "add", "fd00:1122:3344::/48", "dev", "ul0"},
		{"-n", sb, "route", "add", "fd00:1122:3344::/48", "dev", "ul0"},
		{"link", "add", "vnA", "netns", sa, "type", "veth", "peer", "name", "eth0", "netns", ga, "address", vpcMACA},
		{"link", "add", "vnB", "netns", sb, "type", "veth", "peer", "name", "eth0", "netns", gb, "address", vpcMACB},
		{"-n", sa, "link", "set", "vnA", "up"},
		{"-n", sb, "link", "set", "vnB", "up"},
		{"-n", ga, "link", "set", "eth0", "up"},
		{"-n", gb, "link", "set", "eth0", "up"},
	}
	if path == "vpc" {
		// As OPTE's DHCP leaves a guest: its address /32, the gateway
		// on the link, the default route through it.
		for _, g := range []struct{ ns, ip string }{{ga, vpcGuestA}, {gb, vpcGuestB}} {
			cmds = append(cmds,
				[]string{"-n", g.ns, "addr", "add", g.ip + "/32", "dev", "eth0"},
				[]string{"-n", g.ns, "route", "add", "172.30.0.1", "dev", "eth0"},
				[]string{"-n", g.ns, "route", "add", "default", "via", "172.30.0.1"})
		}
	} else {
		// The kernel's VXLAN: a bridge on each sled of the guest's host
		// end and a VXLAN device to the other sled.
		for _, s := range []struct{ ns, host, local, remote string }{{sa, "vnA", ulA, ulB}, {sb, "vnB", ulB, ulA}} {
			cmds = append(cmds,
				[]string{"-n", s.ns, "link", "add", "vx0", "type", "vxlan", "id", "7777", "dstport", "4789", "local", s.local, "remote", s.remote, "dev", "ul0"},
				[]string{"-n", s.ns, "link", "add", "br0", "type", "bridge"},
				[]string{"-n", s.ns, "link", "set", "vx0", "master", "br0", "up"},
				[]string{"-n", s.ns, "link", "set", s.host, "master", "br0"},
				[]string{"-n", s.ns, "link", "set", "br0", "up"})
		}
		cmds = append(cmds,
			[]string{"-n", ga, "addr", "add", vpcGuestA + "/22", "dev", "eth0"},
			[]string{"-n", gb, "addr", "add", vpcGuestB + "/22", "dev", "eth0"})
	}
	for _, c := range cmds {
		if err := ipCmd(c...); err != nil {
			return t, err
		}
	}
	if err := t.offloadsOff(); err != nil {
		return t, err
	}
	if path != "vpc" {
		return t, nil
	}
	for _, s := range []struct{ ns, ul, link, mac, ip string }{{sa, ulA, "vnA", vpcMACA, vpcGuestA}, {sb, ulB, "vnB", vpcMACB, vpcGuestB}} {
		for _, c := range [][]string{{"netns", "exec", s.ns, "sysctl", "-qw", "net.ipv6.conf." + s.link + ".disable_ipv6=1"}} {
			if err := ipCmd(c...); err != nil {
				return t, err
			}
		}
		d, err := vpcd.Start(vpcd.Options{Underlay: netip.MustParseAddr(s.ul), Netns: "/run/netns/" + s.ns})
		if err != nil {
			return t, err
		}
		t.daemons = append(t.daemons, d)
		if err := d.EnsurePort(s.link, vpcSpec(s.link, s.mac, s.ip)); err != nil {
			return t, err
		}
		for _, m := range []vpcd.V2P{
			{VirtualIP: netip.MustParseAddr(vpcGuestA), VirtualMAC: rules.MustMAC(vpcMACA), PhysicalHostIP: netip.MustParseAddr(ulA), VNI: 7777},
			{VirtualIP: netip.MustParseAddr(vpcGuestB), VirtualMAC: rules.MustMAC(vpcMACB), PhysicalHostIP: netip.MustParseAddr(ulB), VNI: 7777},
		} {
			if err := d.SetV2P(m); err != nil {
				return t, err
			}
		}
	}
	return t, nil
}

// vpcSpec is a guest's port in VPC 7777: Nexus's default rule for traffic
// inside the VPC, and the system router's route for its subnet.
func vpcSpec(link, mac, ip string) vpcd.PortSpec {
	subnet := netip.MustParsePrefix("172.30.0.0/22")
	var rs []rules.FirewallRule
	json.Unmarshal([]byte(`[{"status":"enabled","direction":"inbound","targets":[],"filter_hosts":[{"type":"vpc","value":7777}],"action":"allow","priority":65534}]`), &rs)
	return vpcd.PortSpec{Link: vpcd.Link{Name: link}, VNI: 7777, MAC: rules.MustMAC(mac),
		IPv4: &vpcd.IPSpec{Private: netip.MustParseAddr(ip), Subnet: subnet}, Firewall: rs,
		System: []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}}}
}

// offloadsOff makes the guests send whole frames, as a QEMU tap without a
// virtio-net header does (the data path reads them as they come).
func (t *vpcTopology) offloadsOff() error {
	for _, g := range []string{t.gA, t.gB} {
		if err := netio.DisableOffloads(g, "eth0"); err != nil {
			return err
		}
	}
	return nil
}

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

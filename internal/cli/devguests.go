package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
)

// The rack's guests: one test guest on each sled, on one VPC. Dev plays
// Nexus: it registers each guest's VMM with its NIC and the VPC's firewall
// rules, runs it, and pushes to both sleds the VPC's firewall rules, its
// system router's routes and both guests' v2p mappings, as Nexus pushes
// them. Each guest takes its address by DHCP from its port's gateway; then
// guest A pings guest B through both sleds' data paths and Geneve across
// the rack's bridge.

const (
	// devVNI, devVPCSubnet and devGateway are the guests' VPC: a guest VNI,
	// Nexus's default VPC subnet and its gateway, its first address.
	devVNI       = 7777
	devVPCSubnet = "172.30.0.0/22"
	devGateway   = "172.30.0.1"
	// devPingTries is how many times guest A pings guest B before dev says
	// it failed (each is three echoes, a second apart).
	devPingTries = 3
)

// devGuest is one of the rack's guests: its sled and its VMM and NIC.
type devGuest struct {
	name                   string // its sled's: A or B
	c                      *client.Client
	url                    string // --url of its sled's agent, "" for sled A's default
	image                  string
	vmm, instance, nic, ip string
	mac                    string // upper case, as Nexus writes it
	underlay               string // its sled's
	// service is its VMM's service (propolis-server's API), once known.
	service string
}

// newDevGuest is a guest of the sled of client c, whose underlay address
// is underlay, with address ip, booting image.
func newDevGuest(name string, c *client.Client, url, underlay, ip, image string) (*devGuest, error) {
	mac, err := randomMAC()
	if err != nil {
		return nil, err
	}
	return &devGuest{name: name, c: c, url: url, image: image, underlay: underlay, ip: ip, mac: strings.ToUpper(mac),
		vmm: uuid.NewString(), instance: uuid.NewString(), nic: uuid.NewString()}, nil
}

// nicJSON is the guest's NIC as Nexus writes a NetworkInterface.
func (g *devGuest) nicJSON() string {
	return vpcNIC(g.nic, g.instance, g.ip, devVPCSubnet, g.mac, devVNI)
}

// devVPCRules are a default VPC's firewall rules, as Nexus resolves them
// for the guests gs.
func devVPCRules(gs ...*devGuest) string {
	var nics []string
	for _, g := range gs {
		nics = append(nics, g.nicJSON())
	}
	return defaultVPCRules(devVNI, nics...)
}

// register registers the guest's VMM on its sled as Nexus does, with its
// NIC, the VPC's firewall rules (a JSON array) and DHCP settings, and asks
// it to run. Its VMM's address is drawn from its sled's /64.
func (g *devGuest) register(ctx context.Context, rules string) error {
	inv, err := g.c.AgentInventory(ctx)
	if err != nil {
		return err
	}
	sled, err := sledAddr(inv.SledAgentAddress)
	if err != nil {
		return err
	}
	addr, err := propolisAddr("", sled)
	if err != nil {
		return err
	}
	body := ensurebody.Body(ensurebody.Instance{InstanceID: g.instance, PropolisAddr: addr.String(), Hostname: "guest-" + strings.ToLower(g.name),
		NICID: g.nic, MAC: g.mac, NICIP: g.ip, NICSubnet: devVPCSubnet, VNI: devVNI,
		ProjectID: uuid.NewString(), SiloID: uuid.NewString(), TimeUpdated: time.Now()},
		ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: devGuestMemoryMiB, NICID: g.nic, Image: g.image}), nil)
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		return err
	}
	lc := m["local_config"].(map[string]any)
	lc["firewall_rules"] = json.RawMessage(rules)
	lc["dhcp_config"] = json.RawMessage(`{"dns_servers":[],"host_domain":null,"search_domains":[]}`)
	if body, err = json.Marshal(m); err != nil {
		return err
	}
	if _, err := g.c.RegisterVMM(ctx, g.vmm, body); err != nil {
		return fmt.Errorf("registering guest %s's VMM: %w", g.name, err)
	}
	if _, err := g.c.PutVMMState(ctx, g.vmm, "running"); err != nil {
		return fmt.Errorf("starting guest %s's VMM: %w", g.name, err)
	}
	return nil
}

// pushDevVPC pushes to every sled of gs what Nexus pushes for their VPC: its
// firewall rules, its system router's routes (the subnet) with an empty
// custom router for the subnet, and every guest's v2p mapping.
func pushDevVPC(ctx context.Context, rules string, gs ...*devGuest) error {
	vpc, router := uuid.NewString(), uuid.NewString()
	fw := fmt.Sprintf(`{"vni":%d,"rules":%s}`, devVNI, rules)
	routes := fmt.Sprintf(`[{"id":{"vni":%[1]d,"kind":{"type":"system"}},"version":{"router_id":%[2]q,"version":1},"routes":[{"dest":%[3]q,"target":{"type":"vpc_subnet","value":%[3]q}}]},`+
		`{"id":{"vni":%[1]d,"kind":{"type":"custom","subnet":%[3]q}},"version":null,"routes":[]}]`, devVNI, router, devVPCSubnet)
	for _, s := range gs {
		if err := s.c.SetVPCFirewallRules(ctx, vpc, []byte(fw)); err != nil {
			return fmt.Errorf("sled %s: the VPC's firewall rules: %w", s.name, err)
		}
		if err := s.c.SetVPCRoutes(ctx, []byte(routes)); err != nil {
			return fmt.Errorf("sled %s: the VPC's routes: %w", s.name, err)
		}
		for _, g := range gs {
			if err := s.c.SetV2P(ctx, []byte(vpcV2P(g.ip, g.mac, g.underlay, devVNI))); err != nil {
				return fmt.Errorf("sled %s: guest %s's v2p mapping: %w", s.name, g.name, err)
			}
		}
	}
	return nil
}

// guests is what a Linux dev does once sled A's zones first run: it waits
// for sled B and both data paths, registers and runs the guests, pushes
// their VPC, waits for each guest's lease, has guest A ping guest B, and
// says how to reach each sled and guest.
func (d *devLinux) guests(ctx context.Context, out io.Writer, ca *client.Client) error {
	r := d.rack
	if err := r.waitSleds(ctx); err != nil {
		return err
	}
	urlB := "http://" + r.b.Listen
	a, err := newDevGuest("A", ca, "", d.cfg.UnderlayIP, "172.30.0.5", d.image)
	if err != nil {
		return err
	}
	b, err := newDevGuest("B", r.clientB(), urlB, r.b.UnderlayIP, "172.30.0.6", r.imageB)
	if err != nil {
		return err
	}
	gs := []*devGuest{a, b}
	rules := devVPCRules(gs...)
	start := time.Now()
	for _, g := range gs {
		if err := g.register(ctx, rules); err != nil {
			return err
		}
		fmt.Fprintf(out, "guest %s: VMM %s on sled %s registered as Nexus does (NIC %s, %s in %s, VNI %d) and asked to run: booting the test guest (%d MiB) through OVMF\n",
			g.name, g.vmm, g.name, g.mac, g.ip, devVPCSubnet, devVNI, devGuestMemoryMiB)
	}
	if err := pushDevVPC(ctx, rules, gs...); err != nil {
		return err
	}
	fmt.Fprintln(out, "pushed to both sleds, as Nexus does: the VPC's firewall rules, its routes, both guests' v2p mappings")
	for _, g := range gs {
		line, err := d.waitConsole(ctx, g, testguest.NetPrefix+g.ip+" router="+devGateway, "guest "+g.name+"'s lease")
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "guest %s's console after %s: %s\n", g.name, time.Since(start).Round(100*time.Millisecond), line)
	}
	if err := d.ping(ctx, out, a, b); err != nil {
		return err
	}
	fmt.Fprintf(out, "attach to them (Ctrl-] leaves; try: ping %s):\n", b.ip)
	for _, g := range gs {
		fmt.Fprintf(out, "  ./sled-agent %svmm console %s\n", urlFlag(g.url), g.vmm)
	}
	fmt.Fprintln(out, "each sled's VPC data path, as opteadm shows OPTE's:")
	for _, s := range []struct {
		name string
		cfg  agent.Config
	}{{"A", d.cfg}, {"B", r.b}} {
		fmt.Fprintf(out, "  sudo ./sled-agent vpc --socket %s   # sled %s\n", agent.VPCSocket(s.cfg), s.name)
	}
	fmt.Fprintf(out, "sled B (%s, namespace %s; no zones of a sled config, its time sync not checked) answers as sled A does, with --url:\n", r.b.UnderlayIP, r.b.Netns)
	fmt.Fprintf(out, "  ./sled-agent %svmm list\n  ./sled-agent %sinventory\n", urlFlag(urlB), urlFlag(urlB))
	return nil
}

// urlFlag is the --url flag for an agent at url, "" for the default.
func urlFlag(url string) string {
	if url == "" {
		return ""
	}
	return "--url " + url + " "
}

// ping has guest a ping guest b on its console, up to devPingTries times,
// and prints the answer.
func (d *devLinux) ping(ctx context.Context, out io.Writer, a, b *devGuest) error {
	want := testguest.PingPrefix + b.ip + " "
	for try := 1; ; try++ {
		before, err := d.consoleOutput(ctx, a)
		if err != nil {
			return err
		}
		if err := a.send(ctx, testguest.CmdPing+b.ip); err != nil {
			return err
		}
		line, err := d.waitConsoleAfter(ctx, a, want, "guest A's ping of guest B", len(before))
		if err != nil {
			return err
		}
		if strings.HasPrefix(line, want+"ok ") || try == devPingTries {
			fmt.Fprintf(out, "guest A pinged guest B (%s) across the sleds: %s\n", b.ip, line)
			return nil
		}
		fmt.Fprintf(out, "guest A pinged guest B (%s), try %d of %d: %s\n", b.ip, try, devPingTries, line)
	}
}

// send types line on the guest's console.
func (g *devGuest) send(ctx context.Context, line string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := propolisapi.NewClient(g.service).SerialConnect(ctx, propolisapi.SerialFromStart(0))
	if err != nil {
		return fmt.Errorf("guest %s's console: %w", g.name, err)
	}
	defer c.Close()
	return c.WriteInput(ctx, []byte(line+"\n"))
}

// consoleOutput is the guest's console's output from its start.
func (d *devLinux) consoleOutput(ctx context.Context, g *devGuest) ([]byte, error) {
	if g.service == "" {
		v, err := findVMM(ctx, g.c, g.vmm)
		if err != nil {
			return nil, err
		}
		g.service = serviceAddr(v)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	data, _, err := propolisapi.NewClient(g.service).SerialHistory(rctx, propolisapi.SerialFromStart(0), 1<<20)
	return data, err
}

// waitConsole waits for a complete line of the guest's console that holds
// want, and returns it from want on; what is what it waits for, for
// progress lines.
func (d *devLinux) waitConsole(ctx context.Context, g *devGuest, want, what string) (string, error) {
	return d.waitConsoleAfter(ctx, g, want, what, 0)
}

// waitConsoleAfter is waitConsole for a line after the first from bytes of
// the console's output.
func (d *devLinux) waitConsoleAfter(ctx context.Context, g *devGuest, want, what string, from int) (string, error) {
	start := time.Now()
	next := start.Add(10 * time.Second)
	var seen []byte
	for {
		data, err := d.consoleOutput(ctx, g)
		if err == nil {
			seen = data
			if from <= len(data) {
				if i := bytes.Index(data[from:], []byte(want)); i >= 0 {
					rest := data[from+i:]
					if j := bytes.IndexAny(rest, "\r\n"); j >= 0 {
						return string(rest[:j]), nil
					}
				}
			}
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if time.Since(start) > devGuestWait {
			v, _ := findVMM(ctx, g.c, g.vmm)
			return "", fmt.Errorf("guest %s's console did not show %q within %s (VMM %s %s); it shows: %q",
				g.name, want, devGuestWait, g.vmm, vmmState(v), lastLines(seen, 5))
		}
		if time.Now().After(next) {
			fmt.Fprintf(d.progress, "dev: waiting for %s: %s (%s)\n", what, time.Since(start).Round(time.Second), vmmWaitWord(ctx, g.c, g.vmm))
			next = next.Add(10 * time.Second)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

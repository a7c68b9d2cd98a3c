package crashtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// Ports in the crash test: the agent runs with its VPC data path
// (--vpc-data-path), vpcd, a service of its own that outlives the agent.
// The nexus zone's NIC and each running VMM's NIC are its ports. After
// every kill or reboot the test requires that the data path holds exactly
// those ports, each attached to its link and holding the one firewall rule
// the sled was told for it (the services VPC's, pushed once as Nexus does;
// the instance's, from its registration), and that its one process holds
// its packet sockets per port and one Geneve socket: no stray port, socket or
// rule, and none missing. A share of the kills kill the data path too:
// runsv starts it again while the agent is away, empty, and the restarted
// agent gives it everything again.

const (
	// servicesVPC is the services VPC's id (omicron's SERVICES_VPC_ID).
	servicesVPC = "001de000-074c-4000-8000-000000000000"
	// serviceRulePort and instanceRulePort are the ports the services'
	// and the instances' one inbound rule allows, by which each port's
	// rule is recognised.
	serviceRulePort  = "4789"
	instanceRulePort = "22"
)

// pushServiceRules tells the sled the services VPC's firewall rules, as
// Nexus does: one inbound rule, for the nexus zone's NIC.
func (r *run) pushServiceRules(ctx context.Context) error {
	var targets []any
	for _, z := range r.zones {
		if z.ZoneType.NIC != nil {
			targets = append(targets, z.ZoneType.NIC)
		}
	}
	body, err := json.Marshal(map[string]any{"vni": 100, "rules": []any{map[string]any{
		"status": "enabled", "direction": "inbound", "targets": targets, "filter_protocols": []any{map[string]any{"type": "udp"}},
		"filter_ports": []any{serviceRulePort}, "action": "allow", "priority": 100}}})
	if err != nil {
		return err
	}
	return r.vmmCall(ctx, http.MethodPut, "/vpc/"+servicesVPC+"/firewall/rules", string(body))
}

// portMismatch describes the first difference between the ports wanted
// and what the data path holds; "" when there is none.
func (r *run) portMismatch(ctx context.Context) string {
	want := map[string]string{} // MAC → the port its rule allows
	for _, z := range r.zones {
		if z.ZoneType.NIC != nil {
			want[strings.ToUpper(z.ZoneType.NIC.MAC)] = serviceRulePort
		}
	}
	for _, id := range r.wantedVMMZones() {
		want[r.vmms[id].mac] = instanceRulePort
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st, err := vpcd.NewClient(agent.VPCSocket(r.cfg)).State(cctx)
	cancel()
	if err != nil {
		return "data path: " + err.Error()
	}
	for _, p := range st.Ports {
		mac := p.Spec.MAC.String()
		port, ok := want[mac]
		switch {
		case !ok:
			return fmt.Sprintf("data path: stray port %s (%s, %s)", p.Name, mac, p.Status)
		case p.Status != "attached":
			return fmt.Sprintf("data path: port %s is %s", p.Name, p.Status)
		case len(p.Inbound) != 1 || !strings.Contains(p.Inbound[0], "ports ["+port+"]"):
			return fmt.Sprintf("data path: port %s holds inbound rules %q, want the one allowing port %s", p.Name, p.Inbound, port)
		}
		delete(want, mac)
	}
	if len(want) > 0 {
		return fmt.Sprintf("data path: no port for the NICs %v", want)
	}
	return r.socketMismatch(len(st.Ports))
}

// socketMismatch says what is wrong with the data path's processes and
// sockets, given how many ports it holds: "" when one process holds a
// port's packet sockets (netio.PacketSocketsPerPort: one reads, one
// writes) per port and the Geneve sockets: one UDP over IPv6 that
// receives, one raw that sends.
func (r *run) socketMismatch(ports int) string {
	procs, err := r.dataPathProcesses()
	if err != nil {
		return "data path: " + err.Error()
	}
	if len(procs) != 1 {
		return fmt.Sprintf("data path: %d processes %v, want one", len(procs), procs)
	}
	n := sockets(procs[0])
	if n["PACKET"] != netio.PacketSocketsPerPort*ports || n["UDPv6"] != 1 || n["RAWv6"] != 1 {
		return fmt.Sprintf("data path: its sockets %v, want %d PACKET sockets for each of its %d ports, one UDPv6 and one RAWv6 (Geneve in and out)", n, netio.PacketSocketsPerPort, ports)
	}
	return ""
}

// dataPathProcesses are the live processes of the data path's service:
// those that carry its mark (runsv carries none).
func (r *run) dataPathProcesses() ([]int, error) {
	dir := agent.VPCServiceDir(r.cfg)
	marked, err := supervise.ListMarked(r.runDir)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, p := range marked {
		if p.Dir == dir {
			out = append(out, p.PID)
		}
	}
	return out, nil
}

// sockets counts process pid's sockets by protocol, as the kernel names
// them (PACKET, UDPv6, UNIX, NETLINK, …).
func sockets(pid int) map[string]int {
	out := map[string]int{}
	fds := filepath.Join("/proc", fmt.Sprint(pid), "fd")
	ents, _ := os.ReadDir(fds)
	buf := make([]byte, 64)
	for _, e := range ents {
		n, err := unix.Getxattr(filepath.Join(fds, e.Name()), "system.sockprotoname", buf)
		if err == nil {
			out[string(bytes.TrimRight(buf[:n], "\x00"))]++
		}
	}
	return out
}

// killDataPath SIGKILLs the data path's process, as a crash of it would.
func (r *run) killDataPath() error {
	procs, err := r.dataPathProcesses()
	if err != nil {
		return err
	}
	if len(procs) != 1 {
		return fmt.Errorf("killing the data path: %d processes %v, want one", len(procs), procs)
	}
	return syscall.Kill(procs[0], syscall.SIGKILL)
}

package crashtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// VMMs in the crash test: real guests (QEMU under TCG, their disk a blob, so
// the firmware runs and waits in its boot manager) are registered and run,
// stopped and deleted between kills, so that kills land while a guest
// starts, stops or is torn down. After every restart the test requires that
// every VMM still registered is in the state last asked of it (running, or
// destroyed after a stop) with exactly one QEMU while it runs and none
// after; and that nothing is left of a VMM that was deleted: no VMM, no
// zone, no QEMU.

// maxVMMs bounds the VMMs registered at once (each guest has 256 MiB).
const maxVMMs = 2

// ctVMM is a VMM the crash test made.
type ctVMM struct {
	id, addr string
	// want is the state it must reach: running, or destroyed once stopped
	// (or failed, once the agent said a kill failed it).
	want string
	// deleting: a DELETE was sent, which a kill may have cut short; after
	// a restart it is sent again, and the VMM must be gone.
	deleting bool
	// rebooted: a reboot took its guest down. From then on it may be
	// failed (or, if it was stopped, destroyed) with nothing of it
	// running, or gone (the agent forgot it: 404); never running again,
	// nor half-made. counted: it is in vmmsRebooted.
	rebooted, counted bool
	// nic and mac are its NIC's, its own: its port on the data path is
	// found by the MAC.
	nic, mac string
}

// vmmBody is v's registration: the test's guest, with a NIC of its own
// (an address of its own in Nexus's default subnet) and one firewall rule
// of the instance's, which its port must hold (ports.go).
func (r *run) vmmBody(v *ctVMM) ([]byte, error) {
	in := ensurebody.Instance{InstanceID: uuid.NewString(), PropolisAddr: v.addr, Hostname: "vm0", NICID: v.nic, MAC: v.mac,
		NICIP: fmt.Sprintf("172.30.1.%d", r.vmmSeq%250+1), NICSubnet: "172.30.0.0/22",
		ProjectID: "11111111-2222-3333-4444-555555555555", SiloID: "66666666-7777-8888-9999-000000000000"}
	spec := ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: vmmtest.MemoryMiB, NICID: v.nic, ImageBlob: []byte{0, 0, 0, 0}})
	var b map[string]any
	if err := json.Unmarshal(ensurebody.Body(in, spec, nil), &b); err != nil {
		return nil, err
	}
	lc := b["local_config"].(map[string]any)
	lc["firewall_rules"] = []any{map[string]any{"status": "enabled", "direction": "inbound", "targets": lc["nics"],
		"filter_protocols": []any{map[string]any{"type": "tcp"}}, "filter_ports": []any{instanceRulePort}, "action": "allow", "priority": 65534}}
	return json.Marshal(b)
}

// vmmMutate does a VMM action before the kill, or none; it returns what it
// did ("" for nothing).
func (r *run) vmmMutate(ctx context.Context) (string, error) {
	var running, any []*ctVMM
	for _, v := range r.vmms {
		if v.deleting {
			continue
		}
		any = append(any, v)
		if v.want == vmm.StateRunning && !v.rebooted {
			running = append(running, v)
		}
	}
	switch r.rnd.IntN(4) {
	case 0:
		if len(any) < maxVMMs {
			return "run a VMM", r.runVMM(ctx)
		}
	case 1:
		if len(running) > 0 {
			v := running[r.rnd.IntN(len(running))]
			v.want = vmm.StateDestroyed
			return "stop a VMM", r.vmmCall(ctx, http.MethodPut, "/vmms/"+v.id+"/state", `{"state":{"type":"stopped"}}`)
		}
	case 2:
		if len(any) > 0 {
			v := any[r.rnd.IntN(len(any))]
			v.deleting = true
			// DELETE answers once the zone is torn down: the kill is
			// meant to land meanwhile, so nothing waits for it here.
			go r.vmmCall(context.WithoutCancel(ctx), http.MethodDelete, "/vmms/"+v.id, "")
			return "delete a VMM", nil
		}
	}
	return "", nil
}

// runVMM registers a new VMM and asks it to run.
func (r *run) runVMM(ctx context.Context) error {
	r.vmmSeq++
	// In the sled's /64, as the zones (the subnet rule), apart from them.
	v := &ctVMM{id: uuid.NewString(), addr: fmt.Sprintf("[%s:1:%x]:12400", r.addrs("1cf"), r.vmmSeq+0x10), want: vmm.StateRunning,
		nic: uuid.NewString(), mac: fmt.Sprintf("A8:40:25:F3:%02X:%02X", r.vmmSeq>>8&0xff, r.vmmSeq&0xff)}
	r.vmms[v.id] = v
	body, err := r.vmmBody(v)
	if err != nil {
		return err
	}
	if err := r.vmmCall(ctx, http.MethodPut, "/vmms/"+v.id, string(body)); err != nil {
		return err
	}
	return r.vmmCall(ctx, http.MethodPut, "/vmms/"+v.id+"/state", `{"state":{"type":"running"}}`)
}

// vmmCall sends a VMM request to the agent; a 404 is not an error (a
// DELETE sent again, of a VMM already gone).
func (r *run) vmmCall(ctx context.Context, method, path, body string) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, method, "http://"+r.listen+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}

// vmmRecover sends again the DELETEs a kill may have cut short.
func (r *run) vmmRecover(ctx context.Context) error {
	for _, v := range r.vmms {
		if v.deleting {
			if err := r.vmmCall(ctx, http.MethodDelete, "/vmms/"+v.id, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// vmmMismatch describes the first difference between the VMMs wanted and
// what the agent reports and the machine runs; "" when there is none. A
// VMM deleted and gone is forgotten.
func (r *run) vmmMismatch(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	infos, err := r.vmmList(cctx)
	if err != nil {
		return "agent: " + err.Error()
	}
	byID := map[string]vmm.Info{}
	for _, i := range infos {
		byID[i.ID] = i
		if _, ok := r.vmms[i.ID]; !ok {
			return fmt.Sprintf("agent has VMM %s the crash test never made (%s)", i.ID, i.State.State)
		}
	}
	qemus := qemuProcesses(r.dir)
	for id, v := range r.vmms {
		info, registered := byID[id]
		switch {
		case v.deleting && registered:
			return fmt.Sprintf("VMM %s is still registered (%s) after its DELETE", id, info.State.State)
		case v.rebooted && !registered:
			// Gone: the agent forgot a VMM the reboot failed.
			r.countRebooted(v)
		case v.rebooted && info.State.State == vmm.StateFailed:
			v.want = vmm.StateFailed
			r.countRebooted(v)
		case v.rebooted && (info.State.State != vmm.StateDestroyed || v.want != vmm.StateDestroyed):
			return fmt.Sprintf("VMM %s is %s (%s) after a reboot (asked: %s), want failed or gone", id, info.State.State, info.Detail, v.want)
		case !v.deleting && !registered:
			return fmt.Sprintf("VMM %s is no longer registered", id)
		case registered && v.want == vmm.StateRunning && info.State.State == vmm.StateFailed:
			// A kill may fail a VMM (its zone half-made, say): then it
			// must say so, and nothing of it may run. Counted, with why.
			v.want = vmm.StateFailed
			r.vmmsFailed = append(r.vmmsFailed, fmt.Sprintf("VMM %s: %s", id, info.Detail))
		case registered && info.State.State != v.want:
			return fmt.Sprintf("VMM %s is %s (%s), want %s", id, info.State.State, info.Detail, v.want)
		}
		wantQEMU := 0
		if !v.deleting && !v.rebooted && v.want == vmm.StateRunning {
			wantQEMU = 1
		}
		if v.want == vmm.StateFailed && registered && info.State.State != vmm.StateFailed {
			return fmt.Sprintf("VMM %s is %s after it was failed", id, info.State.State)
		}
		if n := len(qemus[id]); n != wantQEMU {
			return fmt.Sprintf("VMM %s (%s, deleted %v) has %d QEMU processes %v, want %d", id, v.want, v.deleting, n, qemus[id], wantQEMU)
		}
	}
	for id := range qemus {
		if _, ok := r.vmms[id]; !ok {
			return fmt.Sprintf("QEMU %v of no VMM the crash test made (%s)", qemus[id], id)
		}
	}
	for id, v := range r.vmms {
		if _, registered := byID[id]; v.deleting || v.rebooted && !registered {
			delete(r.vmms, id) // gone, as checked: nothing to look for again
		}
	}
	return ""
}

// countRebooted counts v among the VMMs a reboot took down, once.
func (r *run) countRebooted(v *ctVMM) {
	if !v.counted {
		v.counted = true
		r.vmmsRebooted++
	}
}

// wantedVMMZones are the zones of the VMMs that must be running.
func (r *run) wantedVMMZones() map[string]string {
	out := map[string]string{}
	for id, v := range r.vmms {
		if !v.deleting && !v.rebooted && v.want == vmm.StateRunning {
			out[zone.VMMNamePrefix+id] = id
		}
	}
	return out
}

// qemuProcesses are the QEMU processes whose files are under dir (the crash
// test's: other tests may run guests meanwhile), by the VMM they run (their
// -name guest=<propolis id>).
func qemuProcesses(dir string) map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "qemu-system") || !strings.Contains(string(cmd), dir+"/") {
			continue
		}
		for _, arg := range strings.Split(string(cmd), "\x00") {
			if rest, ok := strings.CutPrefix(arg, "guest="); ok {
				id, _, _ := strings.Cut(rest, ",")
				if uuid.Validate(id) == nil {
					out[id] = append(out[id], pid)
				}
			}
		}
	}
	return out
}

// vmmList is the agent's GET /agent/vmms.
func (r *run) vmmList(ctx context.Context) ([]vmm.Info, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.listen+"/agent/vmms?limit=100", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /agent/vmms: %s", resp.Status)
	}
	// A run has a few VMMs at most: one page of the most a page holds.
	var page api.VMMPage
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return nil, fmt.Errorf("GET /agent/vmms: %w", err)
	}
	if page.NextPage != nil {
		return nil, fmt.Errorf("GET /agent/vmms: more VMMs than one page holds")
	}
	return page.Items, nil
}

package bench

// The VMM benchmark: how long from a VMM zone's deletion behind the agent's
// back to GET /vmms/{id}/state saying failed, in each phase: before the
// VMM's service is up, while its guest starts, runs, and stops.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// VMMOptions size the VMM benchmark.
type VMMOptions struct {
	// Rounds is how many deletions are timed in each phase (20).
	Rounds int
	// Runtime is "sim" (default) or "linux" (real zones; root).
	Runtime string
	// Progress, if set, receives a line per phase and a periodic one in
	// its rounds, for people: the result alone goes to the caller.
	Progress io.Writer
}

// VMMResult is what `bench vmm` prints.
type VMMResult struct {
	Machine ZonesMachine `json:"machine"`
	Runtime string       `json:"runtime"`
	// Phases maps a phase to the time from the zone's deletion to the VMM
	// reported failed.
	Phases map[string]Latency `json:"zone_deleted_to_failed"`
}

// vmmPhases are the phases, in the order they are measured.
var vmmPhases = []string{"before its service is up", "starting", "running", "stopping"}

// VMM runs the VMM benchmark.
func VMM(ctx context.Context, opts VMMOptions) (res *VMMResult, err error) {
	opts.Rounds = cmp.Or(opts.Rounds, 20)
	if opts.Runtime == "" {
		opts.Runtime = "sim"
	}
	dir, err := os.MkdirTemp("", "sled-agent-bench-vmm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var b [3]byte
	rand.Read(b[:])
	tag := "bv" + hex.EncodeToString(b[:])
	cfg := agent.Config{DataDir: filepath.Join(dir, "data"), Runtime: opts.Runtime, Listen: "127.0.0.1:0", ZoneTag: tag, NetnsPrefix: tag + "-",
		SkipTimesync: true, UnderlayIP: "fd00:1122:3344:1d1::1"} // its zones do not wait for an NTP zone: it has none
	switch opts.Runtime {
	case "sim":
	case "linux":
		if os.Geteuid() != 0 {
			return nil, errors.New("bench vmm --runtime linux needs root")
		}
		if cfg.RunDir, err = os.MkdirTemp("/dev/shm", "sled-agent-bench-vmm-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(cfg.RunDir)
	default:
		return nil, fmt.Errorf("runtime %q: want sim or linux", opts.Runtime)
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, terr := agent.Teardown(tctx, cfg, nil); terr != nil {
			err = errors.Join(err, fmt.Errorf("tearing down: %w", terr))
			res = nil
		}
		if cfg.Runtime == "linux" {
			agent.RemoveHostLock(tag) // best effort: a few bytes in /run/lock
		}
	}()
	progress(opts.Progress, "bench vmm: starting an agent (%s runtime)", opts.Runtime)
	a, _, stop, err := startAgent(ctx, cfg, nil)
	if err != nil {
		return nil, err
	}
	defer stop()
	r := &vmmRun{a: a, cfg: cfg}
	res = &VMMResult{Machine: machine(), Runtime: opts.Runtime, Phases: map[string]Latency{}}
	for i, phase := range vmmPhases {
		var took []time.Duration
		progress(opts.Progress, "bench vmm: phase %d/%d, %s: %d rounds, each deleting a VMM's zone", i+1, len(vmmPhases), phase, opts.Rounds)
		steps := newLoopProgress(opts.Progress, "bench vmm: "+phase, opts.Rounds)
		for j := range opts.Rounds {
			// Each VMM on its own address, so no zone waits for another's
			// (in the sled's /64, as every VMM's).
			addr := fmt.Sprintf("[fd00:1122:3344:1d1::%x:%x]:12400", i+1, j+5)
			dt, err := r.round(ctx, phase, uuid.NewString(), addr)
			if err != nil {
				return nil, fmt.Errorf("%s, round %d: %w", phase, j+1, err)
			}
			took = append(took, dt)
			steps.done(j + 1)
		}
		res.Phases[phase] = summarize(took)
	}
	return res, nil
}

type vmmRun struct {
	a   *agent.Agent
	cfg agent.Config
}

// round registers a VMM, brings it to phase, deletes its zone and times
// until the VMM is reported failed; then unregisters it.
func (r *vmmRun) round(ctx context.Context, phase, id, addr string) (time.Duration, error) {
	name := zone.VMMNamePrefix + id
	if phase == vmmPhases[0] && r.cfg.Runtime == "sim" {
		// The sim's zone never comes up: its start hangs.
		if err := r.a.Sim().SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{id: {Start: "hang"}}}); err != nil {
			return 0, err
		}
		defer r.a.Sim().SetFaults(sim.Faults{})
	}
	body := string(vmmtest.Body(uuid.NewString(), addr, nil, nil))
	if err := r.do(ctx, http.MethodPut, "/vmms/"+id, body, nil); err != nil {
		return 0, err
	}
	defer r.do(context.Background(), http.MethodDelete, "/vmms/"+id, "", nil)
	switch phase {
	case "before its service is up":
		if err := r.waitZone(ctx, name); err != nil {
			return 0, err
		}
	case "starting":
		if err := r.waitState(ctx, id, "starting", "zone being created"); err != nil {
			return 0, err
		}
		if err := r.do(ctx, http.MethodPut, "/vmms/"+id+"/state", `{"state":{"type":"running"}}`, nil); err != nil {
			return 0, err
		}
	case "running", "stopping":
		if err := r.waitState(ctx, id, "starting", "zone being created"); err != nil {
			return 0, err
		}
		if err := r.do(ctx, http.MethodPut, "/vmms/"+id+"/state", `{"state":{"type":"running"}}`, nil); err != nil {
			return 0, err
		}
		if err := r.waitState(ctx, id, "running", ""); err != nil {
			return 0, err
		}
		if phase == "stopping" {
			if err := r.do(ctx, http.MethodPut, "/vmms/"+id+"/state", `{"state":{"type":"stopped"}}`, nil); err != nil {
				return 0, err
			}
		}
	}
	t0 := time.Now()
	if err := r.deleteZone(name); err != nil {
		return 0, err
	}
	if err := r.waitState(ctx, id, "failed", ""); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// deleteZone deletes a zone behind the agent's back: the sim forgets it;
// on Linux its namespace goes, as `ip netns delete` does, and its
// processes are killed.
func (r *vmmRun) deleteZone(name string) error {
	if r.cfg.Runtime == "sim" {
		if !r.a.Sim().Vanish(name) {
			return fmt.Errorf("no zone %s to delete", name)
		}
		return nil
	}
	ns := r.cfg.NetnsPrefix + name
	pids, err := namespacePIDs(zonenet.NetnsPath(ns))
	if err != nil {
		return err
	}
	if err := syscall.Unmount(zonenet.NetnsPath(ns), syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting %s: %w", ns, err)
	}
	if err := os.Remove(zonenet.NetnsPath(ns)); err != nil {
		return err
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// namespacePIDs lists the processes in the network namespace at path.
func namespacePIDs(path string) ([]int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nil, err
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/net"); l == want {
			out = append(out, pid)
		}
	}
	return out, nil
}

// waitZone waits, polling every millisecond, until the zone exists.
func (r *vmmRun) waitZone(ctx context.Context, name string) error {
	_, err := waitUntil(ctx, time.Now(), func() bool {
		if r.cfg.Runtime == "sim" {
			_, ok := r.a.Sim().Incarnation(name)
			return ok
		}
		return zonenet.NetnsExists(r.cfg.NetnsPrefix + name)
	})
	return err
}

// waitState waits until the VMM's state (and detail, if not "") are these.
func (r *vmmRun) waitState(ctx context.Context, id, state, notDetail string) error {
	var last string
	_, err := waitUntil(ctx, time.Now(), func() bool {
		var page struct {
			Items []struct {
				ID     string `json:"propolis_id"`
				Detail string `json:"detail"`
				State  struct {
					State string `json:"state"`
				} `json:"vmm_state"`
			}
		}
		if err := r.do(ctx, http.MethodGet, "/agent/vmms?limit=100", "", &page); err != nil {
			last = err.Error()
			return false
		}
		for _, v := range page.Items {
			if v.ID == id {
				last = v.State.State + " (" + v.Detail + ")"
				return v.State.State == state && (notDetail == "" || v.Detail != notDetail)
			}
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("VMM not %s: %s: %w", state, last, err)
	}
	return nil
}

func (r *vmmRun) do(ctx context.Context, method, path, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+r.a.Addr()+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

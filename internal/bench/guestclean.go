package bench

// The guest benchmark's cleanup: whatever state a run ends in (done, an
// error, Ctrl-C), its VMMs are unregistered, its agent stopped, what the
// agent left torn down as `sled-agent teardown` does, the floor's QEMUs
// killed, and the run's namespaces, processes and dirs removed; then it
// checks that nothing of the run is left.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// cleanupTimeout bounds the whole cleanup.
const cleanupTimeout = 3 * time.Minute

// registry is what a run has made and not yet removed.
type registry struct {
	mu     sync.Mutex
	vmms   map[string]bool   // guarded by mu: registered with the agent
	floors map[*floorVM]bool // guarded by mu: floor VMs made
}

func (r *registry) addVMM(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.vmms == nil {
		r.vmms = map[string]bool{}
	}
	r.vmms[id] = true
}

func (r *registry) doneVMM(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.vmms, id)
}

func (r *registry) addFloor(vm *floorVM) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.floors == nil {
		r.floors = map[*floorVM]bool{}
	}
	r.floors[vm] = true
}

func (r *registry) doneFloor(vm *floorVM) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.floors, vm)
}

// left is what is still registered.
func (r *registry) left() (vmms []string, floors []*floorVM) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.vmms {
		vmms = append(vmms, id)
	}
	for vm := range r.floors {
		floors = append(floors, vm)
	}
	return vmms, floors
}

// cleanup removes everything the run made and says what it could not.
func (b *guestBench) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var errs []error
	vmms, floors := b.reg.left()
	if b.agent != nil {
		if b.agent.running() {
			for _, id := range vmms {
				if err := b.agent.unregister(ctx, id); err != nil {
					errs = append(errs, fmt.Errorf("unregistering VMM %s: %w", id, err))
				}
			}
		}
		if err := b.agent.stop(); err != nil {
			errs = append(errs, err)
		}
		// What the agent may have left: its zones, by its tag.
		if _, err := agent.Teardown(ctx, b.agentConfig(), nil); err != nil {
			errs = append(errs, fmt.Errorf("tearing the agent's zones down: %w", err))
		}
	}
	agent.RemoveHostLock(b.tag) // best effort: a few bytes in /run/lock
	for _, vm := range floors {
		if err := vm.remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", vm.name, err))
		}
	}
	// Anything else in the run's namespaces or supervised from its run
	// dir, its links and namespaces.
	if err := (&zonesBench{prefix: b.prefix, tag: b.tag, runDir: b.runDir}).sweep(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []string{b.dir, b.runDir} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if left := b.leftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("left behind: %s", strings.Join(left, "; ")))
	}
	return errors.Join(errs...)
}

// leftovers lists what of the run is still there: namespaces and host
// links with its prefix or tag, processes whose command line or working
// dir is in its dirs, the dirs, the agent's host lock and cgroups.
func (b *guestBench) leftovers() []string {
	var out []string
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), b.prefix) {
			out = append(out, "namespace "+e.Name())
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if a := l.Attrs(); strings.HasPrefix(a.Name, b.prefix) || strings.HasPrefix(a.Alias, b.tag+":") {
			out = append(out, "link "+a.Name)
		}
	}
	procs, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		cwd, _ := os.Readlink("/proc/" + e.Name() + "/cwd")
		for _, d := range []string{b.dir, b.runDir} {
			if bytes.Contains(cmd, []byte(d)) || strings.HasPrefix(cwd, d) {
				out = append(out, fmt.Sprintf("process %d %q", pid, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
				break
			}
		}
	}
	for _, p := range []string{b.dir, b.runDir, filepath.Join(agent.HostLockDir, "sled-agent-"+b.tag+".lock")} {
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	// The zones' and guests' cgroups: on cgroup v2 at the top, or in a
	// v1 hierarchy or v2's unified mount beneath it.
	for _, g := range []string{"/sys/fs/cgroup/sled-agent/" + b.tag, "/sys/fs/cgroup/*/sled-agent/" + b.tag} {
		found, _ := filepath.Glob(g)
		out = append(out, found...)
	}
	return slices.Compact(out)
}

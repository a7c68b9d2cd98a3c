package crashtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// converge waits until the restarted agent reports every wanted zone running
// with its config and nothing else, and the machine holds exactly the wanted
// zones: no namespace, link, process or zone root of anything else. It
// returns how long that took, or, after ConvergeTimeout, what was still
// wrong.
func (r *run) converge(ctx context.Context) (time.Duration, string) {
	t0 := time.Now()
	deadline := t0.Add(r.opts.ConvergeTimeout)
	for {
		problem := r.mismatch(ctx)
		if problem == "" {
			return time.Since(t0), ""
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Since(t0), problem
		}
		if err := sleep(ctx, 25*time.Millisecond); err != nil {
			return time.Since(t0), problem
		}
	}
}

// mismatch describes the first difference between what is wanted and what
// the agent reports or the machine holds; "" when there is none.
func (r *run) mismatch(ctx context.Context) string {
	want := map[string]string{} // name → config hash
	ids := map[string]bool{}
	for _, z := range r.zones {
		want[z.Name()] = z.Hash()
		ids[z.ID] = true
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	states, err := r.c.ZoneStates(cctx)
	cancel()
	if err != nil {
		return "agent: " + err.Error()
	}
	seen := 0
	for _, zs := range states {
		h, ok := want[zs.Name]
		switch {
		case !ok:
			return fmt.Sprintf("agent still has unwanted zone %s (%s)", zs.Name, zs.State)
		case zs.State != "running" || zs.ConfigHash != h:
			return fmt.Sprintf("agent: zone %s is %s with config %.12s, want running with %.12s", zs.Name, zs.State, zs.ConfigHash, h)
		}
		seen++
	}
	if seen != len(want) {
		return fmt.Sprintf("agent reports %d of %d wanted zones", seen, len(want))
	}
	if problem := r.vmmMismatch(ctx); problem != "" {
		return problem
	}
	if problem := r.portMismatch(ctx); problem != "" {
		return problem
	}
	// The machine: the config's zones and the zones of the VMMs that run.
	vmmZones := r.wantedVMMZones()
	for name, id := range vmmZones {
		ids[id] = true
		want[name] = ""
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	owned, err := r.obs.Owned(lctx)
	cancel()
	if err != nil {
		return "listing what the machine holds: " + err.Error()
	}
	roots := 0
	for _, o := range owned.Zones {
		h, ok := want[o.Name]
		if _, vmmZone := vmmZones[o.Name]; vmmZone {
			h = o.Hash // a VMM zone's config is the VMM's, checked above
		}
		if !ok || o.Hash != h || !o.Running {
			return fmt.Sprintf("zone root %s: wanted %v, config %.12s, running %v (%s)", o.Name, ok, o.Hash, o.Running, o.Detail)
		}
		roots++
	}
	if roots != len(want) {
		return fmt.Sprintf("%d zone roots for %d wanted zones", roots, len(want))
	}
	for _, ns := range owned.Namespaces {
		if _, ok := want[strings.TrimPrefix(ns, r.prefix)]; !ok {
			return "unwanted namespace " + ns
		}
	}
	if len(owned.Namespaces) != len(want) {
		return fmt.Sprintf("%d namespaces for %d wanted zones", len(owned.Namespaces), len(want))
	}
	for _, l := range owned.Links {
		if !ids[l.ZoneID] {
			return fmt.Sprintf("unwanted link %+v", l)
		}
	}
	for _, p := range owned.Processes {
		if _, ok := want[filepath.Base(p.Dir)]; !ok {
			return fmt.Sprintf("unwanted process %d (%s) of %s", p.PID, p.Comm, p.Dir)
		}
	}
	return r.storageMismatch(ctx)
}

// storageMismatch says what of the config's storage the agent does not
// report ok: every disk with its pool, every dataset; "" when all are.
func (r *run) storageMismatch(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	inv, err := r.c.AgentInventory(cctx)
	cancel()
	switch {
	case err != nil:
		return "inventory: " + err.Error()
	case inv.Storage == nil || !inv.Storage.Configured:
		return "storage: not configured"
	}
	for _, d := range inv.Storage.Disks {
		if !d.Result.OK {
			return fmt.Sprintf("storage: disk %s: %s", d.Identity.Serial, d.Result.Message)
		}
	}
	for _, d := range inv.Storage.Datasets {
		if !d.Result.OK {
			return fmt.Sprintf("storage: dataset %s: %s", d.Name, d.Result.Message)
		}
	}
	return ""
}

// durablePath is where zone z's durable dataset is on the machine ("" if
// it has none).
func (r *run) durablePath(z sledconfig.Zone) string {
	d, ok := z.DurableDataset()
	if !ok {
		return ""
	}
	pool, _ := storage.PoolIDFromName(d.PoolName)
	return filepath.Join(r.cfg.DataDir, "storage", "ext", pool, strings.TrimPrefix(d.String(), d.PoolName+"/"))
}

// dataFile is the file the crash test keeps in each durable dataset.
const dataFile = "crashtest-data"

// keepData writes a file into the durable dataset of every wanted zone
// that has none yet (synced, so only a lost dataset loses it), and forgets
// the files of zones no longer wanted (their datasets are orphans, to be
// destroyed).
func (r *run) keepData() error {
	wanted := map[string]bool{}
	for _, z := range r.zones {
		wanted[z.ID] = true
		path := r.durablePath(z)
		if path == "" || r.data[z.ID] != "" {
			continue
		}
		// The dataset itself, never a directory made in its place: a
		// btrfs subvolume's root is inode 256.
		if st, err := os.Stat(path); err != nil || st.Sys().(*syscall.Stat_t).Ino != 256 {
			return fmt.Errorf("zone %s's durable dataset %s is not a subvolume: %v", z.Name(), path, err)
		}
		content := fmt.Sprintf("zone %s, written at generation %d\n", z.ID, r.gen)
		if err := atomicfile.WriteFile(filepath.Join(path, dataFile), []byte(content), atomicfile.Options{}); err != nil {
			return fmt.Errorf("keeping data in %s: %w", path, err)
		}
		r.data[z.ID] = content
	}
	for id := range r.data {
		if !wanted[id] {
			delete(r.data, id)
		}
	}
	return nil
}

// lostData says which durable dataset lost the file keepData wrote there.
func (r *run) lostData() string {
	for _, z := range r.zones {
		want, ok := r.data[z.ID]
		if !ok {
			continue
		}
		path := filepath.Join(r.durablePath(z), dataFile)
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			return fmt.Sprintf("zone %s's durable data %s: %q, %v; want %q", z.Name(), path, got, err, want)
		}
	}
	return ""
}

// healthyPIDs returns the service PID of every zone that is, right now,
// whole, running the wanted config and answering its health check.
func (r *run) healthyPIDs(ctx context.Context) map[string]int {
	out := map[string]int{}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	listed, err := r.obs.List(lctx)
	cancel()
	if err != nil {
		return out
	}
	byName := map[string]zone.Observed{}
	for _, o := range listed {
		byName[o.Name] = o
	}
	// A running VMM's service, which QEMU runs under, keeps running too.
	qemus := qemuProcesses(r.dir)
	for name, id := range r.wantedVMMZones() {
		if o, ok := byName[name]; ok && o.Running && len(qemus[id]) == 1 {
			if pid := r.pid(name); pid > 0 {
				out[name] = pid
			}
		}
	}
	for _, z := range r.zones {
		o, ok := byName[z.Name()]
		if !ok || !o.Running || o.Hash != z.Hash() {
			continue
		}
		addr, _ := z.ServiceAddr()
		hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := zoneservice.Check(hctx, addr.String())
		cancel()
		if pid := r.pid(z.Name()); err == nil && pid > 0 {
			out[z.Name()] = pid
		}
	}
	return out
}

// pid is the zone's service PID as its supervisor reports it, or 0.
func (r *run) pid(name string) int {
	st, err := supervise.Status(filepath.Join(r.runDir, r.tag, name))
	if err != nil || !st.Up {
		return 0
	}
	return st.PID
}

// ledgerProblem checks that the ledger holds the last acknowledged
// generation in every copy.
func (r *run) ledgerProblem(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	inv, err := r.c.AgentInventory(cctx)
	cancel()
	switch {
	case err != nil:
		return "inventory: " + err.Error()
	case inv.LedgeredConfig == nil:
		return "no ledgered config"
	case inv.LedgeredConfig.Generation != r.gen:
		return fmt.Sprintf("ledgered generation %d, acknowledged %d", inv.LedgeredConfig.Generation, r.gen)
	case inv.Ledger.Problem != "":
		return "ledger: " + inv.Ledger.Problem
	}
	for _, c := range inv.Ledger.Copies {
		if c.State != "ok" || c.Generation != r.gen {
			return fmt.Sprintf("ledger copy %s: %s, generation %d", c.Path, c.State, c.Generation)
		}
	}
	return ""
}

// cleanup kills the agent, tears down everything with the run's tag, checks
// that nothing is left, and removes the run's directories; but keeps the
// agent's log if the run failed (keepLog).
func (r *run) cleanup(keepLog bool) error {
	var errs []error
	if err := r.kill(); err != nil {
		errs = append(errs, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if r.obs != nil {
		if _, err := agent.Teardown(ctx, r.cfg, nil); err != nil {
			errs = append(errs, fmt.Errorf("teardown: %w", err))
		}
		if owned, err := r.obs.Owned(ctx); err != nil {
			errs = append(errs, err)
		} else if n := len(owned.Zones) + len(owned.Namespaces) + len(owned.Links) + len(owned.Processes); n > 0 {
			errs = append(errs, fmt.Errorf("left behind after teardown: %+v", owned))
		}
		if procs, err := r.dataPathProcesses(); err != nil || len(procs) > 0 {
			errs = append(errs, fmt.Errorf("the data path left behind after teardown: %v %v", procs, err))
		}
		for id, pids := range qemuProcesses(r.dir) {
			if _, ours := r.vmms[id]; ours {
				errs = append(errs, fmt.Errorf("QEMU %v of VMM %s left behind after teardown", pids, id))
			}
		}
		r.obs.RemoveEmptyDirs()
		if err := btrfs.ReleaseUnder(ctx, r.dir); err != nil {
			errs = append(errs, err)
		}
		if err := agent.RemoveHostLock(r.tag); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 || keepLog {
		// Keep the agent's log for whoever investigates.
		os.RemoveAll(r.runDir)
		if len(errs) > 0 {
			errs = append(errs, fmt.Errorf("agent log kept in %s", r.dir))
		}
		return errors.Join(errs...)
	}
	return errors.Join(os.RemoveAll(r.dir), os.RemoveAll(r.runDir))
}

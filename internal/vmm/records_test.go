package vmm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// vmmIDs are the ids of the VMMs of a test with several.
func vmmIDs(n int) []string {
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("%08x-6666-4000-8000-000000000000", i+1))
	}
	return ids
}

// runVMMs registers the VMMs ids on a manager keeping records in dir, runs
// their guests, and closes the manager (the agent stops; the VMMs run on).
// It returns each VMM zone's incarnation.
func runVMMs(t *testing.T, rt *sim.Runtime, dir string, ids []string) map[string]uint64 {
	t.Helper()
	m := vmm.New(rt, vmm.InProcessHost{Options: simguest.Options{BootTime: time.Millisecond}},
		vmm.Options{RecordDirs: recordDirs(dir), PollWait: 20 * time.Millisecond, Identity: testIdentity})
	rt.SetNotify(m.Poke)
	defer m.Close()
	for i, id := range ids {
		reg := registration()
		reg.PropolisAddr = netip.MustParseAddrPort(fmt.Sprintf("[fd00:1122:3344:101::1:%x]:12400", i+5))
		if _, err := m.Register(id, reg); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.RequestState(context.Background(), id, vmm.RequestRunning); err != nil {
			t.Fatal(err)
		}
	}
	inc := map[string]uint64{}
	for _, id := range ids {
		waitFor(t, "VMM "+id+" running", func() (bool, string) {
			info, err := m.Get(id)
			return err == nil && info.State.State == vmm.StateRunning, fmt.Sprintf("%+v %v", info.State, err)
		})
		n, ok := rt.Incarnation(zone.VMMNamePrefix + id)
		if !ok {
			t.Fatalf("no zone for VMM %s", id)
		}
		inc[id] = n
	}
	return inc
}

// restarted is a manager over the same runtime and record directories, as
// a restarted agent's, resumed.
func restarted(t *testing.T, rt *sim.Runtime, opts vmm.Options) *vmm.Manager {
	t.Helper()
	opts.Identity = testIdentity
	opts.PollWait = 20 * time.Millisecond
	m := vmm.New(rt, vmm.InProcessHost{Options: simguest.Options{BootTime: time.Millisecond}}, opts)
	rt.SetNotify(m.Poke)
	t.Cleanup(m.Close)
	m.Resume()
	return m
}

func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after %s: %s", what, waitDeadline, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// listed returns the manager's view of every VMM, by id.
func listed(m *vmm.Manager) map[string]vmm.Info {
	out := map[string]vmm.Info{}
	for _, i := range m.List() {
		out[i.ID] = i
	}
	return out
}

// checkUnknownLeftAlone checks that a restarted manager with no readable
// record of the VMMs ids destroys none of their zones, reports each
// unknown with why (saying want), answers for none, and removes one only
// when asked.
func checkUnknownLeftAlone(t *testing.T, rt *sim.Runtime, m *vmm.Manager, ids []string, inc map[string]uint64, want string) {
	t.Helper()
	waitFor(t, "every VMM reported unknown", func() (bool, string) {
		l := listed(m)
		for _, id := range ids {
			if i := l[id]; i.Status != vmm.StatusUnknown || !strings.Contains(i.Detail, "zone "+zone.VMMNamePrefix+id+" runs but no readable record of it: ") {
				return false, fmt.Sprintf("%+v", l)
			}
		}
		return true, ""
	})
	// Rechecked, as every period: still nothing destroyed.
	m.CheckRecords(context.Background())
	for id, info := range listed(m) {
		if !strings.Contains(info.Detail, want) {
			t.Errorf("VMM %s: detail %q does not say %q", id, info.Detail, want)
		}
	}
	for _, id := range ids {
		if n, ok := rt.Incarnation(zone.VMMNamePrefix + id); !ok || n != inc[id] {
			t.Fatalf("the zone of VMM %s with no readable record was touched: incarnation %d → %d (%v)", id, inc[id], n, ok)
		}
		if _, err := m.Get(id); !errors.Is(err, vmm.ErrNotFound) {
			t.Errorf("Get(%s) of an unknown VMM: %v, want ErrNotFound", id, err)
		}
		if _, _, err := m.RequestState(context.Background(), id, vmm.RequestStopped); !errors.Is(err, vmm.ErrNotFound) {
			t.Errorf("RequestState(%s) of an unknown VMM: %v, want ErrNotFound", id, err)
		}
		if _, err := m.Unregister(context.Background(), id); !errors.Is(err, vmm.ErrNotFound) {
			t.Errorf("Unregister(%s) of an unknown VMM: %v, want ErrNotFound", id, err)
		}
		if _, err := m.Register(id, registration()); !errors.Is(err, vmm.ErrNotKnown) {
			t.Errorf("Register(%s) over an unknown VMM's zone: %v, want ErrNotKnown", id, err)
		}
	}
	// The operator removes one on purpose.
	if _, err := m.RemoveUnknown(context.Background(), ids[0]); err != nil {
		t.Fatalf("RemoveUnknown: %v", err)
	}
	if _, ok := rt.Incarnation(zone.VMMNamePrefix + ids[0]); ok {
		t.Fatal("RemoveUnknown left the zone")
	}
	if _, ok := listed(m)[ids[0]]; ok {
		t.Fatal("a removed unknown VMM is still listed")
	}
	if _, err := m.RemoveUnknown(context.Background(), ids[0]); !errors.Is(err, vmm.ErrNotFound) {
		t.Fatalf("RemoveUnknown again: %v, want ErrNotFound", err)
	}
	m.CheckRecords(context.Background())
	for _, id := range ids[1:] {
		if _, ok := rt.Incarnation(zone.VMMNamePrefix + id); !ok {
			t.Fatalf("removing VMM %s removed VMM %s too", ids[0], id)
		}
	}
}

// Moving the record directories aside and restarting destroys no VMM zone.
func TestLostRecordsDestroyNothing(t *testing.T) {
	dir := t.TempDir()
	rt := sim.New(sim.Options{})
	ids := vmmIDs(4)
	inc := runVMMs(t, rt, dir, ids)
	for _, d := range recordDirs(dir) {
		if err := os.Rename(d, d+".aside"); err != nil {
			t.Fatal(err)
		}
	}
	m := restarted(t, rt, vmm.Options{RecordDirs: recordDirs(dir)})
	checkUnknownLeftAlone(t, rt, m, ids, inc, "no record of it in "+filepath.Join(dir, "a")+" or "+filepath.Join(dir, "b"))

	// Records put back are read again: the VMMs are adopted.
	for _, d := range recordDirs(dir) {
		os.RemoveAll(d)
		if err := os.Rename(d+".aside", d); err != nil {
			t.Fatal(err)
		}
	}
	m.CheckRecords(context.Background())
	for _, id := range ids[1:] {
		if i := listed(m)[id]; i.Status != vmm.StatusKnown {
			t.Errorf("VMM %s after its record is back: %+v", id, i)
		}
	}
	// A VMM with a record is not removed as unknown.
	if _, err := m.RemoveUnknown(context.Background(), ids[1]); !errors.Is(err, vmm.ErrKnown) {
		t.Errorf("RemoveUnknown of a known VMM: %v, want ErrKnown", err)
	}
}

// corrupt damages the file at path (one byte of its checksummed document).
func corrupt(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), `"instance_id"`)
	b[i+2] = 'X'
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Every copy of every record corrupt: nothing is known, nothing destroyed.
func TestCorruptRecordsDestroyNothing(t *testing.T) {
	dir := t.TempDir()
	rt := sim.New(sim.Options{})
	ids := vmmIDs(3)
	inc := runVMMs(t, rt, dir, ids)
	for _, id := range ids {
		for _, d := range recordDirs(dir) {
			corrupt(t, filepath.Join(d, id+".json"))
		}
	}
	m := restarted(t, rt, vmm.Options{RecordDirs: recordDirs(dir)})
	checkUnknownLeftAlone(t, rt, m, ids, inc, "corrupt: checksum mismatch")
	// The removed one's corrupt copies went with it.
	for _, d := range recordDirs(dir) {
		if _, err := os.Stat(filepath.Join(d, ids[0]+".json")); !os.IsNotExist(err) {
			t.Errorf("a removed unknown VMM's record in %s: %v", d, err)
		}
	}
}

// One copy corrupt, or missing: the VMM is adopted from the other, and the
// bad copy rewritten.
func TestOneBadCopyIsRewritten(t *testing.T) {
	dir := t.TempDir()
	rt := sim.New(sim.Options{})
	ids := vmmIDs(2)
	inc := runVMMs(t, rt, dir, ids)
	a, b := recordDirs(dir)[0], recordDirs(dir)[1]
	corrupt(t, filepath.Join(a, ids[0]+".json"))
	if err := os.Remove(filepath.Join(b, ids[1]+".json")); err != nil {
		t.Fatal(err)
	}
	m := restarted(t, rt, vmm.Options{RecordDirs: recordDirs(dir)})
	for _, id := range ids {
		if i, err := m.Get(id); err != nil || i.Status != vmm.StatusKnown {
			t.Fatalf("VMM %s with one good copy: %+v %v", id, i, err)
		}
		if n, ok := rt.Incarnation(zone.VMMNamePrefix + id); !ok || n != inc[id] {
			t.Fatalf("zone of VMM %s: incarnation %d → %d (%v)", id, inc[id], n, ok)
		}
		i, _ := m.Get(id)
		if len(i.RecordCopies) != 2 {
			t.Fatalf("VMM %s: record copies %+v", id, i.RecordCopies)
		}
		for _, c := range i.RecordCopies {
			if c.State != "ok" || c.Generation == 0 {
				t.Errorf("VMM %s: record copy %+v after the rewrite", id, c)
			}
		}
	}
	for _, p := range []string{filepath.Join(a, ids[0]+".json"), filepath.Join(b, ids[1]+".json")} {
		data, err := os.ReadFile(p)
		if err != nil || !json.Valid(data) || strings.Contains(string(data), `"Xnstance_id"`) {
			t.Errorf("the bad copy %s was not rewritten: %s (%v)", p, data, err)
		}
	}
	// And one that goes bad while the agent runs is rewritten at the next
	// check.
	corrupt(t, filepath.Join(b, ids[0]+".json"))
	m.CheckRecords(context.Background())
	if data, _ := os.ReadFile(filepath.Join(b, ids[0]+".json")); strings.Contains(string(data), `"Xnstance_id"`) {
		t.Errorf("a copy corrupted while running was not rewritten: %s", data)
	}
}

// An unregister cut short after its durable record (the zone's teardown
// failed, then the agent stopped) is finished by the restarted agent: the
// zone is torn down and the record removed.
func TestInterruptedUnregisterIsFinished(t *testing.T) {
	dir := t.TempDir()
	rt := sim.New(sim.Options{})
	ids := vmmIDs(2)
	runVMMs(t, rt, dir, ids)
	m1 := vmm.New(rt, vmm.InProcessHost{Options: simguest.Options{BootTime: time.Millisecond}},
		vmm.Options{RecordDirs: recordDirs(dir), PollWait: 20 * time.Millisecond, Identity: testIdentity})
	if n, err := m1.Resume(); n != 2 || err != nil {
		t.Fatalf("Resume: %d %v", n, err)
	}
	if err := rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{ids[0]: {Stop: "fail"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Unregister(context.Background(), ids[0]); err == nil {
		t.Fatal("Unregister with a teardown that fails: no error")
	}
	m1.Close()
	rec, err := os.ReadFile(filepath.Join(recordDirs(dir)[0], ids[0]+".json"))
	if err != nil || !strings.Contains(string(rec), `"unregistered":true`) {
		t.Fatalf("the record of a VMM whose unregister was cut short: %s (%v)", rec, err)
	}
	if _, ok := rt.Incarnation(zone.VMMNamePrefix + ids[0]); !ok {
		t.Fatal("the zone is gone already: nothing to finish")
	}
	if err := rt.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	m := restarted(t, rt, vmm.Options{RecordDirs: recordDirs(dir)})
	waitFor(t, "the unregister finished", func() (bool, string) {
		_, zoneThere := rt.Incarnation(zone.VMMNamePrefix + ids[0])
		_, recErr := os.Stat(filepath.Join(recordDirs(dir)[1], ids[0]+".json"))
		return !zoneThere && os.IsNotExist(recErr), fmt.Sprintf("zone %v, record %v", zoneThere, recErr)
	})
	if _, err := m.Get(ids[0]); !errors.Is(err, vmm.ErrNotFound) {
		t.Errorf("an unregistered VMM answers: %v", err)
	}
	if _, err := m.Get(ids[1]); err != nil {
		t.Errorf("the other VMM: %v", err)
	}
	if _, ok := rt.Incarnation(zone.VMMNamePrefix + ids[1]); !ok {
		t.Error("the other VMM's zone is gone")
	}
}

// The records of an earlier agent (one plain file per VMM) are adopted and
// rewritten as records; an unreadable one leaves its VMM unknown.
func TestOldRecordsAreMigrated(t *testing.T) {
	dir := t.TempDir()
	rt := sim.New(sim.Options{})
	ids := vmmIDs(3)
	inc := runVMMs(t, rt, dir, ids)
	old := filepath.Join(dir, "vmms")
	if err := os.Mkdir(old, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		var env struct{ Data json.RawMessage }
		b, err := os.ReadFile(filepath.Join(recordDirs(dir)[0], id+".json"))
		if err != nil || json.Unmarshal(b, &env) != nil {
			t.Fatal(err)
		}
		data := []byte(env.Data)
		if id == ids[2] {
			data = data[:len(data)/2] // torn
		}
		if err := os.WriteFile(filepath.Join(old, id+".json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range recordDirs(dir) {
		os.RemoveAll(d)
	}
	m := restarted(t, rt, vmm.Options{RecordDirs: recordDirs(dir), LegacyDir: old})
	for _, id := range ids[:2] {
		if i, err := m.Get(id); err != nil || i.State.State != vmm.StateRunning {
			t.Fatalf("VMM %s from an old record: %+v %v", id, i, err)
		}
		if n, ok := rt.Incarnation(zone.VMMNamePrefix + id); !ok || n != inc[id] {
			t.Fatalf("zone of VMM %s: incarnation %d → %d (%v)", id, inc[id], n, ok)
		}
		if _, err := os.Stat(filepath.Join(old, id+".json")); !os.IsNotExist(err) {
			t.Errorf("old record of %s kept after its rewrite: %v", id, err)
		}
		for _, d := range recordDirs(dir) {
			if _, err := os.Stat(filepath.Join(d, id+".json")); err != nil {
				t.Errorf("VMM %s not rewritten in %s: %v", id, d, err)
			}
		}
	}
	waitFor(t, "the torn old record's VMM unknown", func() (bool, string) {
		i := listed(m)[ids[2]]
		return i.Status == vmm.StatusUnknown && strings.Contains(i.Detail, "its record from an earlier agent cannot be read"), fmt.Sprintf("%+v", i)
	})
	m.CheckRecords(context.Background())
	if i := listed(m)[ids[2]]; i.Status != vmm.StatusUnknown || !strings.Contains(i.Detail, "its record from an earlier agent cannot be read") {
		t.Errorf("the torn old record's VMM after a check: %+v", i)
	}
	if _, ok := rt.Incarnation(zone.VMMNamePrefix + ids[2]); !ok {
		t.Fatal("the zone of a VMM whose old record is torn was destroyed")
	}
	// A restart again: the rewritten records are read; nothing is lost.
	m.Close()
	m2 := restarted(t, rt, vmm.Options{RecordDirs: recordDirs(dir), LegacyDir: old})
	for _, id := range ids[:2] {
		if _, err := m2.Get(id); err != nil {
			t.Errorf("VMM %s after a second restart: %v", id, err)
		}
	}
	// Removing the unknown one removes its torn old record too.
	if _, err := m2.RemoveUnknown(context.Background(), ids[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(old, ids[2]+".json")); !os.IsNotExist(err) {
		t.Errorf("the torn old record after its VMM was removed: %v", err)
	}
}

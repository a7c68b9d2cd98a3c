package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// storageDone reports whether every configured disk and dataset is ok,
// and says how far it got.
func storageDone(st storage.Status) (bool, string) {
	ok, dok := 0, 0
	for _, d := range st.Disks {
		if d.Result.OK {
			ok++
		}
	}
	for _, d := range st.Datasets {
		if d.Result.OK {
			dok++
		}
	}
	return st.Configured && ok == len(st.Disks) && dok == len(st.Datasets), fmt.Sprintf("%d/%d disks, %d/%d datasets ok", ok, len(st.Disks), dok, len(st.Datasets))
}

// With the sim runtime the example config's storage is realised: its 10
// disks carry their pools and its 54 datasets exist; a restarted agent
// adopts them as they are.
func TestSimRealisesTheExampleStorage(t *testing.T) {
	dir := t.TempDir()
	a := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	stop := run(t, a)
	c := newClient(t, a)
	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the example's storage to be ensured", func() (bool, string) { return storageDone(a.Storage().Status()) })
	st := a.Storage().Status()
	if len(st.Disks) != 10 || len(st.Datasets) != 54 || len(st.Observed.Pools) != 10 || len(st.Observed.Datasets) != 54 {
		t.Fatalf("disks %d, datasets %d, pools seen %d, datasets seen %d", len(st.Disks), len(st.Datasets), len(st.Observed.Pools), len(st.Observed.Datasets))
	}
	ids := map[string]string{}
	for _, d := range st.Observed.Datasets {
		ids[d.Dataset.Name] = d.Dataset.ID
	}
	// As a client generated from upstream's document reads it.
	x := newWire(t, a).do(http.MethodGet, "/inventory", nil, http.StatusOK)
	var inv struct {
		Disks    []json.RawMessage `json:"disks"`
		Zpools   []json.RawMessage `json:"zpools"`
		Datasets []json.RawMessage `json:"datasets"`
		Last     struct {
			ExternalDisks map[string]struct{ Result string } `json:"external_disks"`
			Datasets      map[string]struct{ Result string } `json:"datasets"`
		} `json:"last_reconciliation"`
	}
	if err := json.Unmarshal(x.Body, &inv); err != nil {
		t.Fatal(err)
	}
	okCount := func(m map[string]struct{ Result string }) (n int) {
		for _, r := range m {
			if r.Result == "ok" {
				n++
			}
		}
		return n
	}
	if len(inv.Disks) != 10 || len(inv.Zpools) != 10 || len(inv.Datasets) != 54 || okCount(inv.Last.ExternalDisks) != 10 || okCount(inv.Last.Datasets) != 54 {
		t.Fatalf("inventory: %d disks, %d zpools, %d datasets, %d/%d disks ok, %d/%d datasets ok", len(inv.Disks), len(inv.Zpools), len(inv.Datasets),
			okCount(inv.Last.ExternalDisks), len(inv.Last.ExternalDisks), okCount(inv.Last.Datasets), len(inv.Last.Datasets))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	again := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	run(t, again)
	waitFor(t, "the restarted agent's storage", func() (bool, string) { return storageDone(again.Storage().Status()) })
	for _, d := range again.Storage().Status().Observed.Datasets {
		if ids[d.Dataset.Name] != d.Dataset.ID {
			t.Errorf("dataset %s: id %q after the restart, %q before", d.Dataset.Name, d.Dataset.ID, ids[d.Dataset.Name])
		}
	}
}

// serialOf is the serial of the synthetic disk that carries zone z's pool in
// configs built by sledconfigtest.
func serialOf(z sledconfig.Zone) string {
	return sledconfigtest.DiskFor(*z.FilesystemPool).Identity.Serial
}

// A hung disk (sim) holds back only the zones on its pool, which say why;
// the other zones start, the API answers meanwhile, and once the disk
// answers again its zones start.
func TestHungDiskHoldsBackOnlyItsZones(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir()})
	run(t, a)
	c := newClient(t, a)
	hung, fine := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1)
	setFaults(t, a, `{"zones": {}, "disks": {"`+serialOf(hung)+`": {"ensure": "hang"}}}`)
	putZones(t, c, 1, hung, fine)
	waitStates(t, c, map[string]string{fine.Name(): "running", hung.Name(): "waiting"})
	for range 5 {
		// The hang detector is the client's timeout.
		if res, msg := zoneResult(t, c, hung.ID); res != "err" || !strings.Contains(msg, "storage not ready: pool "+*hung.FilesystemPool+" is not managed") {
			t.Fatalf("the hung disk's zone: %s %s", res, msg)
		}
		if _, err := c.AgentInventory(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if zs, _ := c.Zone(t.Context(), hung.ID); zs.Attempts != 0 || zs.LastError != "" || !strings.HasPrefix(zs.WaitingFor, "storage not ready: pool "+*hung.FilesystemPool) {
		t.Errorf("the held zone: %+v; waiting is not failing: no failed attempts, no error, why it waits", zs)
	}
	// The disk's status says what hangs and until when (its deadline; the
	// call is abandoned then and retried on the backoff).
	for _, d := range a.Storage().Status().Disks {
		if d.Identity.Serial == serialOf(hung) && !strings.Contains(d.Activity, "deadline") {
			t.Errorf("the hung disk's activity: %q", d.Activity)
		}
	}
}

// A disk that vanishes (sim) is reported not found; a zone on it keeps
// running (as upstream: zones are only stopped for a config change), and
// one started meanwhile (its config changed) is held back, naming its pool,
// while the others run; the disk back, its pool and datasets are adopted as
// they were and the zone starts.
func TestVanishedDisk(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir()})
	run(t, a)
	c := newClient(t, a)
	gone, fine := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1)
	putZones(t, c, 1, gone, fine)
	waitStates(t, c, map[string]string{fine.Name(): "running", gone.Name(): "running"})
	waitFor(t, "storage ensured", func() (bool, string) { return storageDone(a.Storage().Status()) })
	ids := map[string]string{}
	for _, d := range a.Storage().Status().Observed.Datasets {
		ids[d.Dataset.Name] = d.Dataset.ID
	}
	setFaults(t, a, `{"zones": {}, "disks": {"`+serialOf(gone)+`": {"present": false}}}`)
	a.Storage().Poke()
	waitFor(t, "the disk reported not found", func() (bool, string) {
		for _, d := range a.Storage().Status().Disks {
			if d.Identity.Serial == serialOf(gone) {
				return !d.Result.OK && strings.Contains(d.Result.Message, "not found"), d.Result.Message
			}
		}
		return false, "no such disk"
	})
	if res, msg := zoneResult(t, c, gone.ID); res != "ok" {
		t.Fatalf("the running zone on the vanished disk: %s %s", res, msg)
	}
	gone.ZoneType.Address = strings.Replace(gone.ZoneType.Address, ":32345", ":32346", 1)
	putZones(t, c, 2, gone, fine)
	waitFor(t, "its zone held back", func() (bool, string) {
		res, msg := zoneResult(t, c, gone.ID)
		return res == "err" && strings.Contains(msg, "storage not ready: pool "+*gone.FilesystemPool+" is not managed"), res + " " + msg
	})
	if zs, err := c.Zone(t.Context(), fine.ID); err != nil || zs.State != "running" {
		t.Fatalf("the zone on the other disk: %+v, %v", zs, err)
	}
	setFaults(t, a, `{"zones": {}}`)
	a.Storage().Poke()
	waitStates(t, c, map[string]string{fine.Name(): "running", gone.Name(): "running"})
	for _, d := range a.Storage().Status().Observed.Datasets {
		if ids[d.Dataset.Name] != d.Dataset.ID {
			t.Errorf("dataset %s: id %q after the disk came back, %q before", d.Dataset.Name, d.Dataset.ID, ids[d.Dataset.Name])
		}
	}
}

// A disk whose call is slow (sim) is err in upstream's last_reconciliation
// and in our view, with the call, for how long and its deadline, rebuilt as
// it lasts; its datasets wait for it; once the call ends they are ok. Every
// GET /inventory is checked against upstream's document.
func TestSlowDiskCallIsErrInInventory(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir()})
	run(t, a)
	c := newClient(t, a)
	w := newWire(t, a)
	slow, fine := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1)
	disk := sledconfigtest.DiskFor(*slow.FilesystemPool)
	setFaults(t, a, `{"zones": {}, "disks": {"`+disk.Identity.Serial+`": {"ensure": "6s"}}}`)
	putZones(t, c, 1, slow, fine)

	var onPool []string // the ids of the datasets on the slow disk's pool
	for _, d := range sledconfigtest.Config(1, slow, fine).StorageDatasets() {
		if d.PoolID == disk.PoolID {
			onPool = append(onPool, d.ID)
		}
	}
	if len(onPool) == 0 {
		t.Fatal("no dataset on the slow disk's pool")
	}
	type result struct{ Result, Message string }
	last := func() (disks, datasets map[string]result) {
		x := w.do(http.MethodGet, "/inventory", nil, http.StatusOK)
		var inv struct {
			Last *struct {
				ExternalDisks map[string]result `json:"external_disks"`
				Datasets      map[string]result `json:"datasets"`
			} `json:"last_reconciliation"`
		}
		if err := json.Unmarshal(x.Body, &inv); err != nil {
			t.Fatal(err)
		}
		if inv.Last == nil {
			return nil, nil
		}
		return inv.Last.ExternalDisks, inv.Last.Datasets
	}
	call := regexp.MustCompile(`^creating pool ` + regexp.QuoteMeta(*slow.FilesystemPool) + ` for ([1-9][0-9]*)s \(deadline 1m0s\)$`)
	// slowFor says for how long the disk is reported busy with its call, if
	// it is, and that its datasets wait for it with the same words.
	slowFor := func() (int, string) {
		disks, datasets := last()
		d := disks[disk.ID]
		m := call.FindStringSubmatch(d.Message)
		if d.Result != "err" || m == nil {
			return 0, fmt.Sprintf("disk %+v", d)
		}
		for _, id := range onPool {
			if want := "waiting for disk " + disk.ID + ": " + d.Message; datasets[id] != (result{"err", want}) {
				return 0, fmt.Sprintf("dataset %s %+v, want err %q", id, datasets[id], want)
			}
		}
		n, _ := strconv.Atoi(m[1])
		return n, d.Message
	}
	var first int
	waitFor(t, "the slow disk err with its call", func() (bool, string) {
		n, state := slowFor()
		first = n
		return n > 0, state
	})
	waitFor(t, "the slow disk's call reported as it lasts", func() (bool, string) {
		n, state := slowFor()
		return n > first, state
	})
	inv, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range inv.Storage.Disks {
		if d.ID == disk.ID && (d.Result.OK || !call.MatchString(d.Result.Message) || d.Activity == "") {
			t.Errorf("GET /agent/inventory: the slow disk %+v", d)
		}
	}

	setFaults(t, a, `{"zones": {}}`)
	waitFor(t, "the slow disk ok once its call ended", func() (bool, string) {
		disks, datasets := last()
		if disks[disk.ID].Result != "ok" {
			return false, fmt.Sprintf("disk %+v", disks[disk.ID])
		}
		for _, id := range onPool {
			if datasets[id].Result != "ok" {
				return false, fmt.Sprintf("dataset %s %+v", id, datasets[id])
			}
		}
		return true, ""
	})
	waitStates(t, c, map[string]string{fine.Name(): "running", slow.Name(): "running"})
}

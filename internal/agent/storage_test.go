package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
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
	a := newAgent(t, agent.Config{DataDir: dir})
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

	again := newAgent(t, agent.Config{DataDir: dir})
	run(t, again)
	waitFor(t, "the restarted agent's storage", func() (bool, string) { return storageDone(again.Storage().Status()) })
	for _, d := range again.Storage().Status().Observed.Datasets {
		if ids[d.Dataset.Name] != d.Dataset.ID {
			t.Errorf("dataset %s: id %q after the restart, %q before", d.Dataset.Name, d.Dataset.ID, ids[d.Dataset.Name])
		}
	}
}

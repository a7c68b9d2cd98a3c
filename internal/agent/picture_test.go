package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// GET /inventory's last reconciliation is one picture of one config: from
// a fresh agent's first PUT of the example config until its storage is
// realised, every read that has zone results has a result for every disk
// and dataset of that config too, and a reconciler reported idle has an
// answer of the storage reconciler for all of them.
func TestInventoryIsOnePictureFromTheFirstPut(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir(), UnderlayIP: exampleSled})
	run(t, a)
	c := newClient(t, a)
	doc := sledconfig.Example()
	example, err := sledconfig.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	wantDisks, wantDatasets := len(example.StorageDisks()), len(example.StorageDatasets())
	if err := c.PutConfig(t.Context(), doc); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(waitDeadline)
	for reads := 0; ; reads++ {
		resp, err := hc.Get("http://" + a.Addr() + "/inventory")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var inv struct {
			Status struct {
				Status string `json:"status"`
			} `json:"reconciler_status"`
			Last *struct {
				Config        struct{ Generation uint64 } `json:"last_reconciled_config"`
				Zones         map[string]result           `json:"zones"`
				ExternalDisks map[string]result           `json:"external_disks"`
				Datasets      map[string]result           `json:"datasets"`
			} `json:"last_reconciliation"`
		}
		if err := json.Unmarshal(body, &inv); err != nil {
			t.Fatalf("read %d: %v", reads, err)
		}
		lr := inv.Last
		if lr == nil || lr.Config.Generation != example.Generation || len(lr.Zones) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("no last reconciliation of the example after %d reads", reads)
			}
			continue
		}
		if len(lr.ExternalDisks) != wantDisks || len(lr.Datasets) != wantDatasets {
			t.Fatalf("read %d (%s): %d zone results but %d/%d disk and %d/%d dataset results", reads, inv.Status.Status,
				len(lr.Zones), len(lr.ExternalDisks), wantDisks, len(lr.Datasets), wantDatasets)
		}
		var waiting string
		if d, ds := notYet(lr.ExternalDisks), notYet(lr.Datasets); d != "" || ds != "" {
			waiting = "disks: " + d + "; datasets: " + ds
		}
		if inv.Status.Status == "idle" && waiting != "" {
			t.Fatalf("read %d: the reconciler is idle, but the storage reconciler has not answered for %s", reads, waiting)
		}
		if inv.Status.Status == "idle" && allOK(lr.ExternalDisks) && allOK(lr.Datasets) {
			t.Logf("one picture in each of %d reads", reads+1)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("storage not realised after %d reads: %s, waiting for %s", reads, inv.Status.Status, waiting)
		}
	}
}

type result struct {
	Result  string `json:"result"`
	Message string `json:"message"`
}

// notYet names the results that are no answer yet (how many, and a few).
func notYet(m map[string]result) string {
	var out []string
	for id, r := range m {
		if r.Result == "err" && strings.Contains(r.Message, "not yet") {
			out = append(out, fmt.Sprintf("%s (%s)", id, r.Message))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return fmt.Sprintf("%d results, such as %s", len(out), strings.Join(out[:min(2, len(out))], ", "))
}

func allOK(m map[string]result) bool {
	for _, r := range m {
		if r.Result != "ok" {
			return false
		}
	}
	return true
}

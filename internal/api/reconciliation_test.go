package api

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// The last reconciliation written from its parts, each encoded once (the
// zones per reconciler snapshot, the storage results per storage status),
// says what json.Marshal says of the whole, converted at once.
func TestLastReconciliationSegmentsAgreeWithTheWhole(t *testing.T) {
	zones := sledconfigtest.Crucibles(2)
	// The storage status of the config's disks and datasets: one of each
	// ok, one of each not.
	disks := sledconfigtest.Config(7, zones...).StorageDisks()
	datasets := sledconfigtest.Config(7, zones...).StorageDatasets()
	st := storage.Status{
		Version: 3,
		Disks: []storage.DiskStatus{
			{ID: disks[0].ID, PoolID: disks[0].PoolID, Identity: disks[0].Identity, Result: storage.Result{OK: true}},
			{ID: disks[1].ID, PoolID: disks[1].PoolID, Identity: disks[1].Identity, Result: storage.Result{Message: "opening pool oxp_… for 2s (deadline 1m0s)"}},
		},
		Datasets: []storage.DatasetStatus{
			{ID: datasets[0].ID, Name: datasets[0].Name(), Result: storage.Result{OK: true}},
			{ID: datasets[1].ID, Name: datasets[1].Name(), Result: storage.Result{Message: "quota exceeded"}},
		},
		Orphans: []storage.Orphan{
			{Name: "oxp_x/crypt/debug", Kind: "debug", PoolID: "x", Reason: "kept"},
			{Name: "oxp_x/crypt/zone/oxz_y", Kind: "zone/oxz_y", PoolID: "x", Destroyed: true},
		},
	}
	for _, override := range []bool{false, true} {
		cfg := sledconfigtest.Config(7, zones...)
		if override {
			id := "9a2e4f3c-9c6d-4e3a-8f5b-2c3d4e5f6a09"
			cfg.RemoveMupdateOverride = &id
		}
		doc, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := sledconfig.Parse(doc)
		if err != nil {
			t.Fatal(err)
		}
		last := &reconciler.Reconciliation{Config: parsed, Zones: map[string]reconciler.Result{
			zones[0].ID: {OK: true},
			zones[1].ID: {Message: "starting for 3s (deadline 2m0s)"},
		}}
		s := &Server{deps: Deps{Storage: staticStorage{&st}}}
		enc, err := s.encodeStorage(&st, parsed)
		if err != nil {
			t.Fatal(err)
		}
		_, zonesJSON, err := s.zoneResults(last)
		if err != nil {
			t.Fatal(err)
		}
		parts := bytes.Join(lastReconciliationSegments(last, enc.results, zonesJSON), nil)
		whole, err := json.Marshal(toUpstreamReconciliation(last, &st))
		if err != nil {
			t.Fatal(err)
		}
		var got, want any
		if err := json.Unmarshal(parts, &got); err != nil {
			t.Fatalf("override %v: the parts are not JSON: %v\n%s", override, err, parts)
		}
		if err := json.Unmarshal(whole, &want); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("override %v: the parts differ from the whole (-whole +parts):\n%s", override, d)
		}
	}
}

// staticStorage is a storage reconciler whose status never changes.
type staticStorage struct{ st *storage.Status }

func (s staticStorage) Status() storage.Status { return *s.st }
func (s staticStorage) Version() uint64        { return s.st.Version }

// A pass that had no config (the first, before any was put) is not turned
// into a running status while storage works on a config: upstream's
// running status carries the config it works on, and one without it
// validates against no variant. It stays idle.
func TestReconcilerStatusWithoutAConfigStaysIdle(t *testing.T) {
	done := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	st := reconciler.Status{Phase: reconciler.PhaseIdle, CompletedAt: done, RanFor: time.Millisecond, Last: &reconciler.Reconciliation{}}
	rs := reconcilerStatus(st, true, done.Add(time.Second))
	if rs.Status != "idle" || rs.Config != nil || rs.CompletedAt == nil || !rs.CompletedAt.Equal(done) {
		t.Fatalf("status %+v, want idle since %v", rs, done)
	}
	st.Last.Config = &sledconfig.Config{Generation: 2}
	if rs := reconcilerStatus(st, true, done.Add(time.Second)); rs.Status != "running" || rs.Config == nil {
		t.Fatalf("with a config, storage pending: %+v, want running with it", rs)
	}
}

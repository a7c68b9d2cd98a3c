package storage_test

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// Every disk rule: absent, blank, ours, ours with another id, foreign,
// internal; and a refused disk is never written, not even after hours.
func TestDiskRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		absent, blank, ours, other, foreign, internal := diskCfg("absent"), diskCfg("blank"), diskCfg("ours"), diskCfg("other"), diskCfg("foreign"), diskCfg("internal")
		b.addDisk(blank.Identity.Serial)
		b.addPool(ours.Identity.Serial, ours.PoolID)
		b.addPool(other.Identity.Serial, "pool-somebody-else")
		f := b.addDisk(foreign.Identity.Serial)
		f.Content, f.Foreign = storage.ContentForeign, "an ext4 filesystem"
		b.addDisk(internal.Identity.Serial).Variant = storage.VariantM2

		h := start(t, b, storage.Options{})
		defer h.stop()
		disks := []storage.DiskConfig{absent, blank, ours, other, foreign, internal}
		var datasets []storage.DatasetConfig
		for _, d := range disks {
			datasets = append(datasets, dsCfg("debug-"+d.ID, d.PoolID, "debug"))
		}
		h.update(disks, datasets)

		wantResult(t, "absent", h.disk(absent.ID).Result, "disk not found")
		wantResult(t, "blank", h.disk(blank.ID).Result, "")
		wantResult(t, "ours", h.disk(ours.ID).Result, "")
		wantResult(t, "other id", h.disk(other.ID).Result, "holds pool oxp_pool-somebody-else, not the configured oxp_pool-other: unexpected pool id")
		wantResult(t, "foreign", h.disk(foreign.ID).Result, "holds an ext4 filesystem")
		wantResult(t, "internal", h.disk(internal.ID).Result, "internal (M.2)")
		for _, d := range []storage.DiskConfig{blank, ours} {
			wantResult(t, "debug on "+d.ID, h.dataset(storage.DatasetName(d.PoolID, "debug")).Result, "")
		}
		wantResult(t, "debug on the foreign disk", h.dataset(storage.DatasetName(foreign.PoolID, "debug")).Result,
			"pool oxp_pool-foreign is not managed: disk disk-foreign: disk v/m/serial-foreign holds an ext4 filesystem")
		wantResult(t, "debug on the absent disk", h.dataset(storage.DatasetName(absent.PoolID, "debug")).Result, "pool oxp_pool-absent is not managed")

		calls := h.b.transcript(0)
		for _, c := range []string{"create_pool oxp_pool-blank", "open_pool oxp_pool-blank", "open_pool oxp_pool-ours"} {
			if !has(calls, c) {
				t.Errorf("no %q in %q", c, calls)
			}
		}
		if has(calls, "create_pool oxp_pool-ours") {
			t.Errorf("our pool was made again: %q", calls)
		}

		// Hours later: the refused disks were never touched, the absent one
		// was looked for (listings only), on a capped backoff.
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		for _, c := range h.b.transcript(0) {
			for _, d := range []storage.DiskConfig{other, foreign, internal, absent} {
				if strings.Contains(c, d.PoolID) {
					t.Errorf("refused or absent disk %s touched: %q", d.ID, c)
				}
			}
			if strings.Contains(c, "pool-somebody-else") {
				t.Errorf("another pool touched: %q", c)
			}
		}
		if st := h.disk(absent.ID); st.Attempts < 5 || st.NextRetry == nil || time.Until(*st.NextRetry) > time.Minute {
			t.Errorf("absent disk: %d attempts, next retry %v; want retries capped at 1m", st.Attempts, st.NextRetry)
		}
		if st := h.disk(foreign.ID); st.Attempts != 0 || st.NextRetry != nil {
			t.Errorf("foreign disk is retried: %+v", st)
		}

		// The disk arrives: the next retry makes its pool.
		b.addDisk(absent.Identity.Serial)
		time.Sleep(time.Minute)
		synctest.Wait()
		wantResult(t, "absent, arrived", h.disk(absent.ID).Result, "")
	})
}

// A disk dropped from the config is closed, never destroyed: its pool and
// datasets stay, and the config's datasets on it say why they are not
// ensured.
func TestRemovedDiskClosedNotDestroyed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a, keep := diskCfg("a"), diskCfg("keep")
		b.addDisk(a.Identity.Serial)
		b.addDisk(keep.Identity.Serial)
		h := start(t, b, storage.Options{})
		defer h.stop()
		crdb := dsCfg("crdb", a.PoolID, "cockroachdb")
		h.update([]storage.DiskConfig{a, keep}, []storage.DatasetConfig{crdb, dsCfg("debug-a", a.PoolID, "debug")})
		wantResult(t, "a", h.disk(a.ID).Result, "")

		n := b.ncalls()
		h.update([]storage.DiskConfig{keep}, []storage.DatasetConfig{crdb})
		calls := b.transcript(n)
		if !has(calls, "close_pool oxp_pool-a") {
			t.Errorf("pool of the removed disk not closed: %q", calls)
		}
		for _, c := range calls {
			if strings.HasPrefix(c, "destroy") || strings.HasPrefix(c, "create") {
				t.Errorf("removing a disk wrote: %q", c)
			}
		}
		for _, name := range []string{crdb.Name(), storage.DatasetName(a.PoolID, "debug")} {
			if _, ok := b.dataset(a.PoolID, name); !ok {
				t.Errorf("%s is gone", name)
			}
		}
		for _, d := range h.r.Status().Disks {
			if d.ID == a.ID {
				t.Errorf("removed disk still reported: %+v", d)
			}
		}
		wantResult(t, "crdb", h.dataset(crdb.Name()).Result, "pool oxp_pool-a is not managed: no disk in the config carries it")

		// Back in the config: adopted as it is.
		n = b.ncalls()
		h.update([]storage.DiskConfig{a, keep}, []storage.DatasetConfig{crdb})
		wantResult(t, "crdb, back", h.dataset(crdb.Name()).Result, "")
		for _, c := range b.transcript(n) {
			if strings.HasPrefix(c, "create") || strings.HasPrefix(c, "ensure") {
				t.Errorf("re-adding a disk wrote: %q", c)
			}
		}
	})
}

// Every dataset rule: another id (reported, never retried), properties set
// only when they differ, a pool not managed, a zone's root without the
// transient zone root.
func TestDatasetRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		debug := dsCfg("debug", a.PoolID, "debug")
		crdb := dsCfg("crdb", a.PoolID, "cockroachdb")
		crdb.Quota = ptr(100)
		crucible := dsCfg("crucible", a.PoolID, "crucible")
		b.addPool(a.Identity.Serial, a.PoolID,
			storage.Dataset{Name: debug.Name(), ID: "somebody-else"},
			storage.Dataset{Name: crdb.Name(), ID: crdb.ID, Quota: ptr(50), Compression: crdb.Compression},
			storage.Dataset{Name: crucible.Name(), ID: crucible.ID, Compression: crucible.Compression})
		h := start(t, b, storage.Options{})
		defer h.stop()
		lonely := dsCfg("lonely", "pool-nowhere", "debug")
		zoneRoot := dsCfg("zroot", a.PoolID, "zone/oxz_ntp_1")
		h.update([]storage.DiskConfig{a}, []storage.DatasetConfig{debug, crdb, crucible, lonely, zoneRoot})

		wantResult(t, "other id", h.dataset(debug.Name()).Result, "has id somebody-else, not the configured debug: dataset exists with another id")
		wantResult(t, "crdb", h.dataset(crdb.Name()).Result, "")
		wantResult(t, "crucible", h.dataset(crucible.Name()).Result, "")
		wantResult(t, "lonely", h.dataset(lonely.Name()).Result, "pool oxp_pool-nowhere is not managed: no disk in the config carries it")
		wantResult(t, "zone root", h.dataset(zoneRoot.Name()).Result, "the transient zone root oxp_pool-a/crypt/zone is not in the config")
		if d, _ := b.dataset(a.PoolID, crdb.Name()); d.Quota == nil || *d.Quota != 100 {
			t.Errorf("crdb quota: %v", d.Quota)
		}
		if d, _ := b.dataset(a.PoolID, debug.Name()); d.ID != "somebody-else" {
			t.Errorf("the other dataset was changed: %+v", d)
		}
		ensures := func() []string {
			var out []string
			for _, c := range b.transcript(0) {
				if strings.HasPrefix(c, "ensure_dataset") {
					out = append(out, c)
				}
			}
			return out
		}
		// Only crdb differed.
		if got := ensures(); !slices.Equal(got, []string{"ensure_dataset " + crdb.Name()}) {
			t.Errorf("ensures: %q", got)
		}

		// Hours of periodic passes: nothing more is written.
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if got := ensures(); len(got) != 1 {
			t.Errorf("ensures after 2h: %q", got)
		}
		if st := h.disk(a.ID); st.Attempts != 0 || st.NextRetry != nil {
			t.Errorf("a non-retryable error is retried: %+v", st)
		}

		// The config adds the transient zone root: both are made, the root
		// of the zones first.
		n := b.ncalls()
		zone := dsCfg("zone", a.PoolID, "zone")
		h.update([]storage.DiskConfig{a}, []storage.DatasetConfig{debug, crdb, crucible, zone, zoneRoot})
		want := []string{"ensure_dataset " + zone.Name(), "ensure_dataset " + zoneRoot.Name()}
		var got []string
		for _, c := range b.transcript(n) {
			if strings.HasPrefix(c, "ensure") {
				got = append(got, c)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("ensures: %q, want %q", got, want)
		}
		wantResult(t, "zone root", h.dataset(zoneRoot.Name()).Result, "")
	})
}

// Orphans: durable datasets the config no longer names are destroyed (unless
// a zone still uses them); zone, debug and local storage datasets, and
// zones' roots, are kept and reported; what is not ours is not touched.
func TestOrphans(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		name := func(kind string) string { return storage.DatasetName(a.PoolID, kind) }
		var found []storage.Dataset
		for _, kind := range []string{"crucible", "cockroachdb", "internal_dns", "zone", "zone/oxz_gone", "debug", "local_storage", "local_storage_unencrypted", "something_else"} {
			found = append(found, storage.Dataset{Name: name(kind), ID: "old-" + kind})
		}
		found = append(found, storage.Dataset{Name: "oxp_pool-a/crypt", ID: ""}, storage.Dataset{Name: "oxp_pool-a/crypt/crucible", ID: "odd"})
		b.addPool(a.Identity.Serial, a.PoolID, found...)
		var released atomic.Bool
		h := start(t, b, storage.Options{InUse: func(ds string) bool { return ds == name("internal_dns") && !released.Load() }})
		defer h.stop()
		h.update([]storage.DiskConfig{a}, nil)

		var destroyed []string
		for _, c := range b.transcript(0) {
			if strings.HasPrefix(c, "destroy") {
				destroyed = append(destroyed, strings.TrimPrefix(c, "destroy_dataset "))
			}
		}
		slices.Sort(destroyed)
		if want := []string{name("crucible"), name("cockroachdb")}; !slices.Equal(destroyed, want) {
			t.Errorf("destroyed %q, want %q", destroyed, want)
		}
		orphans := map[string]storage.Orphan{}
		for _, o := range h.r.Status().Orphans {
			orphans[o.Name] = o
		}
		for kind, want := range map[string]string{
			"crucible":                  "destroyed",
			"cockroachdb":               "destroyed",
			"internal_dns":              "in use by a zone",
			"zone":                      "expected on every managed disk",
			"debug":                     "expected on every managed disk",
			"local_storage":             "expected on every managed disk",
			"local_storage_unencrypted": "expected on every managed disk",
			"zone/oxz_gone":             "removed with its zone",
		} {
			o, ok := orphans[name(kind)]
			switch {
			case !ok:
				t.Errorf("orphan %s not reported", name(kind))
			case !strings.Contains(o.Reason, want) || o.Destroyed != (want == "destroyed") || o.ID != "old-"+kind:
				t.Errorf("orphan %s: %+v, want reason %q", name(kind), o, want)
			}
		}
		for _, n := range []string{name("something_else"), "oxp_pool-a/crypt", "oxp_pool-a/crypt/crucible"} {
			if _, ok := orphans[n]; ok {
				t.Errorf("%s is not ours but reported as an orphan", n)
			}
			if _, ok := b.dataset(a.PoolID, n); !ok {
				t.Errorf("%s is not ours but is gone", n)
			}
		}

		// The zone stops using it: the next pass (a Poke) destroys it.
		released.Store(true)
		h.r.Poke()
		synctest.Wait()
		if _, ok := b.dataset(a.PoolID, name("internal_dns")); ok {
			t.Error("orphan no longer in use not destroyed")
		}
	})
}

// Every published snapshot has a new Version, so readers can cache what
// they derive from a Status by it.
func TestStatusVersionChangesWithEverySnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		d := diskCfg("ours")
		b.addPool(d.Identity.Serial, d.PoolID)
		h := start(t, b, storage.Options{})
		defer h.stop()
		v0 := h.r.Status().Version
		h.update([]storage.DiskConfig{d}, nil)
		v1 := h.r.Status().Version
		if v1 <= v0 {
			t.Fatalf("version %d after an update, %d before", v1, v0)
		}
		if again := h.r.Status().Version; again != v1 {
			t.Errorf("version %d, then %d with nothing published", v1, again)
		}
		h.update([]storage.DiskConfig{d}, []storage.DatasetConfig{dsCfg("debug", d.PoolID, "debug")})
		if v2 := h.r.Status().Version; v2 <= v1 {
			t.Errorf("version %d after a dataset was added, %d before", v2, v1)
		}
	})
}

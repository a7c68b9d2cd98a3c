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

	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/reservoir"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// diskWorld is a sled with an image directory holding two disk files.
type diskWorld struct {
	images     string
	disk, data string
	sled       func() spec.Sled
}

func newDiskWorld(t *testing.T) diskWorld {
	t.Helper()
	images := t.TempDir()
	w := diskWorld{images: images, disk: filepath.Join(images, "disk.raw"), data: filepath.Join(images, "data.raw")}
	for _, f := range []string{w.disk, w.data} {
		if err := os.WriteFile(f, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w.sled = func() spec.Sled { return spec.Sled{Threads: 4, FileRoots: []string{images}} }
	return w
}

// manager is a manager on the sim runtime whose VMMs' disks lie in w's
// image directory, keeping its VMMs in dir ("" for none).
func (w diskWorld) manager(t *testing.T, dir string, res *reservoir.Account) *vmm.Manager {
	t.Helper()
	rt := sim.New(sim.Options{})
	opts := vmm.Options{
		PollWait: 100 * time.Millisecond, Identity: testIdentity, Sled: w.sled, Reservoir: res,
	}
	if dir != "" {
		opts.RecordDirs, opts.LegacyDir = recordDirs(dir), filepath.Join(dir, "legacy")
	}
	m := vmm.New(rt, vmm.InProcessHost{Sled: w.sled}, opts)
	rt.SetNotify(m.Poke)
	t.Cleanup(m.Close)
	return m
}

// vmmN is the n-th test VMM's id, instance and address.
func vmmN(n int) (id, instance, addr string) {
	return fmt.Sprintf("6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a%02d", n),
		fmt.Sprintf("0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a%02d", n),
		fmt.Sprintf("[fd00:1122:3344:101::1:%x]:12400", n)
}

// diskRegistration registers VMM n with its boot disk on path.
func diskRegistration(t *testing.T, n int, path string, readonly bool) vmm.Registration {
	t.Helper()
	_, instance, addr := vmmN(n)
	s := vmmtest.Spec()
	s["components"].(map[string]any)["boot-disk-backend"] = map[string]any{
		"type": "file_storage_backend", "component": map[string]any{"path": path, "readonly": readonly, "block_size": 512},
	}
	body := vmmtest.Body(instance, addr, s, nil)
	g, err := vmm.ParseGuest(body)
	if err != nil {
		t.Fatal(err)
	}
	return vmm.Registration{InstanceID: instance, PropolisAddr: netip.MustParseAddrPort(addr), Initial: vmm.RuntimeState{Gen: 1, State: "starting"}, Body: body, Guest: g}
}

func register(t *testing.T, m *vmm.Manager, n int, path string, readonly bool) error {
	t.Helper()
	id, _, _ := vmmN(n)
	_, err := m.Register(id, diskRegistration(t, n, path, readonly))
	return err
}

// wantHeld checks that err refuses VMM n's disk as held by VMM holder,
// and that the refused VMM left nothing.
func wantHeld(t *testing.T, m *vmm.Manager, dir string, err error, n, holder int, how string) {
	t.Helper()
	id, _, _ := vmmN(n)
	hid, _, _ := vmmN(holder)
	if !errors.Is(err, vmm.ErrFileHeld) || !strings.Contains(err.Error(), "is "+how+" of VMM "+hid) || !strings.Contains(err.Error(), `component "boot-disk-backend"`) {
		t.Fatalf("VMM %d: %v; want ErrFileHeld saying the file is %s of VMM %s", n, err, how, hid)
	}
	if _, err := m.Get(id); !errors.Is(err, vmm.ErrNotFound) {
		t.Errorf("a refused VMM is known: %v", err)
	}
	if dir != "" {
		if _, err := os.Stat(filepath.Join(dir, id+".json")); !os.IsNotExist(err) {
			t.Errorf("a refused VMM left its record: %v", err)
		}
	}
}

// A file is the writable disk of one VMM at a time: a second and a third
// VMM registering it, writable or not, are refused naming the first, and
// change nothing; once the first is unregistered, another may have it.
func TestWritableDiskIsOneVMMs(t *testing.T) {
	w := newDiskWorld(t)
	dir := t.TempDir()
	res := reservoir.NewAccount(1 << 40)
	m := w.manager(t, dir, res)
	if err := register(t, m, 1, w.disk, false); err != nil {
		t.Fatal(err)
	}
	used := res.Used()
	wantHeld(t, m, dir, register(t, m, 2, w.disk, false), 2, 1, "the writable disk")
	// The same file by another spelling of its name.
	wantHeld(t, m, dir, register(t, m, 3, w.images+"//./disk.raw", false), 3, 1, "the writable disk")
	wantHeld(t, m, dir, register(t, m, 3, w.disk, true), 3, 1, "the writable disk")
	if res.Used() != used {
		t.Errorf("refused VMMs hold %d bytes of the reservoir", res.Used()-used)
	}
	// Another file is free.
	if err := register(t, m, 4, w.data, false); err != nil {
		t.Fatal(err)
	}
	id1, _, _ := vmmN(1)
	if _, err := m.Unregister(context.Background(), id1); err != nil {
		t.Fatal(err)
	}
	if err := register(t, m, 2, w.disk, false); err != nil {
		t.Fatalf("once its holder is unregistered: %v", err)
	}
}

// Any number of VMMs may read one file; none may write it then.
func TestReadOnlyDiskIsShared(t *testing.T) {
	w := newDiskWorld(t)
	m := w.manager(t, "", nil)
	for n := 1; n <= 3; n++ {
		if err := register(t, m, n, w.disk, true); err != nil {
			t.Fatalf("VMM %d reading the file: %v", n, err)
		}
	}
	wantHeld(t, m, "", register(t, m, 4, w.disk, false), 4, 1, "a read-only disk")
}

// A restarted agent holds its VMMs' files again, from their records, and
// from their specs for records that do not keep them.
func TestAdoptedVMMsHoldTheirDisks(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("record without disks %v", old), func(t *testing.T) {
			w := newDiskWorld(t)
			dir := t.TempDir()
			m := w.manager(t, dir, nil)
			if err := register(t, m, 1, w.disk, false); err != nil {
				t.Fatal(err)
			}
			m.Close()
			id1, _, _ := vmmN(1)
			if old {
				// An earlier agent's plain file, which kept no disks.
				led, err := ledger.Open(recordDirs(dir), id1+".json", nil)
				if err != nil {
					t.Fatal(err)
				}
				lr, _, err := led.Read()
				var rec map[string]json.RawMessage
				if err == nil {
					err = json.Unmarshal(lr.Data, &rec)
				}
				if err != nil || rec["disks"] == nil {
					t.Fatalf("the record keeps no disks: %v %s", err, lr.Data)
				}
				delete(rec, "disks")
				data, _ := json.Marshal(rec)
				if err := os.MkdirAll(filepath.Join(dir, "legacy"), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "legacy", id1+".json"), data, 0o600); err != nil {
					t.Fatal(err)
				}
				if _, err := led.Remove(); err != nil {
					t.Fatal(err)
				}
			}
			m2 := w.manager(t, dir, nil)
			if n, err := m2.Resume(); n != 1 || err != nil {
				t.Fatalf("Resume: %d, %v", n, err)
			}
			wantHeld(t, m2, dir, register(t, m2, 2, w.disk, false), 2, 1, "the writable disk")
			if _, err := m2.Unregister(context.Background(), id1); err != nil {
				t.Fatal(err)
			}
			if err := register(t, m2, 2, w.disk, false); err != nil {
				t.Fatalf("once the adopted holder is unregistered: %v", err)
			}
		})
	}
}

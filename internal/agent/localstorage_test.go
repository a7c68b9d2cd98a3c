package agent_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// The pools of the local storage tests: localPool has a
// local_storage_unencrypted dataset, barePool none.
const (
	localPool = "a7e1c0de-0000-4000-8000-00000000100a"
	barePool  = "a7e1c0de-0000-4000-8000-00000000100b"
	allocA    = "2bbf0908-21da-4bc3-882b-1a1e715c54bd"
	allocB    = "3ccf0908-21da-4bc3-882b-1a1e715c54be"
)

// localStorageDoc is a config of no zones whose disks carry the pools
// local (each with a debug and a local_storage_unencrypted dataset) and
// bare (a debug dataset only), their disks' names prefixed.
func localStorageDoc(t *testing.T, gen uint64, prefix string, local, bare []string) []byte {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(mustJSON(t, sledconfigtest.ConfigOnVdevs(gen, prefix)), &c); err != nil {
		t.Fatal(err)
	}
	disks, datasets := map[string]any{}, map[string]any{}
	for _, id := range append(slices.Clone(local), bare...) {
		pool := storage.PoolName(id)
		d := sledconfigtest.DiskFor(pool)
		d.Identity.Serial = "synthetic-serial-" + prefix + sledconfigtest.VdevName(pool)
		disks[d.ID] = d
		kinds := []string{"debug"}
		if slices.Contains(local, id) {
			kinds = append(kinds, "local_storage_unencrypted")
		}
		for _, k := range kinds {
			ds := sledconfigtest.DatasetFor(sledconfig.DatasetName{PoolName: pool, Kind: k})
			datasets[ds.ID] = ds
		}
	}
	c["disks"], c["datasets"] = disks, datasets
	return mustJSON(t, c)
}

// waitLocalStorage waits for pool's local_storage_unencrypted dataset to
// be ensured.
func waitLocalStorage(t *testing.T, a *agent.Agent, pool string) {
	t.Helper()
	waitFor(t, "pool "+pool+"'s local storage", func() (bool, string) {
		_, err := a.Storage().PoolDataset(pool, "local_storage_unencrypted")
		return err == nil, fmt.Sprint(err)
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ensureLocal(pool, dataset string, datasetSize, volumeSize uint64, encrypted bool) []byte {
	return fmt.Appendf(nil, `{"zpool_id":%q,"dataset_id":%q,"dataset_size":%d,"volume_size":%d,"encrypted_at_rest":%v}`, pool, dataset, datasetSize, volumeSize, encrypted)
}

func deleteLocal(pool, dataset string, encrypted bool) []byte {
	return fmt.Appendf(nil, `{"zpool_id":%q,"dataset_id":%q,"encrypted_at_rest":%v}`, pool, dataset, encrypted)
}

// zvolPath is upstream's device path of pool's allocation dataset.
func zvolPath(pool, dataset string) string {
	return "/dev/zvol/rdsk/oxp_" + pool + "/local_storage_unencrypted/" + dataset + "/vol"
}

// nexusBody is an InstanceEnsureBody as upstream's Nexus (omicron
// nexus/src/app/instance_platform) builds one for an instance whose disks
// are on local storage: each disk an NVMe device "<disk id>:device" on PCI
// device 0x10 on, has_write_cache false (a /dev/zvol/rdsk path), backed by
// a file_storage_backend "<disk id>" whose path is the delegated zvol's
// device, with 30 workers; the boot settings naming the first disk; the
// NIC a virtio_nic "<nic id>:device" on device 8 whose backend "<nic id>"
// has an empty vnic_name (the sled agent names it); the cloud-init seed a
// virtio disk "cloud-init-dev" on device 0x18 backed by a blob
// "cloud-init-backend"; com1 to com4 and pvpanic. local_config lists each
// disk's zvol in delegated_zvols; and the virtio socket "vsock" every
// instance gets, guest CID 16 on device 0x19, which this sled accepts and
// does not realise (spec.NotRealised).
func nexusBody(addr string, pool string, disks ...string) []byte {
	s := map[string]any{
		"board": map[string]any{"chipset": map[string]any{"type": "i440_fx", "value": map[string]any{"enable_pcie": false}},
			"cpuid": nil, "cpus": 1, "memory_mb": vmmtest.MemoryMiB},
		"smbios": nil,
	}
	c := map[string]any{
		"com1":    comp("serial_port", map[string]any{"num": "com1"}),
		"com2":    comp("serial_port", map[string]any{"num": "com2"}),
		"com3":    comp("serial_port", map[string]any{"num": "com3"}),
		"com4":    comp("serial_port", map[string]any{"num": "com4"}),
		"pvpanic": comp("qemu_pvpanic", map[string]any{"enable_isa": true}),
		"vsock":   comp("virtio_socket", map[string]any{"guest_cid": 16, "pci_path": map[string]any{"bus": 0, "device": 0x19, "function": 0}}),
		vmmtest.NICID + ":device": comp("virtio_nic", map[string]any{"backend_id": vmmtest.NICID, "interface_id": vmmtest.NICID,
			"pci_path": map[string]any{"bus": 0, "device": 8, "function": 0}}),
		vmmtest.NICID:    comp("virtio_network_backend", map[string]any{"vnic_name": ""}),
		"cloud-init-dev": comp("virtio_disk", map[string]any{"backend_id": "cloud-init-backend", "pci_path": map[string]any{"bus": 0, "device": 0x18, "function": 0}}),
		"cloud-init-backend": comp("blob_storage_backend", map[string]any{
			"base64": base64.StdEncoding.EncodeToString([]byte("instance-id: vm0\nlocal-hostname: vm0\n")), "readonly": true}),
	}
	var zvols []any
	for i, d := range disks {
		serial := make([]int, 20)
		for j := range fmt.Sprintf("disk%d", i) {
			serial[j] = int(fmt.Sprintf("disk%d", i)[j])
		}
		c[d+":device"] = comp("nvme_disk", map[string]any{"backend_id": d, "has_write_cache": false,
			"pci_path": map[string]any{"bus": 0, "device": 0x10 + i, "function": 0}, "serial_number": serial})
		c[d] = comp("file_storage_backend", map[string]any{"path": zvolPath(pool, d), "readonly": false, "block_size": 512, "workers": 30})
		zvols = append(zvols, map[string]any{"type": "local_storage_unencrypted", "zpool_id": pool, "dataset_id": d})
	}
	c["boot-settings"] = comp("boot_settings", map[string]any{"order": []any{map[string]any{"id": disks[0] + ":device"}}})
	s["components"] = c
	body := vmmtest.Body(testInstance, addr, s, nil)
	var b map[string]any
	if err := json.Unmarshal(body, &b); err != nil {
		panic(err)
	}
	lc := b["local_config"].(map[string]any)
	lc["delegated_zvols"] = zvols
	lc["nics"].([]any)[0].(map[string]any)["ip_config"] = map[string]any{"type": "v4", "value": map[string]any{"ip": "172.30.0.5", "subnet": "172.30.0.0/22", "transit_ips": []any{}}}
	lc["primary_nic_mtu"] = nil
	lc["external_ips"] = map[string]any{"v4": nil, "v6": nil}
	lc["dhcp_config"] = map[string]any{"dns_servers": []any{}, "host_domain": nil, "search_domains": []any{}}
	b["migration_id"] = nil
	b["metadata"] = map[string]any{"project_id": "5b0a4d2e-1c3f-4e5a-8b6c-7d8e9f0a1b2c", "silo_id": "6c1b5e3f-2d4a-4f6b-9c7d-8e9f0a1b2c3d"}
	out, err := json.Marshal(b)
	if err != nil {
		panic(err)
	}
	return out
}

// doNexus is w.do for a body of nexusBody: the answer is checked against
// upstream's document, and so is the body, but for its SpecKeys. Nexus
// keys a disk's or NIC's backend by its UUID (SpecKey::Uuid), which
// upstream's document cannot validate: its SpecKey is a oneOf of a UUID
// string and any string, which a UUID matches twice. The body is checked
// with each backend_id made a plain name, the only change.
func (w *wire) doNexus(method, path string, body []byte, status int, keys ...string) openapitest.Exchange {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.t.Context(), method, w.base+path, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("api-version", api.Version)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(withBody(req, body))
	if err != nil {
		w.t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	x := openapitest.Exchange{Request: req, RequestBody: body, Status: resp.StatusCode, Header: resp.Header, Body: got}
	if err := w.spec.CheckAnswer(x); err != nil {
		w.t.Errorf("%v\nanswer: %d %s", err, x.Status, x.Body)
	}
	named := string(body)
	for _, k := range keys {
		named = strings.ReplaceAll(named, `"backend_id":"`+k+`"`, `"backend_id":"key-`+k+`"`)
	}
	if named == string(body) {
		w.t.Fatalf("no backend_id of %v in the body", keys)
	}
	nx := x
	nx.RequestBody = []byte(named)
	if err := w.spec.Check(nx); err != nil {
		w.t.Errorf("the body, its SpecKeys named: %v", err)
	}
	if x.Status != status {
		w.t.Errorf("%s %s: %d %s, want %d", method, path, x.Status, x.Body, status)
	}
	return x
}

func withBody(req *http.Request, body []byte) *http.Request {
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	return req
}

func comp(typ string, c map[string]any) map[string]any {
	return map[string]any{"type": typ, "component": c}
}

// POST and DELETE /local-storage on the sim runtime, every exchange
// validated against upstream's document: an allocation is made once (the
// same request again changes nothing, another size is a 409), bad sizes
// and encryption are 400s, an unknown pool a 404, a pool without local
// storage a 409, storage not yet configured a 503; a delete is idempotent,
// refused while a VMM holds the volume; and a restarted agent finds the
// allocation as it was.
func TestLocalStorageOverTheWire(t *testing.T) {
	dir := t.TempDir()
	a := newAgent(t, agent.Config{DataDir: dir})
	stop := run(t, a)
	w := newWire(t, a)
	says := func(x []byte, want string) {
		t.Helper()
		if !strings.Contains(string(x), want) {
			t.Errorf("answer %s, want one saying %q", x, want)
		}
	}
	const gib = 1 << 30
	x := w.do(http.MethodPost, "/local-storage", ensureLocal(localPool, allocA, 2*gib, gib, false), http.StatusServiceUnavailable)
	says(x.Body, "no storage config yet")

	w.do(http.MethodPut, "/omicron-config", localStorageDoc(t, 2, "", []string{localPool}, []string{barePool}), http.StatusNoContent)
	waitLocalStorage(t, a, localPool)

	vol := filepath.Join(dir, "sim-datasets", "oxp_"+localPool, "local_storage_unencrypted", allocA, "vol")
	w.do(http.MethodPost, "/local-storage", ensureLocal(localPool, allocA, 2*gib, gib, false), http.StatusNoContent)
	st, err := os.Stat(vol)
	if err != nil || st.Size() != gib {
		t.Fatalf("the volume: %v, %v", st, err)
	}
	mark := func(s string) {
		f, err := os.OpenFile(vol, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte(s), 0)
		f.Close()
	}
	marked := func() string {
		b := make([]byte, 4)
		f, err := os.Open(vol)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.ReadAt(b, 0)
		return string(b)
	}
	mark("data")
	w.do(http.MethodPost, "/local-storage", ensureLocal(localPool, allocA, 2*gib, gib, false), http.StatusNoContent)
	if marked() != "data" {
		t.Errorf("the same request again changed the volume")
	}

	for _, c := range []struct {
		body   []byte
		status int
		says   string
	}{
		{ensureLocal(localPool, allocA, 4*gib, 2*gib, false), http.StatusConflict, "holds 1073741824 bytes, not volume_size 2147483648"},
		{ensureLocal(localPool, allocB, gib, 2*gib, false), http.StatusBadRequest, "dataset_size 1073741824 is less than volume_size 2147483648"},
		{ensureLocal(localPool, allocB, gib, 0, false), http.StatusBadRequest, "volume_size 0"},
		{ensureLocal(localPool, allocB, gib, 1000, false), http.StatusBadRequest, "not a multiple of 4096"},
		{ensureLocal(localPool, allocB, 2*gib, gib, true), http.StatusBadRequest, "using encrypted local storage not supported: encryption at rest is not available on this sled"},
		{ensureLocal("a7e1c0de-0000-4000-8000-0000000010ff", allocB, 2*gib, gib, false), http.StatusNotFound, "pool oxp_a7e1c0de-0000-4000-8000-0000000010ff: no disk of this sled's config carries the pool"},
		{ensureLocal(barePool, allocB, 2*gib, gib, false), http.StatusConflict, "dataset oxp_" + barePool + "/local_storage_unencrypted: this sled's config has no such dataset on the pool"},
	} {
		x := w.do(http.MethodPost, "/local-storage", c.body, c.status)
		says(x.Body, c.says)
	}
	if st, _ := os.Stat(vol); st.Size() != gib || marked() != "data" {
		t.Errorf("refused requests changed the volume")
	}
	if _, err := os.Stat(filepath.Dir(filepath.Join(filepath.Dir(vol), "..", allocB, "vol"))); !os.IsNotExist(err) {
		t.Errorf("a refused allocation left its directory: %v", err)
	}
	x = w.do(http.MethodDelete, "/local-storage", deleteLocal(localPool, allocB, true), http.StatusBadRequest)
	says(x.Body, "encryption at rest is not available on this sled")

	// A VMM whose disk is the volume holds it.
	w.doNexus(http.MethodPut, "/vmms/"+testVMM, nexusBody(okAddr, localPool, allocA), http.StatusOK, allocA, vmmtest.NICID)
	x = w.do(http.MethodDelete, "/local-storage", deleteLocal(localPool, allocA, false), http.StatusConflict)
	says(x.Body, "is a disk of VMM "+testVMM)
	if marked() != "data" {
		t.Fatal("a refused delete removed the volume")
	}
	w.do(http.MethodDelete, "/vmms/"+testVMM, nil, http.StatusOK)

	// A restarted agent finds the allocation as it was.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	again := newAgent(t, agent.Config{DataDir: dir})
	run(t, again)
	waitLocalStorage(t, again, localPool)
	w = newWire(t, again)
	w.do(http.MethodPost, "/local-storage", ensureLocal(localPool, allocA, 2*gib, gib, false), http.StatusNoContent)
	if marked() != "data" {
		t.Error("the restarted agent's ensure changed the volume")
	}
	x = w.do(http.MethodPost, "/local-storage", ensureLocal(localPool, allocA, 2*gib, 2*gib, false), http.StatusConflict)
	says(x.Body, "holds 1073741824 bytes")

	w.do(http.MethodDelete, "/local-storage", deleteLocal(localPool, allocA, false), http.StatusNoContent)
	if _, err := os.Stat(filepath.Dir(vol)); !os.IsNotExist(err) {
		t.Errorf("after delete: %v", err)
	}
	w.do(http.MethodDelete, "/local-storage", deleteLocal(localPool, allocA, false), http.StatusNoContent)
	x = w.do(http.MethodDelete, "/local-storage", deleteLocal(barePool, allocA, false), http.StatusConflict)
	says(x.Body, "no such dataset")
}

// An instance as upstream's Nexus builds it, its disks on local storage
// through delegated zvols, registers once POST /local-storage made its
// volumes, and runs (sim runtime); our view says where each disk really
// is. Before the volume is made, the registration is a 400 naming the
// zvol; a zvol the registration does not delegate is refused as any path
// outside the sled's storage.
func TestNexusInstanceOnLocalStorageRuns(t *testing.T) {
	dir := t.TempDir()
	a, _ := start(t, agent.Config{DataDir: dir})
	w := newWire(t, a)
	w.do(http.MethodPut, "/omicron-config", localStorageDoc(t, 2, "", []string{localPool}, nil), http.StatusNoContent)
	waitLocalStorage(t, a, localPool)

	body := nexusBody(okAddr, localPool, allocA, allocB)
	w.do(http.MethodPost, "/local-storage", ensureLocal(localPool, allocA, 1<<30, 1<<30, false), http.StatusNoContent)
	x := w.doNexus(http.MethodPut, "/vmms/"+testVMM, body, http.StatusBadRequest, allocA, allocB, vmmtest.NICID)
	if want := fmt.Sprintf(`path \"%s\": delegated zvol (pool %s, dataset %s): `, zvolPath(localPool, allocB), localPool, allocB); !strings.Contains(string(x.Body), want) || !strings.Contains(string(x.Body), "not yet ensured (POST /local-storage makes it)") {
		t.Errorf("a zvol not yet made: %s", x.Body)
	}
	// Another VMM's zvol, not in this registration's delegated_zvols.
	var b map[string]any
	json.Unmarshal(body, &b)
	b["local_config"].(map[string]any)["delegated_zvols"] = []any{map[string]any{"type": "local_storage_unencrypted", "zpool_id": localPool, "dataset_id": allocB}}
	x = w.doNexus(http.MethodPut, "/vmms/"+testVMM, mustJSON(t, b), http.StatusBadRequest, allocA, allocB, vmmtest.NICID)
	if want := fmt.Sprintf(`path \"%s\" %s`, zvolPath(localPool, allocA), spec.ErrZvolNotDelegated); !strings.Contains(string(x.Body), want) {
		t.Errorf("a zvol not delegated: %s, want it saying %s", x.Body, want)
	}

	// An encrypted zvol: this sled has no encryption at rest.
	b["local_config"].(map[string]any)["delegated_zvols"] = []any{map[string]any{"type": "local_storage_encrypted", "zpool_id": localPool, "dataset_id": allocA}}
	x = w.doNexus(http.MethodPut, "/vmms/"+testVMM, mustJSON(t, b), http.StatusBadRequest, allocA, allocB, vmmtest.NICID)
	if want := "local_config.delegated_zvols[0]: type local_storage_encrypted: encrypted local storage is not supported: encryption at rest is not available on this sled"; !strings.Contains(string(x.Body), want) {
		t.Errorf("an encrypted zvol: %s, want it saying %s", x.Body, want)
	}

	w.do(http.MethodPost, "/local-storage", ensureLocal(localPool, allocB, 1<<30, 1<<29, false), http.StatusNoContent)
	w.doNexus(http.MethodPut, "/vmms/"+testVMM, body, http.StatusOK, allocA, allocB, vmmtest.NICID)
	w.do(http.MethodPut, "/vmms/"+testVMM+"/state", []byte(`{"state":{"type":"running"}}`), http.StatusOK)
	waitVMM(t, a, "running")

	code, view := call(t, a, http.MethodGet, "/agent/vmms", "")
	var page struct {
		Items []struct {
			Disks       []struct{ Component, Path, Named string }
			NotRealised []string `json:"not_realised"`
		}
	}
	if err := json.Unmarshal(view, &page); code != http.StatusOK || err != nil || len(page.Items) != 1 {
		t.Fatalf("GET /agent/vmms: %d %s (%v)", code, view, err)
	}
	got := map[string][2]string{}
	for _, d := range page.Items[0].Disks {
		got[d.Component] = [2]string{d.Path, d.Named}
	}
	for _, d := range []string{allocA, allocB} {
		want := [2]string{filepath.Join(dir, "sim-datasets", "oxp_"+localPool, "local_storage_unencrypted", d, "vol"), zvolPath(localPool, d)}
		if got[d] != want {
			t.Errorf("our view of disk %s: %q, want %q", d, got[d], want)
		}
	}
	// The virtio socket is accepted, and our view says the guest has none.
	if nr := page.Items[0].NotRealised; len(nr) != 1 || !strings.Contains(nr[0], `component "vsock" (virtio_socket): no host side for guest sockets`) {
		t.Errorf("our view's not_realised: %q, want the vsock named", nr)
	}
}

package vmm_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// Our view shows a VMM's registration as it came but for a blob backend's
// contents (a cloud-init seed: keys, passwords), of which it shows the size
// and SHA-256.
func TestViewWithholdsBlobContents(t *testing.T) {
	e := newEnv(t, simguest.Options{}, vmm.Options{})
	secret := []byte("#cloud-config\npassword: hunter2-very-secret\n")
	spec := vmmtest.Spec()
	spec["components"].(map[string]any)["cloud-init"] = map[string]any{"type": "blob_storage_backend",
		"component": map[string]any{"base64": base64.StdEncoding.EncodeToString(secret), "readonly": true}}
	body := vmmtest.Body("0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e", "[fd00:1122:3344:101::1:5]:12400", spec, map[string]any{"extra": "kept"})
	g, err := vmm.ParseGuest(body)
	if err != nil {
		t.Fatal(err)
	}
	reg := vmm.Registration{InstanceID: "0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e", PropolisAddr: netip.MustParseAddrPort("[fd00:1122:3344:101::1:5]:12400"),
		Initial: vmm.RuntimeState{Gen: 1, State: "starting"}, Body: body, Guest: g}
	if _, err := e.m.Register(vmmID, reg); err != nil {
		t.Fatal(err)
	}
	infos := [][]byte{}
	for _, info := range append(e.m.List(), mustGet(t, e.m)) {
		b, err := json.Marshal(info)
		if err != nil {
			t.Fatal(err)
		}
		infos = append(infos, b)
	}
	page, more := e.m.Page("", 10)
	if len(page) != 1 || more {
		t.Fatalf("page: %d VMMs, more %v", len(page), more)
	}
	b, _ := json.Marshal(page[0])
	infos = append(infos, b)
	sum := sha256.Sum256(secret)
	for _, b := range infos {
		if bytes.Contains(b, []byte(base64.StdEncoding.EncodeToString(secret))) || bytes.Contains(b, []byte("hunter2")) {
			t.Fatalf("the view shows a blob's contents: %s", b)
		}
		if !bytes.Contains(b, []byte(fmt.Sprintf("withheld: %d bytes, sha256 %s", len(secret), hex.EncodeToString(sum[:])))) {
			t.Errorf("the view does not say the blob's size and SHA-256: %s", b)
		}
		for _, kept := range []string{`"extra":"kept"`, `"hostname":"vm0"`, `"project_id":"11111111-2222-3333-4444-555555555555"`} {
			if !bytes.Contains(b, []byte(kept)) {
				t.Errorf("the view lost %s: %s", kept, b)
			}
		}
	}
}

func mustGet(t *testing.T, m *vmm.Manager) vmm.Info {
	t.Helper()
	info, err := m.Get(vmmID)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// A sled takes MaxVMMs VMMs; one more is refused (ErrCapacity) and changes
// nothing, and a VMM registered again is still answered.
func TestVMMsBeyondTheMostASledTakesAreRefused(t *testing.T) {
	e := newEnv(t, simguest.Options{}, vmm.Options{MaxVMMs: 3})
	id := func(i int) string { return fmt.Sprintf("6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a%02d", i) }
	reg := func(i int) vmm.Registration {
		return vmmtest.Registration(fmt.Sprintf("0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a%02d", i), fmt.Sprintf("[fd00:1122:3344:101::1:%x]:12400", i+1), nil)
	}
	for i := range 3 {
		if _, err := e.m.Register(id(i), reg(i)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.m.Register(id(3), reg(3))
	if !errors.Is(err, vmm.ErrCapacity) || !strings.Contains(err.Error(), "3 VMMs") {
		t.Fatalf("a fourth VMM: %v, want ErrCapacity naming the 3", err)
	}
	if len(e.m.List()) != 3 {
		t.Errorf("%d VMMs after a refusal", len(e.m.List()))
	}
	if _, err := e.m.Register(id(1), reg(1)); err != nil {
		t.Errorf("registering a held VMM again: %v", err)
	}
	// Pages of two: every VMM once, in order, and the last says so.
	var seen []string
	after := ""
	for range 3 {
		page, more := e.m.Page(after, 2)
		for _, v := range page {
			seen = append(seen, v.ID)
		}
		if !more {
			break
		}
		after = page[len(page)-1].ID
	}
	if strings.Join(seen, ",") != strings.Join([]string{id(0), id(1), id(2)}, ",") {
		t.Errorf("pages gave %v", seen)
	}
}

package agent_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// A disk's file is judged as opened at registration: a path that is a
// symbolic link, or whose file has another hard link (here to a file
// outside the image directory), is a 400 naming the component and why; a
// file another VMM writes is a 409 naming that VMM, and changes nothing.
func TestVMMDiskFilesOverTheAPI(t *testing.T) {
	images, outside := t.TempDir(), t.TempDir()
	disk := filepath.Join(images, "disk.raw")
	secret := filepath.Join(outside, "secret")
	for _, f := range []string{disk, secret} {
		if err := os.WriteFile(f, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(disk, filepath.Join(images, "link.raw")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(secret, filepath.Join(images, "hard.raw")); err != nil {
		t.Fatal(err)
	}
	a, _ := start(t, agent.Config{DataDir: t.TempDir(), VMMImageDir: images})
	withDisk := func(instance, addr, path string, readonly bool) string {
		s := vmmtest.Spec()
		comps(s)["boot-disk-backend"] = map[string]any{"type": "file_storage_backend", "component": map[string]any{"path": path, "readonly": readonly, "block_size": 512}}
		return string(vmmtest.Body(instance, addr, s, nil))
	}
	const (
		second         = "6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a02"
		secondInstance = "0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a02"
		secondAddr     = "[fd00:1122:3344:101::1:6]:12400"
	)
	for _, c := range []struct {
		path string
		says string
	}{
		{filepath.Join(images, "link.raw"), `component \"boot-disk-backend\" (file_storage_backend): path \"` + filepath.Join(images, "link.raw") + `\": a symbolic link is on the way`},
		{filepath.Join(images, "hard.raw"), `component \"boot-disk-backend\" (file_storage_backend): path \"` + filepath.Join(images, "hard.raw") + `\": has more than one hard link (2)`},
	} {
		code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, withDisk(testInstance, okAddr, c.path, false))
		if code != http.StatusBadRequest || !strings.Contains(string(b), c.says) {
			t.Errorf("%s: %d %s; want 400 saying %q", c.path, code, b, c.says)
		}
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, withDisk(testInstance, okAddr, disk, false)); code != http.StatusOK {
		t.Fatalf("registering: %d %s", code, b)
	}
	for _, readonly := range []bool{false, true} {
		code, b := call(t, a, http.MethodPut, "/vmms/"+second, withDisk(secondInstance, secondAddr, disk, readonly))
		if code != http.StatusConflict || !strings.Contains(string(b), "is the writable disk of VMM "+testVMM) {
			t.Errorf("readonly %v: %d %s; want 409 naming VMM %s", readonly, code, b, testVMM)
		}
	}
	if code, b := call(t, a, http.MethodGet, "/vmms/"+second+"/state", ""); code != http.StatusNotFound {
		t.Errorf("the refused VMM: %d %s", code, b)
	}
}

package agent_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
)

// Our view of the VMMs shows no tenant's secrets and stays small: a
// cloud-init seed's contents are withheld (its size and SHA-256 shown), a
// registration over a MiB is refused, and the VMMs come a page at a time.
func TestVMMViewWithholdsSeedsAndPages(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	contents := []byte("#cloud-config\nssh_authorized_keys: [ssh-ed25519 AAAA-tenant-key]\n")
	seed := base64.StdEncoding.EncodeToString(contents)
	sum := sha256.Sum256(contents)
	withheld := fmt.Sprintf("withheld: %d bytes, sha256 %x", len(contents), sum)
	for i := range 3 {
		body := ensureBodySpec(fmt.Sprintf("[fd00:1122:3344:101::1:%x]:12400", i+5), func(spec map[string]any) {
			spec["components"].(map[string]any)["cloud-init"] = map[string]any{"type": "blob_storage_backend",
				"component": map[string]any{"base64": seed, "readonly": true}}
		})
		id := fmt.Sprintf("6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a%02d", i)
		if code, b := call(t, a, http.MethodPut, "/vmms/"+id, body); code != http.StatusOK {
			t.Fatalf("register %s: %d %s", id, code, b)
		}
	}
	var ids []string
	path := "/agent/vmms?limit=2"
	for range 3 {
		code, b := call(t, a, http.MethodGet, path, "")
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, b)
		}
		if bytes.Contains(b, []byte(seed)) || bytes.Contains(b, []byte("tenant-key")) {
			t.Fatalf("GET %s shows a cloud-init seed: %s", path, b)
		}
		if !bytes.Contains(b, []byte(withheld)) {
			t.Errorf("GET %s does not say what the seed is: %s", path, b)
		}
		var page api.VMMPage
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatal(err)
		}
		if len(page.Items) > 2 {
			t.Fatalf("a page of limit 2 holds %d VMMs", len(page.Items))
		}
		for _, v := range page.Items {
			ids = append(ids, v.ID)
		}
		if page.NextPage == nil {
			break
		}
		path = "/agent/vmms?limit=2&page_token=" + *page.NextPage
	}
	if len(ids) != 3 || ids[0] >= ids[1] || ids[1] >= ids[2] {
		t.Errorf("pages gave %v, want the 3 VMMs in order", ids)
	}
	for _, bad := range []string{"limit=0", "limit=101", "page_token=nope", "limit=x"} {
		if code, b := call(t, a, http.MethodGet, "/agent/vmms?"+bad, ""); code != http.StatusBadRequest {
			t.Errorf("GET /agent/vmms?%s: %d %s, want 400", bad, code, b)
		}
	}
	// A registration over a MiB is refused, naming the limit.
	big := ensureBodyWith("[fd00:1122:3344:101::1:9]:12400", map[string]any{"padding": strings.Repeat("x", api.MaxVMMBodyBytes)})
	code, b := call(t, a, http.MethodPut, "/vmms/6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a09", big)
	if code != http.StatusRequestEntityTooLarge || !bytes.Contains(b, []byte(fmt.Sprint(api.MaxVMMBodyBytes))) {
		t.Errorf("a registration over %d bytes: %d %s", api.MaxVMMBodyBytes, code, b)
	}
}

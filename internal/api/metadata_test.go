package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// registering records the registrations it is given.
type registering struct {
	noVMMs
	got []string
}

func (r *registering) Register(id string, _ vmm.Registration) (vmm.Info, error) {
	r.got = append(r.got, id)
	return vmm.Info{}, nil
}

// Upstream's InstanceMetadata requires project_id and silo_id, both UUIDs: a
// registration without them is refused at once, naming the member, and
// reaches no VMM manager (where it would hold reservoir memory until the
// VMM service refused it).
func TestVMMMetadataMembersAreRequired(t *testing.T) {
	s := newSled(t, sim.Options{})
	for name, tc := range map[string]struct {
		metadata map[string]any
		want     string
	}{
		"empty":         {map[string]any{}, "metadata.project_id"},
		"no silo":       {map[string]any{"project_id": "11111111-2222-3333-4444-555555555555"}, "metadata.silo_id"},
		"project empty": {map[string]any{"project_id": "", "silo_id": "66666666-7777-8888-9999-000000000000"}, "metadata.project_id"},
		"silo not uuid": {map[string]any{"project_id": "11111111-2222-3333-4444-555555555555", "silo_id": "silo"}, "metadata.silo_id"},
		"project null":  {map[string]any{"project_id": nil, "silo_id": "66666666-7777-8888-9999-000000000000"}, "metadata.project_id"},
	} {
		t.Run(name, func(t *testing.T) {
			vmms := &registering{}
			h := api.New(api.Deps{Configs: s.store, Reconciler: s.rec, VMMs: vmms})
			body := vmmtest.Body("0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e", "[fd00:1122:3344:101::1:5]:12400", nil, map[string]any{"metadata": tc.metadata})
			req := httptest.NewRequest(http.MethodPut, "/vmms/6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01", strings.NewReader(string(body)))
			w := httptest.NewRecorder()
			h.Handler().ServeHTTP(w, req)
			wantError(t, response{status: w.Code, body: w.Body.Bytes(), header: w.Header()}, http.StatusBadRequest, tc.want)
			if len(vmms.got) != 0 {
				t.Errorf("registered %v", vmms.got)
			}
		})
	}
	// And the body as upstream sends it is taken.
	vmms := &registering{}
	h := api.New(api.Deps{Configs: s.store, Reconciler: s.rec, VMMs: vmms})
	body := vmmtest.Body("0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e", "[fd00:1122:3344:101::1:5]:12400", nil, nil)
	req := httptest.NewRequest(http.MethodPut, "/vmms/6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01", strings.NewReader(string(body)))
	w := httptest.NewRecorder()
	h.Handler().ServeHTTP(w, req)
	if len(vmms.got) != 1 {
		t.Errorf("status %d %s: registered %v", w.Code, w.Body, vmms.got)
	}
}

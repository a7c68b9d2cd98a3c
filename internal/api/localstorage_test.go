package api_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/localstorage"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

// fakeLocalStorage records the calls it is given and answers err.
type fakeLocalStorage struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (f *fakeLocalStorage) EnsureLocalStorage(_ context.Context, pool string, r localstorage.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("ensure %s %s %d %d", pool, r.DatasetID, r.DatasetSize, r.VolumeSize))
	return f.err
}

func (f *fakeLocalStorage) DeleteLocalStorage(_ context.Context, pool, dataset string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "delete "+pool+" "+dataset)
	return f.err
}

func (f *fakeLocalStorage) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

// Every answer of POST and DELETE /local-storage, by what the allocations
// say, is upstream's shape: 204, or an Error with the status its cause
// calls for; an encrypted request and a body upstream would not send are
// 400s that never reach the allocations.
func TestLocalStorageAnswers(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	fake := &fakeLocalStorage{}
	s := newSled(t, sim.Options{}, func(d *api.Deps) { d.LocalStorage = fake })
	srv := httptest.NewServer(s.server.Handler())
	defer srv.Close()
	const pool, ds = "cb832c2e-fa94-4911-89a9-895ac8b1e8f3", "2bbf0908-21da-4bc3-882b-1a1e715c54bd"
	ensure := fmt.Sprintf(`{"zpool_id":%q,"dataset_id":%q,"dataset_size":8192,"volume_size":4096,"encrypted_at_rest":false}`, pool, ds)
	del := fmt.Sprintf(`{"zpool_id":%q,"dataset_id":%q,"encrypted_at_rest":false}`, pool, ds)
	do := func(method, body string, valid bool, status int, says string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+"/local-storage", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		x, err := spec.Do(t, srv.Client(), req, []byte(body))
		if !valid {
			err = spec.CheckAnswer(x)
		}
		if err != nil {
			t.Errorf("%s %s: %v", method, body, err)
		}
		if x.Status != status || !strings.Contains(string(x.Body), says) {
			t.Errorf("%s %s: %d %s, want %d saying %q", method, body, x.Status, x.Body, status, says)
		}
	}
	for _, c := range []struct {
		err    error
		status int
	}{
		{nil, http.StatusNoContent},
		{fmt.Errorf("%w: volume_size 0", localstorage.ErrInvalid), http.StatusBadRequest},
		{fmt.Errorf("pool oxp_x: %w", storage.ErrUnknownPool), http.StatusNotFound},
		{fmt.Errorf("dataset oxp_x/local_storage_unencrypted: %w", storage.ErrNoDataset), http.StatusConflict},
		{fmt.Errorf("%w: another size", localstorage.ErrConflict), http.StatusConflict},
		{fmt.Errorf("%w: it is a disk of VMM v", vmm.ErrFileHeld), http.StatusConflict},
		{&storage.NotReadyError{Reason: "dataset not yet ensured"}, http.StatusServiceUnavailable},
		{errors.New("disk on fire"), http.StatusInternalServerError},
	} {
		fake.err = c.err
		says := ""
		if c.err != nil {
			says = c.err.Error()
		}
		do(http.MethodPost, ensure, true, c.status, says)
		do(http.MethodDelete, del, true, c.status, says)
		if got := fake.took(); len(got) != 2 || got[0] != "ensure "+pool+" "+ds+" 8192 4096" || got[1] != "delete "+pool+" "+ds {
			t.Errorf("calls %q", got)
		}
	}
	fake.err = nil
	do(http.MethodPost, strings.Replace(ensure, `"encrypted_at_rest":false`, `"encrypted_at_rest":true`, 1), true, http.StatusBadRequest,
		"using encrypted local storage not supported: encryption at rest is not available on this sled")
	do(http.MethodDelete, strings.Replace(del, `"encrypted_at_rest":false`, `"encrypted_at_rest":true`, 1), true, http.StatusBadRequest,
		"encryption at rest is not available on this sled")
	do(http.MethodPost, strings.Replace(ensure, `"volume_size":4096,`, ``, 1), false, http.StatusBadRequest, "volume_size")
	do(http.MethodPost, strings.Replace(ensure, pool, "oxp_"+pool, 1), false, http.StatusBadRequest, "zpool_id")
	do(http.MethodDelete, `{}`, false, http.StatusBadRequest, "dataset_id")
	if got := fake.took(); len(got) != 0 {
		t.Errorf("refused requests reached the allocations: %q", got)
	}
}

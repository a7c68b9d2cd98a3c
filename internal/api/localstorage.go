package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/danielgtaylor/huma/v2"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/localstorage"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

// LocalStorage is the pools' local storage allocations (internal/agent):
// what a VMM's delegated zvols name.
type LocalStorage interface {
	EnsureLocalStorage(ctx context.Context, poolID string, r localstorage.Request) error
	DeleteLocalStorage(ctx context.Context, poolID, datasetID string) error
}

// LocalStorageDatasetEnsureRequest is upstream's.
type LocalStorageDatasetEnsureRequest struct {
	_               struct{} `additionalProperties:"true"`
	ZpoolID         string   `json:"zpool_id" format:"uuid" doc:"The pool (oxp_<zpool_id>) whose local_storage_unencrypted dataset holds the allocation."`
	DatasetID       string   `json:"dataset_id" format:"uuid" doc:"ID of the local storage dataset allocation, not the local storage dataset."`
	DatasetSize     uint64   `json:"dataset_size" doc:"Size of the allocation, at least volume_size: checked, not reserved (the volume is a sparse file)."`
	VolumeSize      uint64   `json:"volume_size" doc:"Size of the volume in bytes: more than 0, a multiple of 4096."`
	EncryptedAtRest bool     `json:"encrypted_at_rest" doc:"Must be false: this sled has no encryption at rest."`
}

// LocalStorageDatasetDeleteRequest is upstream's.
type LocalStorageDatasetDeleteRequest struct {
	_               struct{} `additionalProperties:"true"`
	ZpoolID         string   `json:"zpool_id" format:"uuid"`
	DatasetID       string   `json:"dataset_id" format:"uuid" doc:"ID of the local storage dataset allocation, not the local storage dataset."`
	EncryptedAtRest bool     `json:"encrypted_at_rest" doc:"Must be false: this sled has no encryption at rest."`
}

// errEncrypted is upstream's answer to an encrypted allocation (omicron
// sled-agent create_local_storage_dataset), and why.
const errEncrypted = "using encrypted local storage not supported: encryption at rest is not available on this sled"

func (s *Server) registerLocalStorage() {
	const where = " The allocation is a directory <dataset_id> in the pool's local_storage_unencrypted dataset holding the volume file vol; a VMM whose local_config.delegated_zvols lists it names it by upstream's zvol path, /dev/zvol/rdsk/oxp_<zpool_id>/local_storage_unencrypted/<dataset_id>/vol."
	const refusals = " A pool no disk of the sled's config carries is a 404; a pool whose config has no local_storage_unencrypted dataset a 409; a pool not managed now or whose dataset is not yet ensured a 503 (as upstream's, which a caller retries); encrypted_at_rest true a 400 (this sled has no encryption at rest)."
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID:   "local_storage_dataset_ensure",
		Method:        http.MethodPost,
		Path:          "/local-storage",
		Summary:       "Create a local storage dataset",
		Description:   "Makes the allocation with a sparse volume of volume_size bytes, unless it exists with that size (204, nothing changed); one whose volume has another size is a 409 naming both, and changes nothing (a volume is never resized). volume_size 0, not a multiple of 4096, or more than dataset_size is a 400." + where + refusals,
		DefaultStatus: http.StatusNoContent,
		Errors:        []int{400, 404, 409, 503},
	}, httpbound.Small), s.localStorageEnsure)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID:   "local_storage_dataset_delete",
		Method:        http.MethodDelete,
		Path:          "/local-storage",
		Summary:       "Delete a local storage dataset",
		Description:   "Removes the allocation, its volume and all; one that is not there is a 204 all the same. An allocation whose volume is a disk of a registered VMM is refused (409, naming the VMM): unregister the VMM first." + where + refusals,
		DefaultStatus: http.StatusNoContent,
		Errors:        []int{400, 404, 409, 503},
	}, httpbound.Small), s.localStorageDelete)
}

type localStorageEnsureInput struct {
	Body LocalStorageDatasetEnsureRequest
}

type localStorageDeleteInput struct {
	Body LocalStorageDatasetDeleteRequest
}

func (s *Server) localStorageEnsure(ctx context.Context, in *localStorageEnsureInput) (*struct{}, error) {
	if s.deps.LocalStorage == nil {
		return nil, apiError(ctx, http.StatusServiceUnavailable, "this agent has no local storage")
	}
	b := in.Body
	if b.EncryptedAtRest {
		return nil, apiError(ctx, http.StatusBadRequest, errEncrypted)
	}
	err := s.deps.LocalStorage.EnsureLocalStorage(ctx, b.ZpoolID, localstorage.Request{DatasetID: b.DatasetID, DatasetSize: b.DatasetSize, VolumeSize: b.VolumeSize})
	return nil, s.localStorageError(ctx, err)
}

func (s *Server) localStorageDelete(ctx context.Context, in *localStorageDeleteInput) (*struct{}, error) {
	if s.deps.LocalStorage == nil {
		return nil, apiError(ctx, http.StatusServiceUnavailable, "this agent has no local storage")
	}
	b := in.Body
	if b.EncryptedAtRest {
		return nil, apiError(ctx, http.StatusBadRequest, errEncrypted)
	}
	return nil, s.localStorageError(ctx, s.deps.LocalStorage.DeleteLocalStorage(ctx, b.ZpoolID, b.DatasetID))
}

func (s *Server) localStorageError(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, localstorage.ErrInvalid):
		return apiError(ctx, http.StatusBadRequest, err.Error())
	case errors.Is(err, storage.ErrUnknownPool):
		return apiError(ctx, http.StatusNotFound, err.Error())
	case errors.Is(err, storage.ErrNoDataset), errors.Is(err, localstorage.ErrConflict), errors.Is(err, vmm.ErrFileHeld):
		return apiError(ctx, http.StatusConflict, err.Error())
	case errors.Is(err, storage.ErrNotReady):
		return apiError(ctx, http.StatusServiceUnavailable, err.Error())
	default:
		s.deps.Log.Error("local storage", "err", err)
		return apiError(ctx, http.StatusInternalServerError, err.Error())
	}
}

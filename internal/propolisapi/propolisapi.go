// Package propolisapi is propolis-server 6.0.0's HTTP API (and 5.0.0's,
// served to older clients): a server over a
// Backend that is the VM, and the sled agent's client of it.
//
// The server knows nothing of how a VM is made. It decodes and checks
// requests, answers as upstream's server does (the same statuses, error
// codes and serial console semantics), and leaves the VM to the Backend.
package propolisapi

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// APIVersion is the newest version of upstream's API this package serves,
// and the one its client speaks; every request carries a version in the
// api-version header, as upstream's server requires.
const APIVersion = "6.0.0"

// versionHeader is the header that carries the API version.
const versionHeader = "api-version"

// MonitorWait bounds how long GET /instance/state-monitor holds a request
// whose generation has not been reached: it then answers with the current
// status, whose generation is below the one asked for. Upstream holds such
// a request until the generation comes; a bound keeps every wait under a
// deadline, and upstream's clients simply ask again.
const MonitorWait = 30 * time.Second

// InstanceState is an instance's state, as upstream's InstanceState.
type InstanceState string

const (
	StateCreating  InstanceState = "Creating"
	StateStarting  InstanceState = "Starting"
	StateRunning   InstanceState = "Running"
	StateStopping  InstanceState = "Stopping"
	StateStopped   InstanceState = "Stopped"
	StateRebooting InstanceState = "Rebooting"
	StateMigrating InstanceState = "Migrating"
	StateRepairing InstanceState = "Repairing"
	StateFailed    InstanceState = "Failed"
	StateDestroyed InstanceState = "Destroyed"
)

// Valid reports whether s is one of upstream's states.
func (s InstanceState) Valid() bool {
	switch s {
	case StateCreating, StateStarting, StateRunning, StateStopping, StateStopped,
		StateRebooting, StateMigrating, StateRepairing, StateFailed, StateDestroyed:
		return true
	}
	return false
}

// StateRequest is a state change asked of an instance, as upstream's
// InstanceStateRequested.
type StateRequest string

const (
	RequestRun    StateRequest = "Run"
	RequestStop   StateRequest = "Stop"
	RequestReboot StateRequest = "Reboot"
)

// Valid reports whether r is one of upstream's requests.
func (r StateRequest) Valid() bool {
	return r == RequestRun || r == RequestStop || r == RequestReboot
}

// Properties are an instance's properties, as upstream's
// InstanceProperties. They are comparable with ==.
type Properties struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Metadata    Metadata `json:"metadata"`
}

// Metadata is upstream's InstanceMetadata: what the instance's statistics
// are tracked under. Versions 5.0.0 and 6.0.0 require every field.
type Metadata struct {
	ProjectID    string `json:"project_id"`
	SiloID       string `json:"silo_id"`
	SledID       string `json:"sled_id"`
	SledSerial   string `json:"sled_serial"`
	SledRevision uint32 `json:"sled_revision"`
	SledModel    string `json:"sled_model"`
}

// Status is an instance's state and its generation, which increases with
// every change of state. Upstream's first status is generation 1,
// Creating.
type Status struct {
	Gen   uint64
	State InstanceState
	// Detail says what State does not: what the VM waits for, or why it
	// failed, in the backend's words (QEMU's for a real guest). The state
	// monitor's answer carries it as an extra member, "detail", which the
	// document allows and upstream's clients ignore; the sled agent shows
	// it.
	Detail string
}

// Backend is the VM the server serves. Implementations are safe for
// concurrent use and never block a caller past its ctx.
type Backend interface {
	// Ensure creates the VM from spec, the InstanceSpec JSON as sent (the
	// backend decodes it). Again with the same props and spec: success,
	// no change. Other ones: ErrConflict. A spec the backend cannot
	// realise: a *SpecError.
	Ensure(ctx context.Context, props Properties, spec json.RawMessage) error
	// Instance is what Ensure was given and the current status; ok is
	// false before Ensure.
	Instance() (props Properties, spec json.RawMessage, st Status, ok bool)
	// Wait returns the status as soon as its Gen is above after, or the
	// current status when ctx ends.
	Wait(ctx context.Context, after uint64) Status
	// Request asks the VM to run, stop or reboot. When it cannot from its
	// state, the error wraps ErrInvalidTransition and says why, as
	// fmt.Errorf("%w: Instance has already halted", ErrInvalidTransition):
	// its text is the answer's error code, as upstream's is.
	Request(ctx context.Context, r StateRequest) error
	// NMI injects a non-maskable interrupt (optional to support:
	// ErrUnsupported).
	NMI(ctx context.Context) error
	// Console is com1's console; nil before Ensure.
	Console() Console
}

// Console is a serial console's output history and live stream.
type Console interface {
	// Read returns up to max bytes of output starting at absolute offset
	// from (bytes since boot of the VMM), and the offset of the first
	// byte returned. start is from, or later when the bytes from from on
	// are gone (history is bounded), or End when from is past it; it is
	// the same whether max is zero or not.
	Read(from uint64, max int) (data []byte, start uint64)
	// End is the absolute offset one past the last byte written so far.
	End() uint64
	// Notify returns a channel closed when output past offset exists (or
	// the console closes).
	Notify(offset uint64) <-chan struct{}
	// Write sends input to the guest.
	Write(ctx context.Context, p []byte) (int, error)
}

var (
	// ErrConflict: the instance exists with other properties or another
	// spec (HTTP 409, error code AlreadyInitialized).
	ErrConflict = errors.New("instance already initialized")
	// ErrInvalidTransition: the instance cannot make the requested state
	// change from its state (HTTP 403, as upstream).
	ErrInvalidTransition = errors.New("instance state change not allowed")
	// ErrUnsupported: the backend cannot do what was asked (HTTP 501).
	ErrUnsupported = errors.New("not supported")
	// ErrNoInstance: no instance has been ensured yet (HTTP 424, error code
	// NoInstance). The client's errors match it; backends never return
	// it.
	ErrNoInstance = errors.New("no instance")
)

// SpecError is a spec the backend cannot realise (HTTP 400 with its
// message).
type SpecError struct {
	Msg string
}

func (e *SpecError) Error() string { return e.Msg }

// Upstream's error codes (propolis-api-types' ErrorCode).
const (
	codeNoInstance         = "NoInstance"
	codeAlreadyInitialized = "AlreadyInitialized"
	codeInternal           = "Internal"
)

// Wire types of the document.

// ensureRequest is the client's InstanceEnsureRequest, init method Spec.
type ensureRequest struct {
	Properties Properties `json:"properties"`
	Init       initSpec   `json:"init"`
}

type initSpec struct {
	Method string `json:"method"` // "Spec"
	Value  struct {
		Spec json.RawMessage `json:"spec"`
	} `json:"value"`
}

type ensureResponse struct {
	Migrate *struct{} `json:"migrate"` // always null: no migration
}

type instanceBody struct {
	Properties Properties    `json:"properties"`
	State      InstanceState `json:"state"`
}

type getResponse struct {
	Instance instanceBody `json:"instance"`
}

type specStatus struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value,omitempty"`
}

type specResponse struct {
	Properties Properties    `json:"properties"`
	Spec       specStatus    `json:"spec"`
	State      InstanceState `json:"state"`
}

// migrationStatus is upstream's InstanceMigrateStatusResponse of a VM that
// never migrated.
type migrationStatus struct {
	MigrationIn  *struct{} `json:"migration_in"`
	MigrationOut *struct{} `json:"migration_out"`
}

type monitorRequest struct {
	Gen *uint64 `json:"gen"`
}

type monitorResponse struct {
	Gen       uint64          `json:"gen"`
	State     InstanceState   `json:"state"`
	Migration migrationStatus `json:"migration"`
	Detail    string          `json:"detail,omitempty"` // ours: see Status
}

// errorBody is dropshot's error body; error_code is left out when empty,
// as dropshot does.
type errorBody struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
}

// Package propolisapitest is an in-memory propolisapi.Backend for tests: a
// scriptable VM that records every call made of it.
package propolisapitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
)

// Backend is a VM in memory. Ensure makes it Creating (generation 1);
// Run makes it Running, Reboot passes through Rebooting back to Running,
// Stop makes it Stopped and ends its console. A test scripts it further
// with SetState and the error fields, and reads what was asked of it with
// Calls and Input. It is safe for concurrent use.
type Backend struct {
	bufSize int

	mu sync.Mutex
	// The fields below are guarded by mu.
	ensured  bool
	props    propolisapi.Properties
	spec     json.RawMessage
	st       propolisapi.Status
	changed  chan struct{} // closed and replaced at every status change
	console  *propolisapi.Buffer
	calls    []string
	input    []byte
	ensureEr error // returned by the next Ensure calls, if set
	nmiErr   error
	inputErr error
}

var _ propolisapi.Backend = (*Backend)(nil)

// New returns a backend before Ensure whose console keeps bufferSize bytes
// at each end (propolisapi.DefaultBufferSize when ≤ 0).
func New(bufferSize int) *Backend {
	return &Backend{bufSize: bufferSize, changed: make(chan struct{})}
}

// FailEnsure makes every Ensure from now on return err (nil: succeed
// again).
func (b *Backend) FailEnsure(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ensureEr = err
}

// FailNMI makes every NMI from now on return err.
func (b *Backend) FailNMI(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nmiErr = err
}

// FailInput makes every write to the console from now on fail with err.
func (b *Backend) FailInput(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inputErr = err
}

// Calls is what was asked of the backend, in order: "Ensure <id>",
// "Request Run", "NMI".
func (b *Backend) Calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

// Input is every byte written to the console so far.
func (b *Backend) Input() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.input)
}

// Buffer is the console's buffer, for the test to feed output; nil before
// Ensure.
func (b *Backend) Buffer() *propolisapi.Buffer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.console
}

// SetState moves the VM to s, a new generation.
func (b *Backend) SetState(s propolisapi.InstanceState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setLocked(s)
}

func (b *Backend) setLocked(s propolisapi.InstanceState) {
	b.st = propolisapi.Status{Gen: b.st.Gen + 1, State: s}
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *Backend) Ensure(ctx context.Context, props propolisapi.Properties, spec json.RawMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "Ensure "+props.ID)
	switch {
	case b.ensureEr != nil:
		return b.ensureEr
	case b.ensured && props == b.props && bytes.Equal(spec, b.spec):
		return nil
	case b.ensured:
		return propolisapi.ErrConflict
	}
	b.ensured, b.props, b.spec = true, props, bytes.Clone(spec)
	b.console = propolisapi.NewBuffer(b.bufSize, b.writeInput)
	b.setLocked(propolisapi.StateCreating)
	return nil
}

func (b *Backend) writeInput(ctx context.Context, p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inputErr != nil {
		return 0, b.inputErr
	}
	b.input = append(b.input, p...)
	return len(p), nil
}

func (b *Backend) Instance() (propolisapi.Properties, json.RawMessage, propolisapi.Status, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.props, b.spec, b.st, b.ensured
}

func (b *Backend) Wait(ctx context.Context, after uint64) propolisapi.Status {
	return propolisapi.WaitFor(ctx, after, func() (propolisapi.Status, <-chan struct{}) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.st, b.changed
	})
}

// halted says whether the VM can never run again.
func halted(s propolisapi.InstanceState) bool {
	return s == propolisapi.StateStopped || s == propolisapi.StateFailed || s == propolisapi.StateDestroyed
}

func (b *Backend) Request(ctx context.Context, r propolisapi.StateRequest) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "Request "+string(r))
	s := b.st.State
	switch {
	case r == propolisapi.RequestStop && halted(s):
		return nil // upstream ignores a stop of a halted VM
	case halted(s):
		return fmt.Errorf("%w: Instance has already halted", propolisapi.ErrInvalidTransition)
	case r == propolisapi.RequestRun && s != propolisapi.StateRunning:
		b.setLocked(propolisapi.StateRunning)
	case r == propolisapi.RequestReboot && s != propolisapi.StateRunning:
		return fmt.Errorf("%w: Operation requires an active instance", propolisapi.ErrInvalidTransition)
	case r == propolisapi.RequestReboot:
		b.setLocked(propolisapi.StateRebooting)
		b.setLocked(propolisapi.StateRunning)
	case r == propolisapi.RequestStop:
		b.setLocked(propolisapi.StateStopped)
		b.console.Close()
	}
	return nil
}

func (b *Backend) NMI(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "NMI")
	return b.nmiErr
}

func (b *Backend) Console() propolisapi.Console {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.console == nil {
		return nil // a nil *Buffer in the interface would not be nil
	}
	return b.console
}

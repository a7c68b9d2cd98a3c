// Package reservoir is the sled's VMM reservoir: the memory set aside for
// guests, as upstream's sled agent sizes it (omicron
// sled-agent/src/vmm_reservoir.rs), and the account of what each VMM holds
// of it. Upstream's reservoir is memory illumos takes from the kernel; here
// it is an account only (QEMU allocates its guest's memory itself), which
// the control plane places instances against (inventory's reservoir_size)
// and which admits each VMM's memory.
package reservoir

import (
	"errors"
	"fmt"
	"sync"
)

// Align is the granularity of the reservoir's size (upstream's
// RESERVOIR_SZ_ALIGN).
const Align = 2 << 20

// DefaultPercentage is the share of usable physical memory the reservoir
// has when neither size nor percentage is given: upstream's sled configs
// use 91 on gimlets and 60 elsewhere.
const DefaultPercentage = 60

// Size is the reservoir's size in bytes for a percentage (1–99) of usable
// physical memory or a size in MiB (at most the memory), not both: rounded
// down to Align. Zero for both means DefaultPercentage.
func Size(physicalRAM uint64, percentage int, sizeMiB uint64) (uint64, error) {
	var bytes uint64
	switch {
	case percentage != 0 && sizeMiB != 0:
		return 0, errors.New("give the VMM reservoir as a percentage or a size, not both")
	case sizeMiB != 0:
		bytes = sizeMiB << 20
		if bytes > physicalRAM || sizeMiB > physicalRAM>>20 {
			return 0, fmt.Errorf("a VMM reservoir of %d MiB is more than the sled's %d MiB of usable memory", sizeMiB, physicalRAM>>20)
		}
	default:
		if percentage == 0 {
			percentage = DefaultPercentage
		}
		if percentage < 1 || percentage > 99 {
			return 0, fmt.Errorf("VMM reservoir percentage %d: want 1 to 99", percentage)
		}
		bytes = uint64(float64(physicalRAM) * float64(percentage) / 100)
	}
	return bytes / Align * Align, nil
}

// ErrFull is a VMM whose memory is more than what is left of the reservoir.
var ErrFull = errors.New("not enough room in the VMM reservoir")

// Account is what each VMM holds of a reservoir. It is safe for concurrent
// use.
type Account struct {
	size uint64

	mu   sync.Mutex
	held map[string]uint64 // guarded by mu
	used uint64            // guarded by mu: the sum of held
}

// NewAccount returns an empty account of a reservoir of size bytes.
func NewAccount(size uint64) *Account {
	return &Account{size: size, held: map[string]uint64{}}
}

// Size is the reservoir's size in bytes.
func (a *Account) Size() uint64 { return a.size }

// Used is what the VMMs hold, in bytes.
func (a *Account) Used() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used
}

// Reserve gives VMM id bytes of the reservoir. A VMM that holds some
// already keeps what it holds if bytes is the same, and is refused another
// amount. Beyond what is left, it fails with ErrFull saying how much is.
func (a *Account) Reserve(id string, bytes uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if have, ok := a.held[id]; ok {
		if have != bytes {
			return fmt.Errorf("VMM %s holds %d MiB of the reservoir already, not %d", id, have>>20, bytes>>20)
		}
		return nil
	}
	if left := a.size - a.used; bytes > left {
		return fmt.Errorf("%w: the guest wants %d MiB; %d MiB of the sled's %d MiB are left", ErrFull, bytes>>20, left>>20, a.size>>20)
	}
	a.held[id] = bytes
	a.used += bytes
	return nil
}

// Release gives back what VMM id holds.
func (a *Account) Release(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used -= a.held[id]
	delete(a.held, id)
}

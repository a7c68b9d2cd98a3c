// Package hardware says what the sled is: its baseboard, its CPU family, and
// the memory and hardware threads the agent may use, as inventory and the
// sled identifiers report them.
package hardware

// CPUFamily is upstream's SledCpuFamily, from CPUID.
type CPUFamily string

const (
	CPUUnknown     CPUFamily = "unknown"
	CPUAMDMilan    CPUFamily = "amd_milan"
	CPUAMDTurin    CPUFamily = "amd_turin"
	CPUAMDTurinDns CPUFamily = "amd_turin_dense"
)

// Baseboard identifies the sled's board: upstream's BaseboardId (part and
// serial number) and the model, revision and serial of its SledIdentifiers.
type Baseboard struct {
	// Part is the part number (model).
	Part     string
	Revision uint32
	Serial   string
}

// Info is what the sled is.
type Info struct {
	Baseboard Baseboard
	// CPUFamily is "" where the sled's CPU was never looked at (an Info
	// made by hand): Family reports it as CPUUnknown.
	CPUFamily CPUFamily
	// PhysicalRAM is the usable physical memory, in bytes.
	PhysicalRAM uint64
	// HardwareThreads is how many hardware threads the agent may use.
	HardwareThreads uint32
}

// Family is the sled's CPU family as upstream reports it: CPUUnknown where
// it was not determined.
func (i Info) Family() CPUFamily {
	if i.CPUFamily == "" {
		return CPUUnknown
	}
	return i.CPUFamily
}

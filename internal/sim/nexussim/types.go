package nexussim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// The types below are the schemas of nexus-internal 1.0.0 the simulator
// speaks, with the document's field names.

// Generation is a generation number; upstream keeps them to 2^63-1.
type Generation uint64

// ByteCount is an amount of memory in bytes; upstream keeps them to 2^63-1.
type ByteCount uint64

// SledRole is what a sled does in the rack.
type SledRole string

// The sled roles.
const (
	SledRoleGimlet   SledRole = "gimlet"
	SledRoleScrimlet SledRole = "scrimlet"
)

// SledCpuFamily is the kind of CPU on a sled.
type SledCpuFamily string

// The CPU families.
const (
	SledCpuFamilyUnknown       SledCpuFamily = "unknown"
	SledCpuFamilyAmdMilan      SledCpuFamily = "amd_milan"
	SledCpuFamilyAmdTurin      SledCpuFamily = "amd_turin"
	SledCpuFamilyAmdTurinDense SledCpuFamily = "amd_turin_dense"
)

// Baseboard identifies a sled's hardware.
type Baseboard struct {
	Part     string `json:"part"`
	Revision uint32 `json:"revision"`
	Serial   string `json:"serial"`
}

// SledAgentInfo is what a sled agent tells Nexus about itself, and what
// Nexus answers it holds.
type SledAgentInfo struct {
	// SAAddress is the sled agent's API address: an IPv6 address and port.
	SAAddress             netip.AddrPort `json:"sa_address"`
	RepoDepotPort         uint16         `json:"repo_depot_port"`
	Role                  SledRole       `json:"role"`
	Baseboard             Baseboard      `json:"baseboard"`
	UsableHardwareThreads uint32         `json:"usable_hardware_threads"`
	UsablePhysicalRAM     ByteCount      `json:"usable_physical_ram"`
	ReservoirSize         ByteCount      `json:"reservoir_size"`
	CPUFamily             SledCpuFamily  `json:"cpu_family"`
	Generation            Generation     `json:"generation"`
	// Decommissioned is set only by Nexus; a sled agent's value is ignored.
	Decommissioned bool `json:"decommissioned"`
}

// VmmState is one of the states of a VMM.
type VmmState string

// The VMM states.
const (
	VmmStateStarting  VmmState = "starting"
	VmmStateRunning   VmmState = "running"
	VmmStateStopping  VmmState = "stopping"
	VmmStateStopped   VmmState = "stopped"
	VmmStateRebooting VmmState = "rebooting"
	VmmStateMigrating VmmState = "migrating"
	VmmStateFailed    VmmState = "failed"
	VmmStateDestroyed VmmState = "destroyed"
)

// VmmRuntimeState is a VMM's state at one generation.
type VmmRuntimeState struct {
	Gen         Generation `json:"gen"`
	State       VmmState   `json:"state"`
	TimeUpdated time.Time  `json:"time_updated"`
}

// MigrationState is the state of a live migration.
type MigrationState string

// The migration states.
const (
	MigrationStatePending    MigrationState = "pending"
	MigrationStateInProgress MigrationState = "in_progress"
	MigrationStateFailed     MigrationState = "failed"
	MigrationStateCompleted  MigrationState = "completed"
)

// MigrationRuntimeState is a sled's report of a migration of a VMM.
type MigrationRuntimeState struct {
	Gen         Generation     `json:"gen"`
	MigrationID string         `json:"migration_id"`
	State       MigrationState `json:"state"`
	TimeUpdated time.Time      `json:"time_updated"`
}

// SledVmmState is a sled's whole knowledge of a VMM's state.
type SledVmmState struct {
	VmmState     VmmRuntimeState        `json:"vmm_state"`
	MigrationIn  *MigrationRuntimeState `json:"migration_in"`
	MigrationOut *MigrationRuntimeState `json:"migration_out"`
}

// clone is a deep copy of st.
func (st SledVmmState) clone() SledVmmState {
	for _, m := range []**MigrationRuntimeState{&st.MigrationIn, &st.MigrationOut} {
		if *m != nil {
			c := **m
			*m = &c
		}
	}
	return st
}

// The error messages below follow serde's ("missing field `x`", "unknown
// variant `y`, expected ..."), which is what upstream's dropshot server
// puts after "unable to parse JSON body: ".

// decodeSledAgentInfo decodes a SledAgentInfo body as upstream would, with
// one difference: a field the document does not have is refused (upstream
// ignores it), so a misspelt field from the agent fails its tests.
func decodeSledAgentInfo(data []byte) (SledAgentInfo, error) {
	top, err := parseObject(data, "sa_address", "repo_depot_port", "role", "baseboard",
		"usable_hardware_threads", "usable_physical_ram", "reservoir_size", "cpu_family",
		"generation", "decommissioned")
	if err != nil {
		return SledAgentInfo{}, err
	}
	if _, err := requireFields(top["baseboard"], "baseboard", "part", "revision", "serial"); err != nil {
		return SledAgentInfo{}, err
	}
	// The address's own parse error does not say which field it is in.
	var addr string
	if err := json.Unmarshal(top["sa_address"], &addr); err != nil {
		return SledAgentInfo{}, fmt.Errorf("sa_address: %w", err)
	}
	if _, err := netip.ParseAddrPort(addr); err != nil {
		return SledAgentInfo{}, fmt.Errorf("sa_address %q: invalid socket address syntax: %w", addr, err)
	}
	var info SledAgentInfo
	if err := simhttp.DecodeStrict(bytes.NewReader(data), &info); err != nil {
		return SledAgentInfo{}, err
	}
	return info, checkSledAgentInfo(info)
}

func checkSledAgentInfo(info SledAgentInfo) error {
	a := info.SAAddress
	if !a.IsValid() || !a.Addr().Is6() {
		return fmt.Errorf("sa_address %q: invalid socket address syntax: want [<IPv6 address>]:<port>", a)
	}
	// Rust's SocketAddrV6 takes a numeric scope id only.
	if z := a.Addr().Zone(); z != "" {
		if _, err := strconv.ParseUint(z, 10, 32); err != nil {
			return fmt.Errorf("sa_address %q: invalid socket address syntax: the scope id must be a number", a)
		}
	}
	if err := oneOf("role", info.Role, SledRoleGimlet, SledRoleScrimlet); err != nil {
		return err
	}
	if err := oneOf("cpu_family", info.CPUFamily, SledCpuFamilyUnknown, SledCpuFamilyAmdMilan,
		SledCpuFamilyAmdTurin, SledCpuFamilyAmdTurinDense); err != nil {
		return err
	}
	if err := checkGeneration("generation", info.Generation); err != nil {
		return err
	}
	for _, b := range []struct {
		name string
		n    ByteCount
	}{{"usable_physical_ram", info.UsablePhysicalRAM}, {"reservoir_size", info.ReservoirSize}} {
		if b.n > math.MaxInt64 {
			return fmt.Errorf("%s %d: value is too large for a byte count", b.name, b.n)
		}
	}
	return nil
}

// decodeSledVmmState decodes a SledVmmState body as upstream would, but
// refusing unknown fields (see decodeSledAgentInfo). The migrations may be
// absent or null.
func decodeSledVmmState(data []byte) (SledVmmState, error) {
	top, err := parseObject(data, "vmm_state")
	if err != nil {
		return SledVmmState{}, err
	}
	if _, err := requireFields(top["vmm_state"], "vmm_state", "gen", "state", "time_updated"); err != nil {
		return SledVmmState{}, err
	}
	for _, name := range []string{"migration_in", "migration_out"} {
		if raw, ok := top[name]; ok && !isNull(raw) {
			if _, err := requireFields(raw, name, "gen", "migration_id", "state", "time_updated"); err != nil {
				return SledVmmState{}, err
			}
		}
	}
	var st SledVmmState
	if err := simhttp.DecodeStrict(bytes.NewReader(data), &st); err != nil {
		return SledVmmState{}, err
	}
	return st, checkSledVmmState(&st)
}

// checkSledVmmState checks st and puts its migration ids in canonical form.
func checkSledVmmState(st *SledVmmState) error {
	v := st.VmmState
	if err := oneOf("vmm_state.state", v.State, VmmStateStarting, VmmStateRunning, VmmStateStopping,
		VmmStateStopped, VmmStateRebooting, VmmStateMigrating, VmmStateFailed, VmmStateDestroyed); err != nil {
		return err
	}
	if err := checkGeneration("vmm_state.gen", v.Gen); err != nil {
		return err
	}
	for _, m := range []struct {
		name string
		m    *MigrationRuntimeState
	}{{"migration_in", st.MigrationIn}, {"migration_out", st.MigrationOut}} {
		if m.m == nil {
			continue
		}
		id, err := uuid.Parse(m.m.MigrationID)
		if err != nil {
			return fmt.Errorf("%s.migration_id %q: not a UUID: %w", m.name, m.m.MigrationID, err)
		}
		m.m.MigrationID = id.String()
		if err := oneOf(m.name+".state", m.m.State, MigrationStatePending, MigrationStateInProgress,
			MigrationStateFailed, MigrationStateCompleted); err != nil {
			return err
		}
		if err := checkGeneration(m.name+".gen", m.m.Gen); err != nil {
			return err
		}
	}
	return nil
}

// parseObject checks that data is one JSON object, with nothing after it,
// holding each of required, none null, and returns its fields.
func parseObject(data []byte, required ...string) (map[string]json.RawMessage, error) {
	// Bad syntax is reported first, so that it is not taken for a wrong type.
	if err := json.Unmarshal(data, new(json.RawMessage)); err != nil {
		return nil, err
	}
	return requireFields(data, "", required...)
}

// requireFields checks that raw is a JSON object holding each of names,
// none null, and returns its fields. where names the object in errors
// ("" for the body itself).
func requireFields(raw json.RawMessage, where string, names ...string) (map[string]json.RawMessage, error) {
	in := ""
	if where != "" {
		in = " in `" + where + "`"
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("invalid type: expected an object%s", in)
	}
	for _, name := range names {
		v, ok := fields[name]
		if !ok {
			return nil, fmt.Errorf("missing field `%s`%s", name, in)
		}
		if isNull(v) {
			return nil, fmt.Errorf("invalid type: null, expected a value for field `%s`%s", name, in)
		}
	}
	return fields, nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// oneOf checks that the enum field named name holds one of values.
func oneOf[T ~string](name string, v T, values ...T) error {
	for _, x := range values {
		if v == x {
			return nil
		}
	}
	want := ""
	for i, x := range values {
		switch {
		case i == 0:
		case i == len(values)-1:
			want += " or "
		default:
			want += ", "
		}
		want += "`" + string(x) + "`"
	}
	return fmt.Errorf("%s: unknown variant `%s`, expected %s", name, v, want)
}

func checkGeneration(name string, g Generation) error {
	if g > math.MaxInt64 {
		return fmt.Errorf("%s: invalid value: integer `%d`, expected an integer between 0 and %d", name, g, int64(math.MaxInt64))
	}
	return nil
}

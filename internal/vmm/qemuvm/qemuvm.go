// Package qemuvm is a real guest behind the propolis API: the backend of
// the VMM service (internal/propolisapi) that builds a QEMU machine from an
// instance spec (internal/vmm/spec), boots it through OVMF and follows it
// over QMP. Every state the API reports is the guest's own:
//
//	Creating   QEMU is being started, and then holds the guest paused
//	Starting   asked to run: QEMU is told to run the guest's CPUs
//	Running    QEMU runs the guest (QMP "running")
//	Rebooting  reset asked or done by the guest, until QEMU runs it again
//	Stopping   the ACPI power button pressed, until QEMU exits
//	Stopped    QEMU exited after the guest powered off
//	Destroyed  the VM's files are cleaned up: nothing of it is left
//	Failed     the guest panicked (pvpanic), hit an internal error, or QEMU
//	           died; Detail has QEMU's words
//
// A stop that the guest ignores is forced by whoever asked (the agent's
// StopGrace tears the zone down); Close quits QEMU, then kills it.
//
// QEMU runs unprivileged (Options.IDs): as a user and group of its own,
// picked for the VM from a range, with no capabilities, shut in
// (internal/vmm/qemujail: an empty network namespace, a mount namespace
// that shows it only what it needs, read-only), and it opens nothing by
// path. This process, root, opens and makes everything QEMU uses and hands
// it the descriptors: the firmware and disk files (a disk's file stays as
// it is, root's or not: nothing is chowned), the QMP and serial sockets,
// and each NIC's tap, made in the zone's network namespace and owned by
// QEMU's ids.
package qemuvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/vmm/qemujail"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// Options set a VM up.
type Options struct {
	// Name names the machine (the VMM's id).
	Name string
	// Dir is the VM's own directory: its sockets, its firmware variables
	// and its blob-backed disks. Made if missing; its contents are the
	// VM's.
	Dir string
	// Binary is QEMU's program (qemu-system-x86_64).
	Binary string
	// FirmwareCode and FirmwareVars are OVMF's code image and the
	// template of its variable store.
	FirmwareCode, FirmwareVars string
	Accel                      qemu.Accel
	// Sled is what a spec is checked against, again: the agent checked it
	// before the VMM's zone existed, and a file may have moved since.
	Sled spec.Sled
	// Start starts QEMU's command (a namespace, a user): see
	// qemu.StartOptions.
	Start func(*exec.Cmd) error
	// Confine, if set, confines QEMU (the VMM service's: a cgroup of its
	// own with limits sized for the guest, internal/vmm/guestcg). It is
	// called once the spec is known, before QEMU starts, and what it
	// returns wraps Start. A confinement it could not make fails the
	// start (its Start hook refuses), saying why: QEMU never runs less
	// confined than asked.
	Confine func(Guest) Confinement
	// IDs is the range QEMU's user and group ids are picked from, one
	// for each VM (IDRange.Pick): QEMU runs unprivileged, shut in
	// (internal/vmm/qemujail: network, mount and IPC namespaces of its
	// own, which the program running this must serve by calling
	// qemujail.RunIfAsked first thing), and is given every file, socket
	// and tap it uses (qemu.Machine.Descriptors). Zero:
	// QEMU runs as this process and opens its files and makes its taps
	// itself, which only tools that run QEMU's command line themselves
	// want (the benchmarks); the VMM service always sets it.
	IDs IDRange
	// InNetns runs f on a thread in the zone's network namespace, where
	// the VM's taps are made (nil: f runs here, as in the VMM service,
	// which lives in its zone's namespace). With IDs, QEMU runs in an
	// empty namespace of its own, holding its taps by descriptor.
	InNetns func(f func() error) error
	// StartTimeout bounds QEMU's start until its monitor answers (30s).
	StartTimeout time.Duration
	// CallTimeout bounds each QMP command (5s).
	CallTimeout time.Duration
	Log         *slog.Logger
}

// Guest is what a confinement is sized for.
type Guest struct {
	CPUs      int
	MemoryMiB int64
	Accel     qemu.Accel
}

// Confinement is where and how one QEMU runs confined.
type Confinement interface {
	// Start wraps a Start hook (nil: (*exec.Cmd).Start) so that QEMU
	// starts in the confinement. QEMU holds the guest paused (-S) until it
	// is told to run, so a hook may place it once it has started.
	Start(next func(*exec.Cmd) error) func(*exec.Cmd) error
	// String says how QEMU is confined, or why it is not (once started:
	// what the start did).
	String() string
	// MemoryKill says, once QEMU has exited, that the confinement's
	// memory limit killed it; "" if it did not or that cannot be told.
	MemoryKill() string
}

// VM is one guest. It implements propolisapi.Backend.
type VM struct {
	opts    Options
	console *propolisapi.Buffer

	mu      sync.Mutex
	ensured bool
	sled    spec.Sled // what the spec was checked against, its NICs found
	props   propolisapi.Properties
	raw     json.RawMessage
	status  propolisapi.Status
	detail  string
	changed chan struct{} // closed and replaced at every change of status
	proc    *qemu.Process // nil until started, and once it has exited
	serial  net.Conn      // com1, while connected
	// powerdown is set when the guest was asked to power off; a QEMU
	// that exits after a SHUTDOWN event has stopped, not failed.
	shutdown bool
	closed   bool
	// sockDir holds QEMU's sockets: Dir, or Dir by a short name through
	// dirFile, a descriptor of it (closed at cleanup).
	sockDir string
	dirFile *os.File
	// conf confines QEMU (nil without Options.Confine); confined says
	// how, once QEMU has started.
	conf     Confinement
	confined string
	// runsAs says who QEMU runs as ("" without Options.IDs).
	runsAs string
	// taps are the VM's taps, made by this process, removed at cleanup.
	taps []string
}

// New returns a VM that has nothing yet: Ensure makes it.
func New(opts Options) *VM {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 5 * time.Second
	}
	v := &VM{opts: opts, changed: make(chan struct{})}
	v.console = propolisapi.NewBuffer(consoleBytes, v.writeSerial)
	return v
}

// maxSocketPath is the longest socket path used: Linux binds at most 107
// bytes.
const maxSocketPath = 100

// consoleBytes is how much of com1's output is kept.
const consoleBytes = 1 << 20

// Ensure makes the VM from its spec and starts QEMU with the guest paused.
// Again with the same properties and spec it changes nothing.
func (v *VM) Ensure(ctx context.Context, props propolisapi.Properties, raw json.RawMessage) error {
	v.mu.Lock()
	if v.ensured {
		same := v.props == props && propolisapi.SameSpec(v.raw, raw)
		v.mu.Unlock()
		if !same {
			return propolisapi.ErrConflict
		}
		return nil
	}
	s, err := spec.Decode(raw)
	sled := v.opts.Sled
	if err == nil && sled.NICs == nil {
		sled.NICs, err = spec.NICsOf(s)
	}
	// The disks' files are opened here, as judged, and QEMU is given these
	// descriptors: nothing opens them by name again.
	var files spec.Files
	if err == nil {
		files, err = spec.CheckOpen(s, sled)
	}
	defer files.Close() // QEMU has its own once started
	var se *spec.Error
	if errors.As(err, &se) {
		v.mu.Unlock()
		return &propolisapi.SpecError{Msg: se.Error()}
	}
	if err != nil {
		v.mu.Unlock()
		return err
	}
	v.ensured, v.props, v.raw, v.sled = true, props, slices.Clone(raw), sled
	v.setLocked(propolisapi.StateCreating, "starting QEMU")
	v.mu.Unlock()

	// QEMU is the VM's, not the request's: the client that asked for the
	// instance going away (an agent killed while QEMU starts) must not
	// kill it. The start stays bounded by StartTimeout.
	proc, err := v.start(context.WithoutCancel(ctx), s, files)
	if err != nil {
		v.set(propolisapi.StateFailed, "QEMU did not start: "+err.Error())
		return fmt.Errorf("starting QEMU: %w", err)
	}
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		proc.Kill(context.Background())
		return errors.New("the VMM service is closing")
	}
	v.proc = proc
	v.setLocked(propolisapi.StateCreating, v.confinedLocked("QEMU holds the guest paused until it is asked to run"))
	v.mu.Unlock()
	go v.follow(proc)
	return nil
}

// start builds the machine and starts QEMU, paused, with com1 connected;
// its file-backed disks are files, as judged.
func (v *VM) start(ctx context.Context, s *spec.Spec, files spec.Files) (*qemu.Process, error) {
	if err := os.MkdirAll(v.opts.Dir, 0o700); err != nil {
		return nil, err
	}
	sockDir := v.opts.Dir
	if len(filepath.Join(sockDir, "qmp.sock")) > maxSocketPath {
		// Too long for a socket's address: the same directory by a short
		// name, through a descriptor of it that this process holds
		// (/proc/<pid>/fd/<fd>, which this process resolves to it, and
		// QEMU too where it makes its sockets itself, as root), so that
		// nothing of the VM lives outside Dir.
		d, err := os.OpenFile(v.opts.Dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		sockDir = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), d.Fd())
		v.mu.Lock()
		v.dirFile = d
		v.mu.Unlock()
	}
	v.mu.Lock()
	v.sockDir = sockDir
	v.mu.Unlock()
	m, err := v.machine(s, files)
	if err != nil {
		return nil, err
	}
	start := v.opts.Start
	if v.opts.IDs == (IDRange{}) {
		// QEMU runs as this process and opens its files by name: only
		// the benchmarks, which run its command line themselves.
		for i := range m.Disks {
			m.Disks[i].File = nil
		}
	} else {
		id, err := identity(v.opts.IDs, v.opts.Name, m.Accel, "/proc", qemu.KVMGroups)
		if err != nil {
			return nil, fmt.Errorf("QEMU's user: %w", err)
		}
		m.Descriptors = true
		closeTaps, err := v.openTaps(m.NICs, id)
		if err != nil {
			return nil, err
		}
		defer closeTaps() // QEMU has its own once started
		start = shutIn(id, m.Accel, start)
		v.opts.Log.Info("qemu user", "uid", id.UID, "gid", id.GID, "groups", id.Groups, "range", v.opts.IDs.String())
		v.mu.Lock()
		v.runsAs = id.String()
		v.mu.Unlock()
	}
	var conf Confinement
	if v.opts.Confine != nil {
		conf = v.opts.Confine(Guest{CPUs: m.CPUs, MemoryMiB: int64(m.MemoryMiB), Accel: m.Accel})
		start = conf.Start(start)
	}
	sctx, cancel := context.WithTimeout(ctx, v.opts.StartTimeout)
	defer cancel()
	proc, err := qemu.Start(sctx, m, qemu.StartOptions{Binary: v.opts.Binary, Start: start, Logger: v.opts.Log})
	if err != nil {
		return nil, err
	}
	if conf != nil {
		how := conf.String()
		v.opts.Log.Info("qemu confinement", "pid", proc.PID(), "confinement", how)
		v.mu.Lock()
		v.conf, v.confined = conf, how
		v.mu.Unlock()
	}
	for _, p := range m.Serial {
		if p.Port != "com1" {
			continue
		}
		var d net.Dialer
		conn, err := d.DialContext(sctx, "unix", p.Socket)
		if err != nil {
			proc.Kill(context.Background())
			return nil, fmt.Errorf("connecting to com1: %w", err)
		}
		v.mu.Lock()
		v.serial = conn
		v.mu.Unlock()
		go v.readSerial(conn)
	}
	return proc, nil
}

// shutIn makes start start QEMU shut in (internal/vmm/qemujail): in
// network, mount and IPC namespaces of its own, as id, with no other
// groups and no capabilities. The command has its SysProcAttr already:
// qemu.Start sets it. A command that cannot be shut in is not started.
func shutIn(id Identity, accel qemu.Accel, start func(*exec.Cmd) error) func(*exec.Cmd) error {
	c := qemujail.Config{UID: id.UID, GID: id.GID, Groups: slices.Clone(id.Groups)}
	if accel == qemu.KVM {
		c.Devices = []string{"/dev/kvm"} // QEMU opens it by path
	}
	return func(cmd *exec.Cmd) error {
		if err := qemujail.Wrap(cmd, c); err != nil {
			return err
		}
		if start == nil {
			return cmd.Start()
		}
		return start(cmd)
	}
}

// openTaps makes each NIC's tap in QEMU's namespace, owned by id, and sets
// its File; done closes this process's descriptors (each tap goes when
// QEMU's does too).
func (v *VM) openTaps(nics []qemu.NIC, id Identity) (done func(), err error) {
	var files []*os.File
	done = func() {
		for _, f := range files {
			f.Close()
		}
	}
	v.mu.Lock()
	for _, n := range nics {
		v.taps = append(v.taps, n.Tap)
	}
	v.mu.Unlock()
	err = v.inNetns(func() error {
		for i := range nics {
			f, err := qemu.OpenTap(nics[i].Tap, id.UID, id.GID)
			if err != nil {
				return err
			}
			files = append(files, f)
			nics[i].File = f
		}
		return nil
	})
	if err != nil {
		done()
		return nil, fmt.Errorf("NIC: %w", err)
	}
	return done, nil
}

// inNetns runs f in QEMU's network namespace.
func (v *VM) inNetns(f func() error) error {
	if v.opts.InNetns == nil {
		return f()
	}
	return v.opts.InNetns(f)
}

// machine is the QEMU machine for s, with its files in the VM's directory
// and its file-backed disks files.
func (v *VM) machine(s *spec.Spec, files spec.Files) (qemu.Machine, error) {
	dir := v.opts.Dir
	m := qemu.Machine{
		Name:      v.opts.Name,
		CPUs:      s.Board.CPUs,
		MemoryMiB: int(s.Board.MemoryMiB),
		Chipset:   qemu.ChipsetFor(s.Board.PCIe),
		Firmware:  qemu.Firmware{Code: v.opts.FirmwareCode, Vars: filepath.Join(dir, "vars.fd")},
		Accel:     v.opts.Accel,
		QMPSocket: filepath.Join(v.sockDir, "qmp.sock"),
		Sandbox:   true,
	}
	if err := qemu.PrepareVars(v.opts.FirmwareVars, m.Firmware.Vars); err != nil {
		return m, err
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range s.Components {
			if !yield(k) {
				return
			}
		}
	})
	ids := map[string]string{} // component key → QEMU device id
	vhost := qemu.VhostNet()
	for _, key := range keys {
		c := s.Components[key]
		switch c.Type {
		case spec.TypeVirtioDisk, spec.TypeNvmeDisk:
			d, err := v.disk(s, c, len(m.Disks), files)
			if err != nil {
				return m, fmt.Errorf("component %q: %w", key, err)
			}
			ids[key] = d.ID
			m.Disks = append(m.Disks, d)
		case spec.TypeVirtioNIC:
			n := len(m.NICs)
			mac := v.sled.NICs[strings.ToLower(c.NIC.InterfaceID)]
			tap := s.Components[c.NIC.BackendID].Network.VNICName
			if _, err := spec.MACOfVNIC(tap); err != nil {
				tap = fmt.Sprintf("tap%d", n) // a sled whose NICs were given
			}
			nic := qemu.NIC{ID: fmt.Sprintf("net%d", n), Kind: qemu.VirtioNet, PCI: qemuPCI(c.NIC.PCI), MAC: mac.String(), Tap: tap, Vhost: vhost}
			ids[key] = nic.ID
			m.NICs = append(m.NICs, nic)
		case spec.TypeSerialPort:
			m.Serial = append(m.Serial, qemu.SerialPort{Port: c.Serial, Socket: filepath.Join(v.sockDir, c.Serial+".sock")})
		case spec.TypeQemuPvpanic:
			m.Pvpanic = m.Pvpanic || c.Pvpanic.EnableISA
		case spec.TypeVirtioSocket:
			// Checked, not realised (spec.NotRealised): the guest runs
			// without it, as our view of the VMM says.
		}
	}
	for _, c := range s.Components {
		for _, key := range c.Boot {
			m.BootOrder = append(m.BootOrder, ids[key])
		}
	}
	return m, nil
}

// disk is the QEMU disk of a spec's disk component: its backend's file as
// opened and judged (files), or its blob written into the VM's directory.
func (v *VM) disk(s *spec.Spec, c spec.Component, n int, files spec.Files) (qemu.Disk, error) {
	d := qemu.Disk{ID: fmt.Sprintf("disk%d", n), Kind: qemu.VirtioBlk, PCI: qemuPCI(c.Disk.PCI), BlockSize: 512}
	if c.Type == spec.TypeNvmeDisk {
		d.Kind = qemu.NVMe
		d.NoWriteCache = !c.Disk.WriteCache
		d.Serial = printable(c.Disk.SerialNumber)
		if d.Serial == "" {
			d.Serial = d.ID
		}
	}
	b := s.Components[c.Disk.BackendID]
	switch {
	case b.File != nil:
		f := files[c.Disk.BackendID]
		if f == nil {
			return d, fmt.Errorf("backend %q: its file was not opened", c.Disk.BackendID)
		}
		d.Path, d.File, d.ReadOnly, d.BlockSize = f.Path, f.File, b.File.ReadOnly, int(b.File.BlockSize)
	case b.Blob != nil:
		d.Path, d.ReadOnly = filepath.Join(v.opts.Dir, d.ID+".blob"), b.Blob.ReadOnly
		// Whole sectors: the guest sees the blob padded with zeros.
		data := append(slices.Clone(b.Blob.Data), make([]byte, (512-len(b.Blob.Data)%512)%512)...)
		if err := os.WriteFile(d.Path, data, 0o600); err != nil {
			return d, err
		}
	default:
		return d, fmt.Errorf("backend %q is not a file or a blob", c.Disk.BackendID)
	}
	return d, nil
}

func qemuPCI(p spec.PCIPath) qemu.PCIPath {
	return qemu.PCIPath{Bus: p.Bus, Device: p.Device, Function: p.Function}
}

// printable is an NVMe serial number as QEMU takes it: its printable ASCII,
// trailing spaces and NULs dropped.
func printable(b []byte) string {
	s := strings.TrimRight(string(b), " \x00")
	for _, c := range []byte(s) {
		if c < 0x20 || c > 0x7e {
			return ""
		}
	}
	return s
}

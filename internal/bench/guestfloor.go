package bench

// The guest benchmark's floor: the VMM service's QEMU command line for the
// same spec, started by hand.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/qemuvm"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// ovmfCode and ovmfVars are the VMM service's firmware: its flags'
// defaults, which the agent leaves as they are.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// qmpDialEvery is how often the floor looks for QEMU's QMP socket, as
// qemu.Start does.
const qmpDialEvery = 10 * time.Millisecond

// floorVM is one QEMU of the floor.
type floorVM struct {
	name, ns, dir, disk string
	path                string   // QEMU's program
	argv                []string // its command line, as qemuvm made it
	cmd                 *exec.Cmd
	exited              chan struct{} // closed once cmd has been waited for
	mon                 *qemu.Monitor
	com1                net.Conn

	mu      sync.Mutex
	console consoleTimes  // guarded by mu
	marked  chan struct{} // closed once the console showed the marker
}

// errCaught is what the floor's start hook answers qemuvm: the command is
// taken, not started.
var errCaught = errors.New("the command line is taken by the benchmark")

// newFloorVM prepares a floor VM (untimed): its directory and disk, the
// command line qemuvm builds for its spec, and its network namespace.
func (b *guestBench) newFloorVM(ctx context.Context) (*floorVM, error) {
	b.seq++
	vm := &floorVM{name: "floor-" + strconv.Itoa(b.seq), ns: b.prefix + "f" + strconv.Itoa(b.seq), exited: make(chan struct{}), marked: make(chan struct{})}
	vm.dir = filepath.Join(b.floors, vm.name)
	vm.disk = filepath.Join(vm.dir, "disk.raw")
	b.reg.addFloor(vm)
	if err := os.Mkdir(vm.dir, 0o700); err != nil {
		return nil, err
	}
	if err := copyDisk(vm.disk, b.opts.Image); err != nil {
		return nil, err
	}
	if err := vm.command(ctx); err != nil {
		return nil, err
	}
	ns, h, err := newNetns(netnsPath(vm.ns))
	if err != nil {
		return nil, fmt.Errorf("floor namespace %s: %w", vm.ns, err)
	}
	h.Close()
	ns.Close()
	return vm, nil
}

// command has qemuvm, the VMM service's backend, build the VM's QEMU
// command line from the spec the agent gives the service, with the
// service's options; the start hook takes it instead of starting QEMU.
func (vm *floorVM) command(ctx context.Context) error {
	raw, err := json.Marshal(guestSpec(vm.disk, spec.VNICName(vmmtest.MustMAC())))
	if err != nil {
		return err
	}
	v := qemuvm.New(qemuvm.Options{
		Name: vm.name, Dir: vm.dir, Binary: testguest.QEMU, FirmwareCode: ovmfCode, FirmwareVars: ovmfVars, Accel: qemu.TCG,
		Sled: spec.Sled{Threads: runtime.NumCPU(), FileRoots: []string{vm.dir}},
		Start: func(cmd *exec.Cmd) error {
			vm.path, vm.argv = cmd.Path, cmd.Args
			return errCaught
		},
	})
	err = v.Ensure(ctx, propolisapi.Properties{ID: uuid.NewString(), Name: "vm0"}, raw)
	v.Close(ctx)
	if !errors.Is(err, errCaught) {
		return fmt.Errorf("qemuvm did not build the floor's command line: %v", err)
	}
	return nil
}

// start starts QEMU in the VM's namespace, connects to its monitor and
// com1, and runs the guest; com1 is read from then on.
func (vm *floorVM) start(ctx context.Context) error {
	qmp, ok1 := chardevPath(vm.argv, "qmp")
	com1, ok2 := chardevPath(vm.argv, "com1")
	if !ok1 || !ok2 {
		return fmt.Errorf("no QMP or com1 socket in %q", vm.argv)
	}
	logf, err := os.Create(filepath.Join(vm.dir, "qemu.log"))
	if err != nil {
		return err
	}
	// As qemu.Start starts it: its own process group. And it dies with the
	// benchmark.
	cmd := &exec.Cmd{Path: vm.path, Args: vm.argv, Stdout: logf, Stderr: logf,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}}
	err = zonenet.StartIn(vm.ns, cmd)
	logf.Close()
	if err != nil {
		return err
	}
	vm.cmd = cmd
	go func() { cmd.Wait(); close(vm.exited) }()
	if vm.mon, err = dialQMP(ctx, qmp, vm.exited); err != nil {
		return fmt.Errorf("%w; %s", err, vm.logTail())
	}
	var d net.Dialer
	if vm.com1, err = d.DialContext(ctx, "unix", com1); err != nil {
		return fmt.Errorf("connecting to com1: %w", err)
	}
	go vm.readCom1()
	if err := vm.mon.Cont(ctx); err != nil {
		return fmt.Errorf("cont: %w", err)
	}
	return nil
}

// dialQMP connects to QEMU's monitor once its socket is there.
func dialQMP(ctx context.Context, path string, exited <-chan struct{}) (*qemu.Monitor, error) {
	for {
		mon, err := qemu.Dial(ctx, path)
		if err == nil {
			return mon, nil
		}
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, err
		}
		select {
		case <-exited:
			return nil, errors.New("QEMU exited before its monitor answered")
		case <-ctx.Done():
			return nil, fmt.Errorf("QEMU's monitor never answered: %w", ctx.Err())
		case <-time.After(qmpDialEvery):
		}
	}
}

// readCom1 reads com1 until QEMU closes it: the output is timed until the
// marker, and drained after it.
func (vm *floorVM) readCom1() {
	buf := make([]byte, 32<<10)
	for {
		n, err := vm.com1.Read(buf)
		now := time.Now()
		if n > 0 {
			vm.mu.Lock()
			if vm.console.marker == 0 && vm.console.add(buf[:n], now) {
				close(vm.marked)
			}
			vm.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// waitMarker waits until the VM's console shows the marker.
func (vm *floorVM) waitMarker(ctx context.Context) error {
	select {
	case <-vm.marked:
		return nil
	case <-vm.exited:
		return fmt.Errorf("QEMU exited before the marker: %s", vm.logTail())
	case <-ctx.Done():
		vm.mu.Lock()
		defer vm.mu.Unlock()
		return fmt.Errorf("no marker: %w; it printed %q", ctx.Err(), vm.console.tail())
	}
}

// logTail is the end of what QEMU wrote.
func (vm *floorVM) logTail() string {
	b, _ := os.ReadFile(filepath.Join(vm.dir, "qemu.log"))
	s := strings.TrimSpace(string(b))
	return "QEMU said: " + s[max(0, len(s)-500):]
}

// kill ends the VM's QEMU (its process group) and waits for it.
func (vm *floorVM) kill(ctx context.Context) error {
	if vm.cmd == nil {
		return nil
	}
	syscall.Kill(-vm.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-vm.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("floor QEMU %d did not die: %w", vm.cmd.Process.Pid, ctx.Err())
	}
}

// remove removes all of a floor VM: QEMU, connections, namespace, files.
func (vm *floorVM) remove(ctx context.Context) error {
	err := vm.kill(ctx)
	if vm.mon != nil {
		vm.mon.Close()
	}
	if vm.com1 != nil {
		vm.com1.Close()
	}
	return errors.Join(err, removeNetns(netnsPath(vm.ns)), os.RemoveAll(vm.dir))
}

// floorPhase starts n floor VMs at once and times their consoles until
// every one shows the marker, samples memory, then presses every power
// button and times until every QEMU has exited. The VMs are removed before
// it returns.
func (b *guestBench) floorPhase(ctx context.Context, n int) (p phase, err error) {
	vms := make([]*floorVM, 0, n)
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), b.opts.StopTimeout)
		defer cancel()
		for _, vm := range vms {
			if rerr := vm.remove(rctx); rerr != nil {
				err = errors.Join(err, fmt.Errorf("removing %s: %w", vm.name, rerr))
			} else {
				b.reg.doneFloor(vm)
			}
		}
	}()
	for range n {
		vm, err := b.newFloorVM(ctx)
		if vm != nil {
			vms = append(vms, vm)
		}
		if err != nil {
			return p, err
		}
	}

	bctx, cancel := context.WithTimeout(ctx, b.opts.BootTimeout)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, vm := range vms {
		vm.console.t0 = t0
		wg.Go(func() {
			if errs[i] = vm.start(bctx); errs[i] == nil {
				errs[i] = vm.waitMarker(bctx)
			}
		})
	}
	wg.Wait()
	if err := vmErrors(errs, func(i int) string { return vms[i].name }); err != nil {
		return p, err
	}
	for _, vm := range vms {
		vm.mu.Lock()
		p.firstByte = append(p.firstByte, vm.console.first)
		p.marker = append(p.marker, vm.console.marker)
		vm.mu.Unlock()
		kib, err := rssKiB(vm.cmd.Process.Pid)
		if err != nil {
			return p, err
		}
		p.mem.QEMUKiB = append(p.mem.QEMUKiB, kib)
	}
	p.argv = normaliseArgv(vms[0].argv, vms[0].name, vms[0].disk)
	if b.qemuVer == "" {
		v := vms[0].mon.Version()
		b.qemuVer = v.String()
	}

	sctx, cancel := context.WithTimeout(ctx, b.opts.StopTimeout)
	defer cancel()
	t1 := time.Now()
	for i, vm := range vms {
		wg.Go(func() {
			if errs[i] = vm.mon.SystemPowerdown(sctx); errs[i] != nil {
				return
			}
			select {
			case <-vm.exited:
			case <-sctx.Done():
				errs[i] = fmt.Errorf("QEMU did not exit after the power button: %w", sctx.Err())
			}
		})
	}
	wg.Wait()
	p.stop = time.Since(t1)
	return p, vmErrors(errs, func(i int) string { return vms[i].name })
}

// chardevPath is the socket path of QEMU's socket chardev id in argv.
func chardevPath(argv []string, id string) (string, bool) {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] != "-chardev" {
			continue
		}
		rest, ok := strings.CutPrefix(argv[i+1], "socket,id="+id+",path=")
		if !ok {
			continue
		}
		p, _, _ := strings.Cut(rest, ",server=")
		return strings.ReplaceAll(p, ",,", ","), true
	}
	return "", false
}

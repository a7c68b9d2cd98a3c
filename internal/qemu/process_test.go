package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// needQEMU skips a test where QEMU or OVMF is missing.
func needQEMU(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skipf("needs qemu-system-x86_64 (Debian package qemu-system-x86): %v", err)
	}
	for _, f := range []string{ovmfCode, ovmfVars} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("needs OVMF (Debian package ovmf): %v", err)
		}
	}
}

// tcgMachine is a q35 TCG machine with OVMF, no disks, and com1, all of its
// files in a fresh temporary directory.
func tcgMachine(t *testing.T) Machine {
	t.Helper()
	dir := t.TempDir()
	vars := filepath.Join(dir, "vars.fd")
	if err := PrepareVars(ovmfVars, vars); err != nil {
		t.Fatal(err)
	}
	return Machine{
		Name:      "test-vm",
		CPUs:      1,
		MemoryMiB: 256,
		Chipset:   Q35,
		Accel:     TCG,
		Firmware:  Firmware{Code: ovmfCode, Vars: vars},
		QMPSocket: filepath.Join(dir, "qmp.sock"),
		Serial:    []SerialPort{{Port: "com1", Socket: filepath.Join(dir, "com1.sock")}},
	}
}

// start starts m and kills it when the test ends, however it ends.
func start(t *testing.T, m Machine) *Process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	p, err := Start(ctx, m, StartOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("QEMU pid %d ready for QMP after %v", p.PID(), time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Kill(ctx); err != nil {
			t.Error(err)
		}
	})
	return p
}

// waitEvent reads events until one named name, within a minute.
func waitEvent(t *testing.T, m *Monitor, name string) Event {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case ev, ok := <-m.Events():
			if !ok {
				t.Fatalf("events closed while waiting for %s: %v", name, m.Err())
			}
			if ev.Name == name {
				return ev
			}
			t.Logf("event %s %s", ev.Name, ev.Data)
		case <-deadline:
			t.Fatalf("no %s event", name)
		}
	}
}

func wantStatus(t *testing.T, m *Monitor, status string, running bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := m.QueryStatus(ctx)
	if err != nil || st.Status != status || st.Running != running {
		t.Fatalf("QueryStatus = %+v, %v; want %s, running %v", st, err, status, running)
	}
}

func TestQEMULifecycle(t *testing.T) {
	needQEMU(t)
	p := start(t, tcgMachine(t))
	m := p.Monitor()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	wantStatus(t, m, "prelaunch", false)
	if err := m.Cont(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, m, "RESUME")
	wantStatus(t, m, "running", true)

	if err := m.SystemReset(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, m, "RESET")

	if err := m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, m, "STOP")
	wantStatus(t, m, "paused", false)
	if err := m.Cont(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, m, "RESUME")

	if err := m.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, m, "SHUTDOWN")
	for name, ch := range map[string]<-chan struct{}{"monitor": m.Done(), "process": p.Wait()} {
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("%s not done after quit", name)
		}
	}
	if st := p.ExitState(); st == nil || !st.Success() {
		t.Errorf("exit %v, want success", st)
	}
	if !errors.Is(m.Err(), ErrDisconnected) {
		t.Errorf("monitor ended with %v", m.Err())
	}
}

// A QEMU killed behind the client's back ends the monitor at once.
func TestQEMUKilled(t *testing.T) {
	needQEMU(t)
	p := start(t, tcgMachine(t))
	m := p.Monitor()
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(time.Second):
		t.Fatal("monitor not done a second after SIGKILL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	if err := m.Cont(ctx); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Cont on a dead QEMU = %v", err)
	}
	if d := time.Since(began); d > time.Second {
		t.Errorf("Cont on a dead QEMU took %v", d)
	}
	select {
	case <-p.Wait():
	case <-time.After(time.Minute):
		t.Fatal("not reaped")
	}
	if st := p.ExitState(); st == nil || st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("exit %v, want killed", st)
	}
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if n := monitorGoroutines(); n != 0 {
		t.Errorf("%d monitor goroutines left after Kill", n)
	}
}

// OVMF writes to com1 once the guest runs, with and without the sandbox.
func TestQEMUSerial(t *testing.T) {
	needQEMU(t)
	for _, sandbox := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "sandbox"}[sandbox], func(t *testing.T) {
			m := tcgMachine(t)
			m.Sandbox = sandbox
			p := start(t, m)
			if sandbox {
				status, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID()) + "/status")
				if err != nil || !strings.Contains(string(status), "Seccomp:\t2") {
					t.Errorf("QEMU has no seccomp filter (%v):\n%s", err, status)
				}
			}
			com1, err := net.Dial("unix", m.Serial[0].Socket)
			if err != nil {
				t.Fatal(err)
			}
			defer com1.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := p.Monitor().Cont(ctx); err != nil {
				t.Fatal(err)
			}
			// OVMF's first bytes, then its boot manager's report: by then it
			// has enumerated PCI and written its variable store.
			began := time.Now()
			com1.SetReadDeadline(began.Add(2 * time.Minute))
			var out []byte
			buf := make([]byte, 4096)
			for !strings.Contains(string(out), "BdsDxe") {
				n, err := com1.Read(buf)
				if len(out) == 0 && n > 0 {
					t.Logf("first serial bytes %v after cont: %q", time.Since(began).Round(time.Millisecond), buf[:n])
				}
				out = append(out, buf[:n]...)
				if err != nil {
					t.Fatalf("no BdsDxe on com1 within two minutes: %v; com1 said %q; QEMU said: %s", err, out, p.Stderr())
				}
			}
			t.Logf("BdsDxe %v after cont", time.Since(began).Round(time.Millisecond))
		})
	}
}

// QEMU takes every kind of disk, all four serial ports, pvpanic and the
// sandbox, on both boards, and puts the disks where they were asked for;
// as well when it is given every file and socket as a descriptor.
func TestQEMUDevices(t *testing.T) {
	needQEMU(t)
	for _, descriptors := range []bool{false, true} {
		for _, chipset := range []Chipset{Q35, I440FX} {
			t.Run(map[bool]string{false: "paths", true: "descriptors"}[descriptors]+"/"+string(chipset), func(t *testing.T) {
				m := tcgMachine(t)
				m.Chipset = chipset
				m.Descriptors = descriptors
				dir := filepath.Dir(m.QMPSocket)
				for i, name := range []string{"a", "b", "c"} {
					path := filepath.Join(dir, name+",disk.img")
					if err := os.WriteFile(path, nil, 0o644); err != nil {
						t.Fatal(err)
					}
					if err := os.Truncate(path, int64(i+1)<<20); err != nil {
						t.Fatal(err)
					}
				}
				m.Disks = []Disk{
					{ID: "boot", Kind: VirtioBlk, PCI: PCIPath{0, 4, 0}, Path: filepath.Join(dir, "a,disk.img"), BlockSize: 512},
					{ID: "data", Kind: NVMe, PCI: PCIPath{0, 5, 0}, Path: filepath.Join(dir, "b,disk.img"), BlockSize: 4096, Serial: "data-1", NoWriteCache: true},
					{ID: "seed", Kind: VirtioBlk, PCI: PCIPath{0, 5, 1}, Path: filepath.Join(dir, "c,disk.img"), BlockSize: 4096, ReadOnly: true},
				}
				for _, port := range []string{"com2", "com3", "com4"} {
					m.Serial = append(m.Serial, SerialPort{Port: port, Socket: filepath.Join(dir, port+".sock")})
				}
				m.Pvpanic = true
				m.BootOrder = []string{"seed", "boot"}
				m.Sandbox = true
				p := start(t, m)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				var buses []struct {
					Devices []struct {
						Slot, Function int
						QdevID         string `json:"qdev_id"`
					}
				}
				if err := p.Monitor().Execute(ctx, "query-pci", nil, &buses); err != nil {
					t.Fatal(err)
				}
				at := map[string]string{}
				for _, d := range buses[0].Devices {
					at[d.QdevID] = strconv.Itoa(d.Slot) + "." + strconv.Itoa(d.Function)
				}
				for id, want := range map[string]string{"boot": "4.0", "data": "5.0", "seed": "5.1"} {
					if at[id] != want {
						t.Errorf("%s at %q, want %s (devices: %v)", id, at[id], want, at)
					}
				}
				var wc string
				if err := p.Monitor().Execute(ctx, "qom-get", map[string]string{"path": "/machine/peripheral/data", "property": "write-cache"}, &wc); err != nil {
					t.Fatal(err)
				}
				if wc != "off" {
					t.Errorf("NVMe disk without a write cache: write-cache %q, want off", wc)
				}
				var chardevs []struct{ Label string }
				if err := p.Monitor().Execute(ctx, "query-chardev", nil, &chardevs); err != nil {
					t.Fatal(err)
				}
				if len(chardevs) != 5 {
					t.Errorf("chardevs %v, want qmp and four ports", chardevs)
				}
				files := blockFiles(t, p.Monitor())
				if !descriptors {
					if files["boot"] != m.Disks[0].Path || files["seed"] != m.Disks[2].Path {
						t.Errorf("block files %v", files)
					}
					wantStatus(t, p.Monitor(), "prelaunch", false)
					return
				}
				// Every file is an fd set of QEMU's, labelled with its path.
				sets := fdSets(t, p.Monitor())
				for id, path := range map[string]string{"boot": m.Disks[0].Path, "data": m.Disks[1].Path, "seed": m.Disks[2].Path,
					"pflash0": m.Firmware.Code, "pflash1": m.Firmware.Vars} {
					if !strings.HasPrefix(files[id], "/dev/fdset/") || sets[files[id]] != path {
						t.Errorf("%s: file %q, its fd set labelled %q; want an fd set of %s", id, files[id], sets[files[id]], path)
					}
				}
				// The sockets Start made are QEMU's: com4 answers, as QMP did.
				com4, err := net.Dial("unix", m.Serial[3].Socket)
				if err != nil {
					t.Fatalf("com4: %v", err)
				}
				com4.Close()
				wantStatus(t, p.Monitor(), "prelaunch", false)
			})
		}
	}
}

// blockFiles maps each block device (by its qdev id, or flash0 and flash1
// as pflash0 and pflash1) to the file QEMU has it in.
func blockFiles(t *testing.T, m *Monitor) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var blocks []struct {
		Qdev     string
		Inserted *struct{ File string }
	}
	if err := m.Execute(ctx, "query-block", nil, &blocks); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, b := range blocks {
		if b.Inserted == nil {
			continue
		}
		id := strings.TrimSuffix(strings.TrimPrefix(b.Qdev, "/machine/peripheral/"), "/virtio-backend")
		id = strings.Replace(id, "/machine/system.flash", "pflash", 1)
		files[id] = b.Inserted.File
	}
	return files
}

// fdSets maps /dev/fdset/N to the label of QEMU's fd set N.
func fdSets(t *testing.T, m *Monitor) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sets []struct {
		ID  int `json:"fdset-id"`
		FDs []struct{ Opaque string }
	}
	if err := m.Execute(ctx, "query-fdsets", nil, &sets); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range sets {
		if len(s.FDs) != 1 {
			t.Errorf("fd set %d holds %d descriptors, want one", s.ID, len(s.FDs))
			continue
		}
		out["/dev/fdset/"+strconv.Itoa(s.ID)] = s.FDs[0].Opaque
	}
	return out
}

// A file that cannot be given to QEMU fails Start before QEMU runs, naming
// it: a missing disk, and a FIFO, refused without blocking on it.
func TestStartDescriptorRefusals(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path string
		want string
		is   error
	}{
		{filepath.Join(dir, "missing.img"), `disk "d": open ` + filepath.Join(dir, "missing.img"), fs.ErrNotExist},
		{fifo, `disk "d": ` + fifo + " is not a regular file", nil},
	} {
		m := minimal()
		m.Descriptors = true
		m.Firmware = Firmware{Code: os.Args[0], Vars: filepath.Join(dir, "vars.fd")}
		if err := os.WriteFile(m.Firmware.Vars, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		m.QMPSocket = filepath.Join(dir, "qmp.sock")
		m.Disks = []Disk{{ID: "d", Kind: VirtioBlk, PCI: PCIPath{0, 4, 0}, Path: tt.path, BlockSize: 512}}
		started := false
		_, err := Start(context.Background(), m, StartOptions{Start: func(*exec.Cmd) error { started = true; return nil }})
		if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), tt.want) || tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("Start = %v; want ErrStart saying %q", err, tt.want)
		}
		if started {
			t.Errorf("%s: QEMU started", tt.path)
		}
	}
}

// A disk's File is what QEMU is given, in its fd set: its Path is not
// opened (here it names nothing), and the File stays open, the caller's.
func TestStartGivesTheDisksFile(t *testing.T) {
	dir := t.TempDir()
	m := minimal()
	m.Descriptors = true
	m.Firmware = Firmware{Code: os.Args[0], Vars: filepath.Join(dir, "vars.fd")}
	if err := os.WriteFile(m.Firmware.Vars, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m.QMPSocket = filepath.Join(dir, "qmp.sock")
	f, err := os.CreateTemp(dir, "disk")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m.Disks = []Disk{{ID: "d", Kind: VirtioBlk, PCI: PCIPath{0, 4, 0}, Path: filepath.Join(dir, "missing.img"), File: f, BlockSize: 512}}
	var given []*os.File
	var args []string
	errCaught := errors.New("caught")
	_, err = Start(context.Background(), m, StartOptions{Start: func(cmd *exec.Cmd) error {
		given, args = slices.Clone(cmd.ExtraFiles), cmd.Args
		return errCaught
	}})
	if !errors.Is(err, errCaught) {
		t.Fatalf("Start = %v", err)
	}
	i := slices.Index(given, f)
	if i < 0 {
		t.Fatalf("the disk's file is not among QEMU's descriptors %v", given)
	}
	if want := fmt.Sprintf("fd=%d,set=%d,opaque=%s", i+3, i+3, m.Disks[0].Path); !slices.Contains(args, want) {
		t.Errorf("no -add-fd %s in %q", want, args)
	}
	if _, err := f.Stat(); err != nil {
		t.Errorf("Start closed the caller's file: %v", err)
	}
}

// QEMU's refusal reaches the caller in its own words, and nothing is left.
func TestStartQEMURefuses(t *testing.T) {
	needQEMU(t)
	m := tcgMachine(t)
	missing := filepath.Join(t.TempDir(), "missing.img")
	m.Disks = []Disk{{ID: "d", Kind: VirtioBlk, PCI: PCIPath{0, 4, 0}, Path: missing, BlockSize: 512}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Start(ctx, m, StartOptions{})
	var se *StartError
	if !errors.As(err, &se) || !errors.Is(err, ErrExited) {
		p.Kill(ctx)
		t.Fatalf("Start = %v, want a StartError wrapping ErrExited", err)
	}
	if se.Exit != "exit status 1" || !strings.Contains(se.Output, missing) || !strings.Contains(err.Error(), missing) {
		t.Errorf("StartError %q, exit %q, output %q", err, se.Exit, se.Output)
	}
}

// fakeQEMU writes a script that ignores its arguments and does what body says.
func fakeQEMU(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qemu")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// A QEMU whose QMP socket never comes is killed and reaped at the deadline.
func TestStartDeadline(t *testing.T) {
	m := minimal()
	m.Firmware.Vars = filepath.Join(t.TempDir(), "vars.fd")
	m.QMPSocket = filepath.Join(t.TempDir(), "qmp.sock")
	started := 0
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := Start(ctx, m, StartOptions{
		Binary: fakeQEMU(t, "echo starting >&2; exec sleep 60"),
		Start: func(cmd *exec.Cmd) error {
			started++
			return cmd.Start()
		},
	})
	var se *StartError
	if !errors.As(err, &se) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start = %v, want a StartError at the deadline", err)
	}
	if started != 1 {
		t.Errorf("Start hook called %d times", started)
	}
	if se.Exit != "signal: killed" || se.Output != "starting\n" {
		t.Errorf("exit %q, output %q: want killed, reaped, and its output", se.Exit, se.Output)
	}
}

// A QEMU that exits at once ends Start at once, with its words.
func TestStartExits(t *testing.T) {
	m := minimal()
	m.QMPSocket = filepath.Join(t.TempDir(), "qmp.sock")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err := Start(ctx, m, StartOptions{Binary: fakeQEMU(t, "echo 'qemu-system-x86_64: no such thing' >&2; exit 1")})
	if !errors.Is(err, ErrExited) || !strings.HasSuffix(err.Error(), "(exit status 1): qemu-system-x86_64: no such thing") {
		t.Fatalf("Start = %v", err)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("Start took %v to see QEMU exit", d)
	}
}

func TestStartRefusals(t *testing.T) {
	m := minimal()
	m.CPUs = 0
	if _, err := Start(context.Background(), m, StartOptions{Binary: "/nonexistent"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Start of an invalid machine = %v", err)
	}
	m = minimal()
	m.QMPSocket = filepath.Join(t.TempDir(), "qmp.sock")
	if _, err := Start(context.Background(), m, StartOptions{Binary: "/nonexistent/qemu"}); !errors.Is(err, ErrStart) {
		t.Errorf("Start of a missing binary = %v", err)
	}
	hookErr := errors.New("no cgroup")
	_, err := Start(context.Background(), m, StartOptions{Start: func(*exec.Cmd) error { return hookErr }})
	if !errors.Is(err, ErrStart) || !errors.Is(err, hookErr) {
		t.Errorf("Start with a failing hook = %v", err)
	}
}

func TestTail(t *testing.T) {
	var tl tail
	tl.Write([]byte("short\n"))
	if tl.String() != "short\n" {
		t.Fatalf("tail %q", tl.String())
	}
	for i := range 2000 {
		tl.Write([]byte("line " + strconv.Itoa(i) + "\n"))
	}
	s := tl.String()
	if len(s) > OutputLimit || !strings.HasPrefix(s, "line ") || !strings.HasSuffix(s, "line 1999\n") {
		t.Errorf("tail of %d bytes: %q…%q", len(s), s[:20], s[len(s)-20:])
	}
}

// nobody is the user and group ids of the unprivileged user the tests run
// QEMU as; they skip where they cannot switch to it.
func nobody(t *testing.T) (uid, gid uint32) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch QEMU to another user")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("needs the user nobody: %v", err)
	}
	id := func(s string) uint32 {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			t.Fatalf("nobody's id %q: %v", s, err)
		}
		return uint32(n)
	}
	return id(u.Uid), id(u.Gid)
}

// startAs is the StartOptions that start QEMU as uid and gid.
func startAs(uid, gid uint32) StartOptions {
	return StartOptions{Start: func(cmd *exec.Cmd) error {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
		return cmd.Start()
	}}
}

// procStatus is a line of /proc/<pid>/status.
func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// -runas: QEMU opens its files as root, then becomes the user.
func TestQEMURunAs(t *testing.T) {
	needQEMU(t)
	uid, _ := nobody(t)
	want := strconv.FormatUint(uint64(uid), 10)
	m := tcgMachine(t)
	m.RunAs = "nobody"
	p := start(t, m)
	wantStatus(t, p.Monitor(), "prelaunch", false)
	if got := procStatus(t, p.PID(), "Uid"); !strings.HasPrefix(got, want+" ") {
		t.Errorf("QEMU runs as uid %s, want %s", got, want)
	}
}

// An unprivileged QEMU, started as the user with the sandbox on, runs a
// machine whose files are root's alone (0600, in a directory of mode 0700)
// because it is given them: the firmware variables and disks as fd sets,
// read-only and read-write, and the QMP and serial sockets listening. By
// their paths, it could open none of them.
func TestQEMUUnprivileged(t *testing.T) {
	needQEMU(t)
	uid, gid := nobody(t)
	m := tcgMachine(t)
	m.Sandbox = true
	dir := filepath.Dir(m.QMPSocket)
	m.Disks = []Disk{
		{ID: "boot", Kind: VirtioBlk, PCI: PCIPath{0, 4, 0}, Path: filepath.Join(dir, "boot.img"), BlockSize: 512},
		{ID: "seed", Kind: VirtioBlk, PCI: PCIPath{0, 5, 0}, Path: filepath.Join(dir, "seed.img"), BlockSize: 512, ReadOnly: true},
	}
	for _, d := range m.Disks {
		if err := os.WriteFile(d.Path, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(m.Firmware.Vars, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	asNobody := startAs(uid, gid)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// By path: QEMU cannot reach its own files.
	if p, err := Start(ctx, m, asNobody); err == nil {
		p.Kill(ctx)
		t.Fatal("QEMU as nobody started with paths it should not reach")
	} else {
		t.Logf("by path: %v", err)
	}

	m.Descriptors = true
	p, err := Start(ctx, m, asNobody)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(context.Background()) })
	for _, field := range []string{"Uid", "Gid"} {
		want := strings.TrimSpace(strings.Repeat(strconv.FormatUint(uint64(map[string]uint32{"Uid": uid, "Gid": gid}[field]), 10)+" ", 4))
		if got := procStatus(t, p.PID(), field); got != want {
			t.Errorf("QEMU's %s (real, effective, saved, file system) %s, want %s", field, got, want)
		}
	}
	for _, field := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
		if got := procStatus(t, p.PID(), field); got != "0000000000000000" {
			t.Errorf("QEMU's %s %s, want none", field, got)
		}
	}
	if got := procStatus(t, p.PID(), "Seccomp"); got != "2" {
		t.Errorf("seccomp mode %s, want 2 (filter)", got)
	}
	for _, d := range m.Disks {
		st, err := os.Stat(d.Path)
		if err != nil || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: %v, %v: want root's, 0600, as it was", d.Path, st.Mode(), err)
		}
	}
	com1, err := net.Dial("unix", m.Serial[0].Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer com1.Close()
	if err := p.Monitor().Cont(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, p.Monitor(), "RESUME")
	// OVMF gets as far as its boot manager, having written its variables.
	com1.SetReadDeadline(time.Now().Add(2 * time.Minute))
	var out []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(out), "BdsDxe") {
		n, err := com1.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			t.Fatalf("no BdsDxe on com1: %v; com1 said %q; QEMU said: %s", err, out, p.Stderr())
		}
	}
	wantStatus(t, p.Monitor(), "running", true)
}

package qemuvm

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/vmm/qemujail"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// TestMain lets the test binary play QEMU: started with QEMU's arguments
// (which begin with -name), it serves QMP and com1 on their sockets.
func TestMain(m *testing.M) {
	qemujail.RunIfAsked() // QEMU, shut in
	if len(os.Args) > 1 && os.Args[1] == "-name" {
		fakeQEMU(os.Args[1:])
		// Not os.Exit: with the race detector, that waits a second
		// for the other threads.
		syscall.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeQEMU answers QMP as QEMU holding a guest paused does, runs the guest
// at "cont", and exits at "quit"; it accepts com1's connection and says
// nothing on it. Its sockets are made at their paths, or handed to it
// listening (fd=N); with probeEnv set, it first tries what a guest escaped
// into QEMU would (probe) and says what it reached on stderr.
func fakeQEMU(args []string) {
	if p := os.Getenv(probeEnv); p != "" {
		probe(p)
	}
	socks := map[string]net.Listener{}
	for i, a := range args {
		if a != "-chardev" || i+1 == len(args) {
			continue
		}
		var id, path string
		fd := -1
		for _, o := range strings.Split(strings.ReplaceAll(args[i+1], ",,", "\x00"), ",") {
			o = strings.ReplaceAll(o, "\x00", ",")
			if v, ok := strings.CutPrefix(o, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(o, "path="); ok {
				path = v
			}
			if v, ok := strings.CutPrefix(o, "fd="); ok {
				fd, _ = strconv.Atoi(v)
			}
		}
		var ln net.Listener
		var err error
		if fd >= 0 {
			ln, err = net.FileListener(os.NewFile(uintptr(fd), id))
		} else {
			ln, err = net.Listen("unix", path)
		}
		if err == nil {
			socks[id] = ln
		}
	}
	if c := socks["com1"]; c != nil {
		go func() {
			for {
				conn, err := c.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
			}
		}()
	}
	ln := socks["qmp"]
	if ln == nil {
		syscall.Exit(2)
	}
	conn, err := ln.Accept()
	if err != nil {
		syscall.Exit(2)
	}
	conn.Write([]byte(`{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": "fake"}, "capabilities": []}}` + "\r\n"))
	running := false
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		var cmd struct {
			Execute string          `json:"execute"`
			ID      json.RawMessage `json:"id"`
		}
		if json.Unmarshal(sc.Bytes(), &cmd) != nil {
			continue
		}
		ret := `{}`
		switch cmd.Execute {
		case "cont":
			running = true
		case "query-status":
			ret = `{"status": "prelaunch", "running": false}`
			if running {
				ret = `{"status": "running", "running": true}`
			}
		}
		conn.Write([]byte(`{"return": ` + ret + `, "id": ` + string(cmd.ID) + "}\r\n"))
		if cmd.Execute == "quit" {
			return
		}
	}
}

// fakeConfinement says what it was told to, and records its use.
type fakeConfinement struct {
	how, kill string

	mu      sync.Mutex
	guest   Guest
	wrapped bool
	started int // pid
}

func (c *fakeConfinement) Start(next func(*exec.Cmd) error) func(*exec.Cmd) error {
	c.mu.Lock()
	c.wrapped = true
	c.mu.Unlock()
	return func(cmd *exec.Cmd) error {
		if next == nil {
			next = (*exec.Cmd).Start
		}
		if err := next(cmd); err != nil {
			return err
		}
		c.mu.Lock()
		c.started = cmd.Process.Pid
		c.mu.Unlock()
		return nil
	}
}

func (c *fakeConfinement) String() string     { return c.how }
func (c *fakeConfinement) MemoryKill() string { return c.kill }

// fakeVM is a VM whose QEMU is this test binary, confined by conf.
func fakeVM(t *testing.T, conf *fakeConfinement) (*VM, string) {
	t.Helper()
	storage := t.TempDir()
	disk := filepath.Join(storage, "boot.raw")
	fw := filepath.Join(t.TempDir(), "fw.fd")
	for _, f := range []string{disk, fw} {
		if err := os.WriteFile(f, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	vm := New(Options{
		Name:         "qemuvm-fake",
		Dir:          t.TempDir(),
		Binary:       os.Args[0],
		FirmwareCode: fw,
		FirmwareVars: fw,
		Accel:        qemu.TCG,
		Sled:         spec.Sled{Threads: 2, FileRoots: []string{storage}},
		Confine: func(g Guest) Confinement {
			conf.mu.Lock()
			conf.guest = g
			conf.mu.Unlock()
			return conf
		},
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		vm.Close(ctx)
	})
	return vm, disk
}

// QEMU is started through the confinement made for the guest's size; how
// it is confined is in the details of the states while it runs, and a
// QEMU killed at the memory limit fails the guest saying so.
func TestConfinement(t *testing.T) {
	for _, tt := range []struct {
		name, kill string
	}{
		{"killed by the memory limit", "killed by its cgroup's memory limit of 1560 MiB (oom_kill 1 in memory.events)"},
		{"killed otherwise", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conf := &fakeConfinement{how: "confined in cgroup x.guest: memory ≤ 1560 MiB (cgroup v1), CPU ≤ 1.25 (cgroup v1)", kill: tt.kill}
			vm, disk := fakeVM(t, conf)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := vm.Ensure(ctx, props, specJSON(disk, false)); err != nil {
				t.Fatal(err)
			}
			conf.mu.Lock()
			guest, wrapped, pid := conf.guest, conf.wrapped, conf.started
			conf.mu.Unlock()
			if want := (Guest{CPUs: 1, MemoryMiB: 256, Accel: qemu.TCG}); guest != want || !wrapped || pid == 0 {
				t.Fatalf("confinement asked for %+v (want %+v), wrapped start %v, started pid %d", guest, want, wrapped, pid)
			}
			if d := vm.detailNow(); !strings.Contains(d, "paused") || !strings.HasSuffix(d, "; QEMU "+conf.how) {
				t.Errorf("Creating: detail %q does not say how QEMU is confined", d)
			}
			if err := vm.Request(ctx, propolisapi.RequestRun); err != nil {
				t.Fatal(err)
			}
			st := vm.Wait(ctx, 0)
			for st.State != propolisapi.StateRunning && ctx.Err() == nil {
				st = vm.Wait(ctx, st.Gen)
			}
			if d := vm.detailNow(); d != "QEMU runs the guest; QEMU "+conf.how {
				t.Errorf("Running: detail %q", d)
			}
			syscall.Kill(pid, syscall.SIGKILL)
			for st.State != propolisapi.StateFailed && ctx.Err() == nil {
				st = vm.Wait(ctx, st.Gen)
			}
			d := vm.detailNow()
			if !strings.HasPrefix(d, "QEMU signal: killed") {
				t.Errorf("Failed: detail %q", d)
			}
			if got := strings.Contains(d, "signal: killed: "+tt.kill+": "); got != (tt.kill != "") || tt.kill == "" && strings.Contains(d, "memory") {
				t.Errorf("Failed: detail %q, want the memory kill said only when the confinement counted one", d)
			}
		})
	}
}

// Without a confinement the details are as before.
func TestNoConfinement(t *testing.T) {
	vm, disk := fakeVM(t, &fakeConfinement{})
	vm.opts.Confine = nil
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := vm.Ensure(ctx, props, specJSON(disk, false)); err != nil {
		t.Fatal(err)
	}
	if d := vm.detailNow(); d != "QEMU holds the guest paused until it is asked to run" {
		t.Errorf("detail %q", d)
	}
}

//go:build linux

package supervise

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets the test binary be a direct service (PrepareDirect): runsv
// starts it as ./run, and it runs as the argv it was prepared with. One that
// cannot find its argv exits, and never runs the tests again.
func TestMain(m *testing.M) {
	argv, ok, err := RunArgs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if ok {
		SetTitle(argv)
		os.Args = argv
	}
	os.Exit(m.Run())
}

// newDirectService is newService prepared with PrepareDirect.
func newDirectService(t *testing.T, env []string, args ...string) (*service, []string) {
	t.Helper()
	s := newService(t, env, args...) // a script first: cleanup registered
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{exe, "-test.run=^TestHelperProcess$", "--"}, args...)
	env = append([]string{helperEnv + "=1", helperPidFile + "=" + s.pidFile}, env...)
	if err := PrepareDirect(s.dir, argv, env); err != nil {
		t.Fatal(err)
	}
	return s, argv
}

func TestDirectService(t *testing.T) {
	t.Parallel()
	argsFile := filepath.Join(t.TempDir(), "args")
	s, argv := newDirectService(t, []string{helperArgsFile + "=" + argsFile, "HELPER_VALUE=it's $HOME"}, "a b", "'c'")
	if target, err := os.Readlink(filepath.Join(s.dir, runFile)); err != nil || target != argv[0] {
		t.Fatalf("run links to %q (%v), want %q", target, err, argv[0])
	}
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	if ppid := mustStat(t, pid).ppid; ppid != p.PID {
		t.Errorf("service's parent = %d, want runsv %d: nothing in between", ppid, p.PID)
	}
	// Its arguments and environment arrive untouched.
	var got struct {
		Args  []string `json:"args"`
		Value string   `json:"value"`
	}
	waitFor(t, "the helper's arguments", func() (bool, string) {
		b, err := os.ReadFile(argsFile)
		return err == nil && json.Unmarshal(b, &got) == nil, fmt.Sprint(err)
	})
	if strings.Join(got.Args, "|") != "a b|'c'" || got.Value != "it's $HOME" {
		t.Errorf("helper saw %+v", got)
	}
	// ps shows it as what it runs, not as ./run: its command line where
	// the kernel lets a process move it (CAP_SYS_RESOURCE), and its name.
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err := SetTitle(os.Args); errors.Is(err, unix.EPERM) {
		t.Logf("no CAP_SYS_RESOURCE here: the command line stays %q", cmdline)
	} else if want := strings.Join(argv, "\x00") + "\x00"; string(cmdline) != want {
		t.Errorf("cmdline = %q, want %q (SetTitle here: %v)", cmdline, want, err)
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if want := filepath.Base(argv[0]); !strings.HasPrefix(want, strings.TrimSpace(string(comm))) {
		t.Errorf("comm = %q, want (the start of) %q", comm, want)
	}
	// runsv carries the mark to hand it down, but is not a marked process.
	marked, err := ListMarked(filepath.Dir(s.dir))
	if err != nil || len(marked) != 1 || marked[0].PID != pid {
		t.Errorf("ListMarked = %+v, %v; want only the service %d", marked, err, pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Stop(ctx, s.dir); err != nil {
		t.Fatal(err)
	}
	if running(pid) || running(p.PID) {
		t.Errorf("left running: service %v, runsv %v", running(pid), running(p.PID))
	}
}

// A runsv started for a run script has only PATH: when the directory turns
// direct, Start replaces it with one that has the service's environment,
// and back again.
func TestStartReplacesRunsvWithStaleEnvironment(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	old := start(t, s.dir)
	pid := s.waitUp(t, 0)
	exe, _ := os.Executable()
	argv := []string{exe, "-test.run=^TestHelperProcess$", "--"}
	if err := PrepareDirect(s.dir, argv, []string{helperEnv + "=1", helperPidFile + "=" + s.pidFile}); err != nil {
		t.Fatal(err)
	}
	direct := start(t, s.dir)
	if direct.PID == old.PID || !old.Exited() {
		t.Fatalf("runsv %d kept (exited: %v)", old.PID, old.Exited())
	}
	pid = s.waitUp(t, pid)
	if err := Prepare(s.dir, argv, []string{helperEnv + "=1", helperPidFile + "=" + s.pidFile}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(s.dir, runFile)); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("run after Prepare: %v, %v; want a script", fi, err)
	}
	script := start(t, s.dir)
	if script.PID == direct.PID || !direct.Exited() {
		t.Fatalf("runsv %d kept (exited: %v)", direct.PID, direct.Exited())
	}
	s.waitUp(t, pid)
}

func TestRunArgs(t *testing.T) {
	dir := t.TempDir()
	saved := os.Args
	t.Cleanup(func() { os.Args = saved })

	os.Args = []string{"./run"}
	t.Setenv(MarkerEnv, "")
	if _, ok, err := RunArgs(); ok || err == nil {
		t.Errorf("./run without the mark: ok %v, err %v; want an error", ok, err)
	}
	t.Setenv(MarkerEnv, dir)
	if _, ok, err := RunArgs(); ok || err == nil {
		t.Errorf("./run without run.args: ok %v, err %v; want an error", ok, err)
	}
	if err := PrepareDirect(dir, []string{"/bin/true", "x"}, nil); err != nil {
		t.Fatal(err)
	}
	if argv, ok, err := RunArgs(); !ok || err != nil || strings.Join(argv, " ") != "/bin/true x" {
		t.Errorf("RunArgs = %q, %v, %v", argv, ok, err)
	}
	os.Args = []string{"/usr/bin/something", "x"}
	if _, ok, err := RunArgs(); ok || err != nil {
		t.Errorf("not ./run: ok %v, err %v; want neither", ok, err)
	}
	if err := PrepareDirect(dir, []string{"relative"}, nil); err == nil {
		t.Error("PrepareDirect accepted a relative program")
	}
}

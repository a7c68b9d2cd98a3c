//go:build linux

package supervise

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The helper process: the test binary run again as a supervised service.
const (
	helperEnv      = "SUPERVISE_TEST_HELPER"
	helperPidFile  = "HELPER_PID_FILE"  // where it writes its pid
	helperArgsFile = "HELPER_ARGS_FILE" // where it writes its arguments after "--" and HELPER_VALUE
	helperNoTerm   = "HELPER_IGNORE_TERM"
	helperTermFile = "HELPER_TERM_FILE" // where it writes "TERM" when SIGTERM ends it
)

// TestHelperProcess is not a test: it is the service the other tests
// supervise. It lives at most ten minutes, so that one lost by a crashed test
// run does not live forever (runsv would restart it, but Stop ends both).
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for the other tests")
	}
	if os.Getenv(helperNoTerm) == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	if f := os.Getenv(helperTermFile); f != "" {
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		go func() {
			<-term
			writeFile(f, []byte("TERM"))
			os.Exit(0)
		}()
	}
	if f := os.Getenv(helperArgsFile); f != "" {
		args := os.Args[slices.Index(os.Args, "--")+1:]
		b, _ := json.Marshal(map[string]any{"args": args, "value": os.Getenv("HELPER_VALUE")})
		writeFile(f, b)
	}
	writeFile(os.Getenv(helperPidFile), []byte(strconv.Itoa(os.Getpid())))
	time.Sleep(10 * time.Minute)
	os.Exit(0)
}

func writeFile(path string, b []byte) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		os.Exit(3)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Exit(3)
	}
}

// service is a prepared service directory running the helper.
type service struct {
	dir     string // the service directory
	pidFile string
}

// newService prepares a helper service in a fresh directory and registers,
// before anything starts, a cleanup that stops it and kills what is left.
func newService(t *testing.T, env []string, args ...string) *service {
	t.Helper()
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("runsv (runit) is not on PATH: these tests supervise real processes with it")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	s := &service{dir: filepath.Join(root, "svc"), pidFile: filepath.Join(root, "pid")}
	argv := append([]string{exe, "-test.run=^TestHelperProcess$", "--"}, args...)
	env = append([]string{helperEnv + "=1", helperPidFile + "=" + s.pidFile}, env...)
	if err := Prepare(s.dir, argv, env); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanup(t, s.dir) })
	return s
}

// cleanup stops the service with a deadline, then SIGKILLs anything left.
func cleanup(t *testing.T, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Stop(ctx, dir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, pid := range leftovers(t, dir) {
		t.Errorf("cleanup: process %d left behind after Stop; killing it", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// leftovers scans /proc, independently of the package, for live runsvs
// working in dir and for processes carrying dir's mark.
func leftovers(t *testing.T, dir string) []int {
	t.Helper()
	abs, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pids()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, pid := range all {
		proc := "/proc/" + strconv.Itoa(pid)
		stat, err := os.ReadFile(proc + "/stat")
		if err != nil || bytes.Contains(stat, []byte(") Z ")) {
			continue
		}
		cwd, _ := os.Readlink(proc + "/cwd")
		env, _ := os.ReadFile(proc + "/environ")
		if (bytes.HasPrefix(stat, []byte(strconv.Itoa(pid)+" (runsv) ")) && cwd == abs) ||
			slices.Contains(strings.Split(string(env), "\x00"), MarkerEnv+"="+abs) {
			out = append(out, pid)
		}
	}
	return out
}

// running reports whether process pid exists and is not a zombie.
func running(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z'
}

// waitFor polls cond until it holds; the deadline only detects hangs.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %s", what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitUp waits until Status reports the helper up with the pid it wrote,
// other than not, and returns that pid.
func (s *service) waitUp(t *testing.T, not int) int {
	t.Helper()
	var pid int
	waitFor(t, "the service to be up", func() (bool, string) {
		st, err := Status(s.dir)
		if err != nil {
			return false, err.Error()
		}
		b, _ := os.ReadFile(s.pidFile)
		pid, _ = strconv.Atoi(string(b))
		return st.Up && st.Supervised && st.PID == pid && pid != not, fmt.Sprintf("%+v, pid file %d", st, pid)
	})
	return pid
}

func start(t *testing.T, dir string) *Proc {
	t.Helper()
	p, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestStartStatusRestart(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	st, err := Status(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(st.Since); d < -time.Minute || d > time.Minute {
		t.Errorf("Since = %v, want about now", st.Since)
	}
	if !st.WantUp || st.Phase != "run" {
		t.Errorf("status %+v, want phase run, want up", st)
	}

	// runsv restarts a service that dies, and the finish script records how.
	syscall.Kill(pid, syscall.SIGKILL)
	newPid := s.waitUp(t, pid)
	if running(pid) {
		t.Errorf("old service %d still runs", pid)
	}
	st, err = Status(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.LastExit == nil || *st.LastExit != (Exit{Code: -1, Signal: int(syscall.SIGKILL)}) {
		t.Errorf("LastExit = %+v, want killed by SIGKILL", st.LastExit)
	}
	if !running(p.PID) || p.Exited() {
		t.Errorf("runsv %d exited", p.PID)
	}
	if ppid := mustStat(t, newPid).ppid; ppid != p.PID {
		t.Errorf("service's parent = %d, want runsv %d", ppid, p.PID)
	}
	// Detached: in its own session.
	if sid, _ := unix.Getsid(p.PID); sid != p.PID {
		t.Errorf("runsv session = %d, want its own (%d)", sid, p.PID)
	}
}

func mustStat(t *testing.T, pid int) procStat {
	t.Helper()
	st, err := readStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestFindAfterAgentRestart(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	if _, ok, err := Find(s.dir); err != nil || ok {
		t.Fatalf("Find before Start = %v, %v; want none", ok, err)
	}
	if _, ok, err := Find(filepath.Join(s.dir, "missing")); err != nil || ok {
		t.Fatalf("Find on a missing dir = %v, %v; want none", ok, err)
	}
	p := start(t, s.dir)
	s.waitUp(t, 0)
	pid := p.PID
	p.Close() // the agent forgets everything

	q, ok, err := Find(s.dir)
	if err != nil || !ok {
		t.Fatalf("Find = %v, %v", ok, err)
	}
	defer q.Close()
	if q.PID != pid {
		t.Errorf("Find = runsv %d, want %d", q.PID, pid)
	}
	// A closed Proc still watches, by pid and start time.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	select {
	case <-p.Watch(ctx):
		t.Fatal("Watch on a closed Proc fired while runsv runs")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestStartTwiceOneRunsv(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	p := start(t, s.dir)
	q := start(t, s.dir)
	if p.PID != q.PID {
		t.Errorf("second Start = runsv %d, want the first, %d", q.PID, p.PID)
	}
	pid := s.waitUp(t, 0)
	if n := len(leftovers(t, s.dir)); n != 2 { // runsv and service
		t.Errorf("%d processes for the service, want runsv and service", n)
	}

	// A service taken down behind our back (sv down) comes up again.
	if err := control(s.dir, "d"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the service to go down", func() (bool, string) {
		st, err := Status(s.dir)
		return err == nil && !st.Up && !st.WantUp, fmt.Sprintf("%+v %v", st, err)
	})
	if r := start(t, s.dir); r.PID != p.PID {
		t.Errorf("third Start = runsv %d, want %d", r.PID, p.PID)
	}
	s.waitUp(t, pid)
}

func TestConcurrentStartsOneRunsv(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	var wg sync.WaitGroup
	got := make([]int, 4)
	for i := range got {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, err := StartContext(ctx, s.dir)
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = p.PID
			p.Close()
		})
	}
	wg.Wait()
	if got[0] == 0 || slices.ContainsFunc(got, func(pid int) bool { return pid != got[0] }) {
		t.Errorf("concurrent Starts returned runsvs %v, want one", got)
	}
	s.waitUp(t, 0)
	if n := len(leftovers(t, s.dir)); n != 2 {
		t.Errorf("%d processes for the service, want runsv and service", n)
	}
}

func TestWatchRunsvKilledThenStartAgain(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := p.Watch(ctx)
	select {
	case <-exited:
		t.Fatal("Watch fired while runsv runs")
	case <-time.After(50 * time.Millisecond):
	}
	syscall.Kill(p.PID, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("Watch did not fire after runsv was killed")
	}
	if !p.Exited() {
		t.Error("Exited = false after Watch fired")
	}

	// The service outlives runsv; Status says so.
	st, err := Status(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Supervised || !st.Up || st.PID != pid {
		t.Errorf("status %+v, want up (pid %d) but not supervised", st, pid)
	}
	// Start again replaces the orphan: the service never runs twice.
	q := start(t, s.dir)
	if q.PID == p.PID {
		t.Fatalf("Start returned the dead runsv")
	}
	s.waitUp(t, pid)
	if running(pid) {
		t.Errorf("orphaned service %d still runs next to the new one", pid)
	}
}

// Not parallel: it counts goroutines.
func TestWatchLeavesNoGoroutine(t *testing.T) {
	s := newService(t, nil)
	p := start(t, s.dir)
	s.waitUp(t, 0)
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	for range 20 {
		p.Watch(ctx)
	}
	cancel()
	waitFor(t, "watch goroutines to end", func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= before, fmt.Sprintf("%d goroutines, %d before", n, before)
	})
	// And after Stop (which watches too) none of the package's remain.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Stop(ctx, s.dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "goroutines to end after Stop", func() (bool, string) {
		n := runtime.NumGoroutine()
		// Start's reaper of runsv ends with runsv: fewer than before.
		return n < before, fmt.Sprintf("%d goroutines, %d before", n, before)
	})
}

func TestStop(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Stop(ctx, s.dir); err != nil {
		t.Fatal(err)
	}
	if running(p.PID) || running(pid) {
		t.Errorf("after Stop: runsv running %v, service running %v", running(p.PID), running(pid))
	}
	if left := leftovers(t, s.dir); len(left) > 0 {
		t.Errorf("after Stop: processes %v left", left)
	}
	st, err := Status(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Up || st.Supervised || st.WantUp || st.PID != 0 {
		t.Errorf("status after Stop %+v, want down and unsupervised", st)
	}
	if st.LastExit == nil || *st.LastExit != (Exit{Code: -1, Signal: int(syscall.SIGTERM)}) {
		t.Errorf("LastExit = %+v, want ended by SIGTERM", st.LastExit)
	}
	if _, ok, _ := Find(s.dir); ok {
		t.Error("Find after Stop found a runsv")
	}
	if err := Stop(ctx, s.dir); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := Stop(ctx, filepath.Join(s.dir, "missing")); err != nil {
		t.Errorf("Stop of a missing dir: %v", err)
	}
}

func TestStopKillsServiceIgnoringTerm(t *testing.T) {
	t.Parallel()
	s := newService(t, []string{helperNoTerm + "=1"})
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := Stop(ctx, s.dir); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Error("Stop returned before its deadline: the service should have ignored SIGTERM")
	}
	if running(p.PID) || running(pid) {
		t.Errorf("after Stop: runsv running %v, service running %v", running(p.PID), running(pid))
	}
}

func TestStopOrphanedService(t *testing.T) {
	t.Parallel()
	s := newService(t, nil)
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	syscall.Kill(p.PID, syscall.SIGKILL)
	waitFor(t, "runsv to die", func() (bool, string) { return !running(p.PID), "" })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Stop(ctx, s.dir); err != nil {
		t.Fatal(err)
	}
	if running(pid) {
		t.Errorf("service %d left by the dead runsv still runs after Stop", pid)
	}
}

func TestPrepareQuoting(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	pwned := filepath.Join(root, "pwned")
	weird := []string{
		"it's", "$(touch " + pwned + ")", "`touch " + pwned + "`", "a b\tc  d",
		"line1\nline2\n", `"dq" \ back\\slash $HOME ${x} ; & | > ` + pwned, "", "-n", "*", "'''",
	}
	argsFile := filepath.Join(root, "args")
	value := "v'$(touch " + pwned + ")\n x"
	s := newService(t, []string{helperArgsFile + "=" + argsFile, "HELPER_VALUE=" + value}, weird...)
	start(t, s.dir)
	s.waitUp(t, 0)
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Args  []string
		Value string
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Args, weird) {
		t.Errorf("service got args %q, want %q", got.Args, weird)
	}
	if got.Value != value {
		t.Errorf("service got HELPER_VALUE %q, want %q", got.Value, value)
	}
	if _, err := os.Stat(pwned); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an argument was run by the shell: %s exists (%v)", pwned, err)
	}
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if !slices.Contains([]string{"run", "finish", "supervise", "runsv.log", "runsv.pid"}, e.Name()) {
			t.Errorf("unexpected file %s in the service directory", e.Name())
		}
	}
}

func TestPrepareRejects(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ argv, env []string }{
		"empty argv":      {nil, nil},
		"empty argv[0]":   {[]string{""}, nil},
		"NUL in argument": {[]string{"/bin/true", "a\x00b"}, nil},
		"NUL in env":      {[]string{"/bin/true"}, []string{"A=b\x00c"}},
		"env without =":   {[]string{"/bin/true"}, []string{"A"}},
		"bad env name":    {[]string{"/bin/true"}, []string{"A B=c"}},
		"marker in env":   {[]string{"/bin/true"}, []string{MarkerEnv + "=/x"}},
	} {
		dir := filepath.Join(t.TempDir(), "svc")
		if err := Prepare(dir, c.argv, c.env); err == nil {
			t.Errorf("%s: Prepare accepted %q %q", name, c.argv, c.env)
		}
		if _, err := os.Stat(filepath.Join(dir, "run")); err == nil {
			t.Errorf("%s: run written anyway", name)
		}
	}
}

func TestPrepareIdempotent(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "svc")
	inode := func(name string) uint64 {
		t.Helper()
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode %v, want 0755", name, fi.Mode())
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	if err := Prepare(dir, []string{"/bin/sleep", "1000"}, []string{"A=1"}); err != nil {
		t.Fatal(err)
	}
	run, finish := inode("run"), inode("finish")
	if err := Prepare(dir, []string{"/bin/sleep", "1000"}, []string{"A=1"}); err != nil {
		t.Fatal(err)
	}
	if inode("run") != run || inode("finish") != finish {
		t.Error("Prepare with the same arguments rewrote a file")
	}
	if err := Prepare(dir, []string{"/bin/sleep", "2000"}, []string{"A=1"}); err != nil {
		t.Fatal(err)
	}
	if inode("run") == run || inode("finish") != finish {
		t.Error("Prepare with new arguments: want run replaced and finish kept")
	}
	b, _ := os.ReadFile(filepath.Join(dir, "run"))
	if !strings.Contains(string(b), "'2000'") {
		t.Errorf("run script not updated:\n%s", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("service directory holds %d entries, want run and finish (no temp files)", len(ents))
	}
}

func TestStatusNeverStarted(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "svc")
	if _, err := Status(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Status of a missing dir: %v, want ErrNotExist", err)
	}
	if err := Prepare(dir, []string{"/bin/true"}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := Status(dir)
	if err != nil || st.Up || st.Supervised || st.Phase != "down" {
		t.Errorf("Status of a never-started service = %+v, %v; want down", st, err)
	}
}

func TestStopSupervisor(t *testing.T) {
	t.Parallel()
	termFile := filepath.Join(t.TempDir(), "term")
	s := newService(t, []string{helperTermFile + "=" + termFile})
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := StopSupervisor(ctx, s.dir); err != nil {
		t.Fatal(err)
	}
	if running(p.PID) || running(pid) {
		t.Errorf("after StopSupervisor: runsv running %v, service running %v", running(p.PID), running(pid))
	}
	if b, err := os.ReadFile(termFile); string(b) != "TERM" {
		t.Errorf("the service was not stopped by SIGTERM: %q, %v", b, err)
	}
	if st, err := Status(s.dir); err != nil || st.Up || st.Supervised || st.LastExit != nil {
		t.Errorf("status after StopSupervisor %+v (%v), want down, unsupervised, finish not run", st, err)
	}
	if err := StopSupervisor(ctx, s.dir); err != nil {
		t.Errorf("second StopSupervisor: %v", err)
	}
}

// StopRunsv stops the runsv it is given, and a stopped service is woken so
// that it sees its SIGTERM, as runsv would.
func TestStopRunsvStoppedService(t *testing.T) {
	t.Parallel()
	termFile := filepath.Join(t.TempDir(), "term")
	s := newService(t, []string{helperTermFile + "=" + termFile})
	p := start(t, s.dir)
	pid := s.waitUp(t, 0)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the service to be stopped", func() (bool, string) {
		st := mustStat(t, pid)
		return st.state == 'T', string(st.state)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := StopRunsv(ctx, s.dir, p); err != nil {
		t.Fatal(err)
	}
	if running(p.PID) || running(pid) {
		t.Errorf("after StopRunsv: runsv running %v, service running %v", running(p.PID), running(pid))
	}
	if b, err := os.ReadFile(termFile); string(b) != "TERM" {
		t.Errorf("the stopped service did not end by SIGTERM: %q, %v", b, err)
	}
	// A runsv that has exited is looked for as StopSupervisor does.
	if err := StopRunsv(ctx, s.dir, p); err != nil {
		t.Errorf("second StopRunsv: %v", err)
	}
}

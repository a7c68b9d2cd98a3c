package chrony

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// These tests run fake chronyd and chronyc scripts: no root, no chrony.

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// script writes an executable shell script and returns its path.
func script(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeSocket makes the instance's command socket exist (chronyc's fakes
// only need the path to be there).
func fakeSocket(t *testing.T, c Config) {
	t.Helper()
	p := c.Paths()
	if err := os.MkdirAll(p.SocketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.Socket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// gone waits (bounded) until pid is no longer a live process: absent, or a
// zombie nobody reaps.
func gone(t *testing.T, pid int) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// killOnCleanup kills pid when the test ends if it still runs cmd (a
// failing test leaves no process behind).
func killOnCleanup(t *testing.T, pid int, cmd string) {
	t.Cleanup(func() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err == nil && strings.Contains(string(b), cmd) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

func TestTrackingWithoutSocketIsNotRunning(t *testing.T) {
	calls := filepath.Join(t.TempDir(), "calls")
	c := Config{Root: t.TempDir(), Kind: Internal}
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: script(t, "chronyc", "echo ran >>"+calls+"\n")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Tracking(t.Context()); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Tracking: %v, want ErrNotRunning", err)
	}
	if _, err := os.Stat(calls); err == nil {
		t.Error("chronyc ran without a socket to talk to")
	}
}

func TestTrackingReturnsTheLine(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal}
	fakeSocket(t, c)
	args := filepath.Join(t.TempDir(), "args")
	line := "7F000002,127.0.0.2,9,1796123715.871579136,0.000000001,0.000000002,0.000000003,-1.000,0.001,0.002,0.000010000,0.000020000,1.0,Normal"
	chronyc := script(t, "chronyc", `printf "%s\n" "$*" >`+args+"\necho '"+line+"'\n")
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: chronyc}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Tracking(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got != line {
		t.Errorf("Tracking = %q, want %q", got, line)
	}
	b, _ := os.ReadFile(args)
	if want := "-n -h " + c.Paths().Socket + " -c tracking\n"; string(b) != want {
		t.Errorf("chronyc ran with %q, want %q", b, want)
	}
}

func TestTrackingFailureIsACommandError(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal}
	fakeSocket(t, c)
	chronyc := script(t, "chronyc", "echo '506 Cannot talk to daemon' >&2\nexit 1\n")
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: chronyc}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Tracking(t.Context())
	var ce *CommandError
	if !errors.As(err, &ce) || !strings.Contains(ce.Output, "506 Cannot talk to daemon") {
		t.Fatalf("Tracking: %v, want a CommandError with chronyc's words", err)
	}
}

func TestChronycKilledAtItsDeadline(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal}
	fakeSocket(t, c)
	child := filepath.Join(t.TempDir(), "child")
	// A chronyc that never answers: it leaves its socket, as a real one
	// does, and a child in its process group.
	chronyc := script(t, "chronyc", ": >"+c.Paths().SocketDir+"/chronyc.$$.sock\nsleep 1000 &\necho $! >"+child+"\nwait\n")
	d, err := New(c, Options{
		Binaries:       Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: chronyc},
		CommandTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Tracking(t.Context())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Tracking: %v, want DeadlineExceeded", err)
	}
	pid := readPID(t, child)
	killOnCleanup(t, pid, "sleep")
	if !gone(t, pid) {
		t.Errorf("chronyc's child %d outlived the deadline", pid)
	}
	left, _ := filepath.Glob(filepath.Join(c.Paths().SocketDir, "chronyc.*.sock"))
	if len(left) > 0 {
		t.Errorf("killed chronyc's socket left behind: %v", left)
	}
}

func TestSetServersRewritesSourcesAndReloads(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal, Servers: addrs("192.0.2.1")}
	fakeSocket(t, c)
	calls := filepath.Join(t.TempDir(), "calls")
	chronyc := script(t, "chronyc", `printf "%s\n" "$*" >>`+calls+"\necho '200 OK'\n")
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: chronyc}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WriteConfig(); err != nil {
		t.Fatal(err)
	}
	next := addrs("fd00::21", "fd00::22")
	if err := d.SetServers(t.Context(), next); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(c.Paths().Sources)
	want := "# servers of this NTP instance, written by sled-agent\n" +
		"server fd00::21 iburst maxdelay 0.1\n" +
		"server fd00::22 iburst maxdelay 0.1\n"
	if string(got) != want {
		t.Errorf("sources:\n%s\nwant:\n%s", got, want)
	}
	b, _ := os.ReadFile(calls)
	if w := "-n -h " + c.Paths().Socket + " reload sources\n"; string(b) != w {
		t.Errorf("chronyc calls %q, want %q", b, w)
	}
	if s := d.Config().Servers; len(s) != 2 || s[0] != next[0] || s[1] != next[1] {
		t.Errorf("Config().Servers = %v", s)
	}

	// Bad input changes nothing and runs nothing.
	if err := d.SetServers(t.Context(), addrs("fe80::1%eth0")); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("SetServers(zoned): %v, want ErrInvalidConfig", err)
	}
	again, _ := os.ReadFile(c.Paths().Sources)
	b2, _ := os.ReadFile(calls)
	if string(again) != want || string(b2) != string(b) {
		t.Errorf("a refused SetServers changed the file or ran chronyc:\n%s\n%s", again, b2)
	}
}

func TestSetServersWithoutChronydKeepsTheFile(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal}
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: "/nonexistent/chronyc"}})
	if err != nil {
		t.Fatal(err)
	}
	err = d.SetServers(t.Context(), addrs("192.0.2.7"))
	if !errors.Is(err, ErrNotRunning) {
		t.Fatalf("SetServers: %v, want ErrNotRunning", err)
	}
	got, _ := os.ReadFile(c.Paths().Sources)
	if !strings.Contains(string(got), "server 192.0.2.7 ") {
		t.Errorf("sources not written for the next start:\n%s", got)
	}
}

func TestBoundaryKeepsAtLeastOneServer(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Boundary, Servers: addrs("192.0.2.1"), Address: netip.MustParseAddr("fd00::1")}
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: "/nonexistent/chronyc"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetServers(t.Context(), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("SetServers(none): %v, want ErrInvalidConfig", err)
	}
	if s := d.Config().Servers; len(s) != 1 {
		t.Errorf("servers %v after a refused SetServers", s)
	}
}

func TestRunStopsChronydThatIgnoresTERM(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal}
	dir := t.TempDir()
	args, child := filepath.Join(dir, "args"), filepath.Join(dir, "child")
	self := filepath.Join(dir, "self")
	chronyd := script(t, "chronyd", "trap '' TERM\necho $$ >"+self+"\necho \"$@\" >"+args+"\nsleep 1000 &\necho $! >"+child+"\nwait\n")
	d, err := New(c, Options{
		Binaries:    Binaries{Chronyd: chronyd, Chronyc: "/nonexistent/chronyc"},
		Log:         testLog(t),
		StopTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- d.Run(ctx) }()
	pid := readPID(t, child)
	killOnCleanup(t, pid, "sleep")
	killOnCleanup(t, readPID(t, self), "chronyd")
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if !gone(t, pid) {
		t.Errorf("chronyd's child %d outlived Run", pid)
	}
	b, _ := os.ReadFile(args)
	if want := "-d -f " + c.Paths().Conf + " -x\n"; string(b) != want {
		t.Errorf("chronyd ran with %q, want %q", b, want)
	}
	if _, err := os.Stat(c.Paths().Conf); err != nil {
		t.Errorf("Run wrote no config: %v", err)
	}
}

func TestRunReportsChronydExit(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal}
	chronyd := script(t, "chronyd", "echo 'Fatal error : Could not parse server directive' >&2\nexit 1\n")
	d, err := New(c, Options{Binaries: Binaries{Chronyd: chronyd, Chronyc: "/nonexistent/chronyc"}, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = d.Run(ctx)
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "Could not parse server directive") {
		t.Fatalf("Run: %v, want ErrExited with chronyd's last words", err)
	}
}

// TestConcurrentSetServersLeaveTheLastConfig runs SetServers from several
// goroutines (for the race detector) and checks that the sources file is
// the one of the config they left; TestStaleWriteIsRedone forces the
// interleaving that would leave a stale file.
func TestConcurrentSetServersLeaveTheLastConfig(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal}
	fakeSocket(t, c)
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: script(t, "chronyc", "exit 0\n")}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 5 {
				a := netip.AddrFrom4([4]byte{192, 0, 2, byte(g*10 + i + 1)})
				if err := d.SetServers(t.Context(), []netip.Addr{a}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got, _ := os.ReadFile(c.Paths().Sources)
	if want := renderSources(d.Config()); string(got) != string(want) {
		t.Errorf("sources file:\n%s\nbut the config's servers are %v", got, d.Config().Servers)
	}
}

// TestStaleWriteIsRedone: a SetServers that lands while an earlier write
// is in flight makes that writer write again, so the later servers win
// even when the earlier rename comes last.
func TestStaleWriteIsRedone(t *testing.T) {
	c := Config{Root: t.TempDir(), Kind: Internal, Servers: addrs("192.0.2.1")}
	d, err := New(c, Options{Binaries: Binaries{Chronyd: "/nonexistent/chronyd", Chronyc: "/nonexistent/chronyc"}})
	if err != nil {
		t.Fatal(err)
	}
	later := addrs("192.0.2.2")
	calls := 0
	err = d.writeLatest(func(c Config) error {
		calls++
		if calls == 1 {
			// Another SetServers, its file written first; ours (stale)
			// is renamed over it.
			d.mu.Lock()
			d.cfg.Servers, d.gen = later, d.gen+1
			d.mu.Unlock()
			if err := writeSources(c.Paths().Sources, renderSources(d.Config())); err != nil {
				return err
			}
		}
		return writeSources(c.Paths().Sources, renderSources(c))
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(c.Paths().Sources)
	if !strings.Contains(string(got), "server 192.0.2.2 ") || strings.Contains(string(got), "192.0.2.1") {
		t.Errorf("sources file after the race:\n%s\nwant the later server 192.0.2.2 only", got)
	}
}

package linux

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// Each check runs against real listeners and processes on this machine:
// loopback only, and commands started as children of the test.

// testTimeout bounds one check: a hang detector, not a claim about speed.
const testTimeout = 5 * time.Second

// freePort returns a loopback address nothing listens on (just now).
func freePort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return addr
}

func listen(t *testing.T, addr netip.AddrPort) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// testProbe builds rd's check of a service at addr; commands start as the
// test's children, with the placeholders of a crucible zone rooted at root.
func testProbe(t *testing.T, rd Ready, addr netip.AddrPort, root string, start func(*exec.Cmd) error) probe {
	t.Helper()
	z := sledconfigtest.Crucible(1)
	if start == nil {
		start = (*exec.Cmd).Start
	}
	p, err := rd.probe(addr, expander(zone.SpecFor(&z), addr, "/nonexistent/agent", root, "sled-agent"), start)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkOnce runs p once under the whole timeout and returns its answer and
// what a waiting zone would say.
func checkOnce(p probe, timeout time.Duration) (string, error) {
	err := p.run(context.Background(), nil, timeout)
	return p.waiting(err), err
}

func TestTCPReadyRefusedThenAccepting(t *testing.T) {
	addr := freePort(t)
	p := testProbe(t, Ready{}, addr, t.TempDir(), nil) // the zero Ready is TCP
	said, err := checkOnce(p, testTimeout)
	if want := "waiting for tcp " + addr.String() + ": connection refused"; err == nil || said != want {
		t.Fatalf("nothing listening: %v, says %q, want %q", err, said, want)
	}
	listen(t, addr) // accepts from its backlog, answers nothing
	if said, err := checkOnce(p, testTimeout); err != nil {
		t.Fatalf("listening: %v (%s)", err, said)
	}
	if p2 := testProbe(t, Ready{TCP: &TCPReady{}}, addr, t.TempDir(), nil); p2.what != p.what {
		t.Errorf("explicit tcp check is %q, default %q", p2.what, p.what)
	}
}

// A network check that gets no answer in time says so, and keeps the
// deadline in its error for the poller, which then waits longer.
func TestTCPReadyNoAnswerInTime(t *testing.T) {
	p := testProbe(t, Ready{}, freePort(t), t.TempDir(), nil)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := p.check(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || err.Error() != "no answer in time" {
		t.Errorf("past deadline: %v", err)
	}
}

func TestHTTPReadyNotFoundThenOK(t *testing.T) {
	addr := freePort(t)
	ln := listen(t, addr)
	var ok atomic.Bool
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || !ok.Load() {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	p := testProbe(t, Ready{HTTP: &HTTPReady{Path: "/healthz", Status: http.StatusNoContent}}, addr, t.TempDir(), nil)
	said, err := checkOnce(p, testTimeout)
	if want := "waiting for http GET " + addr.String() + "/healthz: status 404, want 204"; err == nil || said != want {
		t.Fatalf("404: %v, says %q, want %q", err, said, want)
	}
	ok.Store(true)
	if said, err := checkOnce(p, testTimeout); err != nil {
		t.Fatalf("204: %v (%s)", err, said)
	}
	// Default path / and status 200: this server answers / with 404.
	d := testProbe(t, Ready{HTTP: &HTTPReady{}}, addr, t.TempDir(), nil)
	if said, err := checkOnce(d, testTimeout); err == nil || !strings.HasSuffix(said, addr.String()+"/: status 404, want 200") {
		t.Errorf("defaults: %v, says %q", err, said)
	}
	srv.Close()
	if said, err := checkOnce(p, testTimeout); err == nil || !strings.HasSuffix(said, ": connection refused") {
		t.Errorf("server gone: %v, says %q", err, said)
	}
}

// The agent's own images keep their check: GET /health answering the zone
// service's health report. Another HTTP server there is not ready.
func TestZoneServiceReady(t *testing.T) {
	addr := freePort(t)
	p := testProbe(t, DefaultImage.Ready, addr, t.TempDir(), nil)
	if said, err := checkOnce(p, testTimeout); err == nil || !strings.HasSuffix(said, "/health: connection refused") {
		t.Fatalf("nothing listening: %v, says %q", err, said)
	}
	ln := listen(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- zoneservice.ServeListener(ctx, ln, zoneservice.Info{Name: "z", ID: "i", Kind: "crucible"})
	}()
	t.Cleanup(func() { cancel(); <-done })
	if said, err := checkOnce(p, testTimeout); err != nil {
		t.Fatalf("zone service: %v (%s)", err, said)
	}
}

func TestCommandReadyExit1Then0(t *testing.T) {
	root := t.TempDir()
	// /usr/bin/test, from coreutils, with the image's placeholders.
	p := testProbe(t, Ready{Command: []string{"/usr/bin/test", "-e", "{root}/ready"}}, freePort(t), root, nil)
	said, err := checkOnce(p, testTimeout)
	if want := "waiting for command /usr/bin/test -e " + root + "/ready: exit status 1"; err == nil || said != want {
		t.Fatalf("not ready: %v, says %q, want %q", err, said, want)
	}
	if err := os.WriteFile(filepath.Join(root, "ready"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if said, err := checkOnce(p, testTimeout); err != nil {
		t.Fatalf("ready: %v (%s)", err, said)
	}
	// What the command says is in the answer.
	p = testProbe(t, Ready{Command: []string{"/bin/sh", "-c", "echo not yet >&2; exit 2"}}, freePort(t), root, nil)
	if said, err := checkOnce(p, testTimeout); err == nil || !strings.HasSuffix(said, `: exit status 2: "not yet"`) {
		t.Errorf("failing command: %v, says %q", err, said)
	}
}

// A command that hangs is killed at its deadline, with everything it
// started in its process group.
func TestCommandReadyThatHangsIsKilled(t *testing.T) {
	var pid int
	start := func(cmd *exec.Cmd) error {
		err := cmd.Start()
		if err == nil {
			pid = cmd.Process.Pid
		}
		return err
	}
	p := testProbe(t, Ready{Command: []string{"/bin/sh", "-c", "sleep 600 & sleep 600"}}, freePort(t), t.TempDir(), start)
	said, err := checkOnce(p, 200*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasSuffix(said, ": killed at its deadline") {
		t.Fatalf("hanging command: %v, says %q", err, said)
	}
	if pid == 0 {
		t.Fatal("the command never started")
	}
	t.Cleanup(func() {
		if len(groupMembers(t, pid)) > 0 {
			syscall.Kill(-pid, syscall.SIGKILL) // what a failed check left
		}
	})
	// SIGKILL is delivered at once, but dying takes a moment: wait for it.
	deadline := time.Now().Add(testTimeout)
	for {
		left := groupMembers(t, pid)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the command's group %d still run: %v", pid, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupMembers returns the live (not zombie) processes of process group
// pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		// After the command name: state, ppid, pgrp, ...
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			out = append(out, pid)
		}
	}
	return out
}

// A readiness command is run, not searched for: its first word must be an
// absolute path once the placeholders are filled in.
func TestCommandReadyNeedsAnAbsolutePath(t *testing.T) {
	z := sledconfigtest.Crucible(1)
	addr := freePort(t)
	_, err := Ready{Command: []string{"{kind}", "x"}}.probe(addr, expander(zone.SpecFor(&z), addr, "/a", "/r", "sled-agent"), (*exec.Cmd).Start)
	if err == nil || !strings.Contains(err.Error(), "absolute path") {
		t.Fatalf("probe = %v, want an error about the path", err)
	}
}

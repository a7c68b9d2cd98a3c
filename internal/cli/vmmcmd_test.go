package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
)

// vmmAgent runs an agent whose guests' images may lie in a directory of
// the test, and returns it with an image there.
func vmmAgent(t *testing.T) (*testAgent, string) {
	t.Helper()
	dir := t.TempDir()
	a := startAgentWith(t, agent.Config{VMMImageDir: dir})
	image := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return a, image
}

// waitVMM waits until vmm show -o json's VMM satisfies ok.
func waitVMM(t *testing.T, url, id string, ok func(vmm.Info) bool) vmm.Info {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		var v vmm.Info
		r := sledAt(t, url, "-o", "json", "vmm", "show", id).ok(t)
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("vmm show -o json: %v\n%s", err, r.stdout)
		}
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("VMM %s after %s: %+v", id, waitDeadline, v)
		}
		time.Sleep(waitInterval)
	}
}

// waitHistory waits until vmm console --history shows want.
func waitHistory(t *testing.T, url, id, want string) string {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		r := sledAt(t, url, "vmm", "console", "--history", id)
		if r.code == 0 && strings.Contains(r.stdout, want) {
			return r.stdout
		}
		if time.Now().After(deadline) {
			t.Fatalf("console --history never showed %q: exit %d, stderr %q, stdout:\n%s", want, r.code, r.stderr, r.stdout)
		}
		time.Sleep(waitInterval)
	}
}

// A VMM's life from the command line: create, list, show, start, its
// console's history, stop, delete.
func TestVMMCommands(t *testing.T) {
	a, image := vmmAgent(t)
	seed := writeFile(t, "seed.img", []byte("cidata seed"))
	id := strings.TrimSpace(sledAt(t, a.url, "vmm", "create", "--image", image, "--cpus", "2", "--memory", "512", "--cloud-init", seed).ok(t).stdout)
	if _, err := uuid.Parse(id); err != nil {
		t.Fatalf("vmm create printed %q, not a VMM id", id)
	}

	list := sledAt(t, a.url, "vmm", "list").ok(t).stdout
	if !strings.HasPrefix(list, "VMM ") || !strings.Contains(list, id) {
		t.Errorf("vmm list does not show %s:\n%s", id, list)
	}
	v := waitVMM(t, a.url, id, func(v vmm.Info) bool { return v.Status == vmm.StatusKnown })
	var reg struct {
		PropolisAddr string `json:"propolis_addr"`
		Spec         struct {
			Board struct {
				CPUs   int `json:"cpus"`
				Memory int `json:"memory_mb"`
			} `json:"board"`
			Components map[string]struct {
				Type      string         `json:"type"`
				Component map[string]any `json:"component"`
			} `json:"components"`
		} `json:"vmm_spec"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(v.Registration, &reg); err != nil {
		t.Fatal(err)
	}
	if reg.Spec.Board.CPUs != 2 || reg.Spec.Board.Memory != 512 {
		t.Errorf("board %+v, want 2 CPUs and 512 MiB", reg.Spec.Board)
	}
	if c := reg.Spec.Components["boot-disk-backend"]; c.Type != "file_storage_backend" || c.Component["path"] != image {
		t.Errorf("boot disk backend %+v, want the image's file", c)
	}
	if c := reg.Spec.Components["cloud-init-backend"]; c.Type != "blob_storage_backend" {
		t.Errorf("cloud-init backend %+v, want a blob", c)
	}
	if _, err := uuid.Parse(reg.Metadata["project_id"]); err != nil {
		t.Errorf("metadata %v: no project_id", reg.Metadata)
	}
	if !strings.HasPrefix(v.PropolisAddr, "[fd00:1122:3344:103:") || !strings.HasSuffix(v.PropolisAddr, "]:12400") {
		t.Errorf("propolis_addr %s, want one of the sled's /64 on port 12400", v.PropolisAddr)
	}
	show := sledAt(t, a.url, "vmm", "show", id).ok(t).stdout
	for _, want := range []string{"vmm " + id, "propolis " + v.PropolisAddr, "history:"} {
		if !strings.Contains(strings.Join(strings.Fields(show), " "), want) {
			t.Errorf("vmm show does not say %q:\n%s", want, show)
		}
	}

	if out := sledAt(t, a.url, "vmm", "start", id).ok(t).stdout; !strings.Contains(out, "VMM "+id+": asked to run; now ") {
		t.Errorf("vmm start said %q", out)
	}
	waitVMM(t, a.url, id, func(v vmm.Info) bool { return v.State.State == "running" })
	hist := waitHistory(t, a.url, id, simguest.ReadyPrefix)
	if !strings.Contains(hist, "smpboot: Allowing 2 CPUs") {
		t.Errorf("console history is not the guest's boot:\n%s", hist)
	}

	sledAt(t, a.url, "vmm", "stop", id).ok(t)
	waitVMM(t, a.url, id, func(v vmm.Info) bool { return v.State.State == "stopped" || v.State.State == "destroyed" })
	if out := sledAt(t, a.url, "vmm", "delete", id).ok(t).stdout; !strings.Contains(out, "VMM "+id+" unregistered") {
		t.Errorf("vmm delete said %q", out)
	}
	if list := sledAt(t, a.url, "vmm", "list").ok(t).stdout; strings.Contains(list, id) {
		t.Errorf("vmm list after delete still shows %s:\n%s", id, list)
	}
	sledAt(t, a.url, "vmm", "show", id).failed(t, "no VMM "+id)
}

// Bad input exits 1 with one line naming the problem, and registers
// nothing.
func TestVMMCommandsBadInput(t *testing.T) {
	a, image := vmmAgent(t)
	sledAt(t, a.url, "vmm", "create").failed(t, "--image is required")
	sledAt(t, a.url, "vmm", "create", "--image", filepath.Join(filepath.Dir(image), "missing.img")).failed(t, "400", "missing.img")
	sledAt(t, a.url, "vmm", "create", "--image", "/etc/passwd").failed(t, "400", "/etc/passwd")
	sledAt(t, a.url, "vmm", "create", "--image", image, "--id", "nope").failed(t, `--id "nope" is not a UUID`)
	sledAt(t, a.url, "vmm", "create", "--image", image, "--addr", "[fd00:1122:3344:104::9]:12400").failed(t, "outside the sled's subnet")
	sledAt(t, a.url, "vmm", "create", "--image", image, "--addr", "[fd00:1122:3344:103::2]:12400").failed(t, "first addresses")
	sledAt(t, a.url, "vmm", "create", "--image", image, "--cloud-init", "/nonexistent/seed").failed(t, "--cloud-init")
	sledAt(t, a.url, "vmm", "show", "nope").failed(t, `"nope" is not a UUID`)
	sledAt(t, a.url, "vmm", "start", "nope").failed(t, "400", `"nope" is not a UUID`)
	sledAt(t, a.url, "vmm", "delete", "nope").failed(t, "400", `"nope" is not a UUID`)
	sledAt(t, a.url, "vmm", "delete", uuid.NewString()).failed(t, "404")
	sledAt(t, a.url, "vmm", "console", "--history", "nope").failed(t, `"nope" is not a UUID`)
	if list := sledAt(t, a.url, "-o", "json", "vmm", "list").ok(t).stdout; strings.TrimSpace(list) != "[]" {
		t.Errorf("bad input registered VMMs: %s", list)
	}
}

// markerWriter is a buffer that says when it holds a marker.
type markerWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker string
	seen   chan struct{}
}

func (w *markerWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.seen != nil && strings.Contains(w.buf.String(), w.marker) {
		close(w.seen)
		w.seen = nil
	}
	return len(p), nil
}

func (w *markerWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// The interactive console: what is typed reaches the guest (which echoes
// it), and Ctrl-] leaves.
func TestVMMConsoleInteractive(t *testing.T) {
	a, image := vmmAgent(t)
	id := strings.TrimSpace(sledAt(t, a.url, "vmm", "create", "--image", image).ok(t).stdout)
	waitVMM(t, a.url, id, func(v vmm.Info) bool { return v.Status == vmm.StatusKnown })
	sledAt(t, a.url, "vmm", "start", id).ok(t)
	waitHistory(t, a.url, id, simguest.ReadyPrefix)

	inR, inW := io.Pipe()
	defer inR.Close()
	out := &markerWriter{marker: simguest.ReadyPrefix, seen: make(chan struct{})}
	readySeen := out.seen
	var stderr bytes.Buffer
	code := make(chan int, 1)
	go func() { code <- runIn([]string{"--url", a.url, "vmm", "console", id}, inR, out, &stderr) }()
	waitFor := func(seen chan struct{}, what string) {
		t.Helper()
		select {
		case <-seen:
		case c := <-code:
			t.Fatalf("console exited %d before %s; stderr %q, output:\n%s", c, what, stderr.String(), out.String())
		case <-time.After(waitDeadline):
			t.Fatalf("console did not show %s in %s; output:\n%s", what, waitDeadline, out.String())
		}
	}
	waitFor(readySeen, "the guest's READY line")

	const echo = "hello-from-the-operator"
	out.mu.Lock()
	out.marker, out.seen = echo, make(chan struct{})
	echoSeen := out.seen
	out.mu.Unlock()
	if _, err := inW.Write([]byte(echo + "\r")); err != nil {
		t.Fatal(err)
	}
	waitFor(echoSeen, "the echo of its input")

	if _, err := inW.Write([]byte{escapeByte}); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 0 || stderr.Len() != 0 {
			t.Errorf("console left with exit %d, stderr %q", c, stderr.String())
		}
	case <-time.After(waitDeadline):
		t.Fatalf("console did not leave on Ctrl-] within %s", waitDeadline)
	}
}

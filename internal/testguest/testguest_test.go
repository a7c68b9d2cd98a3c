package testguest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const bootDeadline = 120 * time.Second

// TestImageBootsThroughOVMF boots copies of the image with plain QEMU: once
// with a NIC (READY with its MAC, echo, a reboot, the power button), once
// without (NOMAC, then a panic that QEMU's pvpanic reports). The two boots
// run in parallel.
func TestImageBootsThroughOVMF(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("booting the test guest needs root")
	}
	img := Image(t)

	t.Run("nic", func(t *testing.T) {
		t.Parallel()
		mac := randomMAC()
		g := boot(t, img, mac)
		start := time.Now()
		g.waitReady(t, mac)
		t.Logf("READY %v after QEMU started", time.Since(start).Round(100*time.Millisecond))

		word := "word-" + mac[9:11] + mac[12:14] + mac[15:17]
		g.send(t, CmdEcho+word)
		g.waitLine(t, 10*time.Second, "the echo of "+word, func(l string) bool { return strings.TrimSpace(l) == word })
		g.send(t, "no-such-command")
		g.waitLine(t, 10*time.Second, "the unknown command's answer", func(l string) bool {
			return strings.Contains(l, UnknownPrefix+"no-such-command")
		})

		g.send(t, CmdReboot)
		g.waitEvent(t, 30*time.Second, "RESET")
		g.waitReady(t, mac)

		g.execute(t, "system_powerdown")
		start = time.Now()
		ev := g.waitEvent(t, 30*time.Second, "SHUTDOWN")
		if !strings.Contains(string(ev.Data), `"guest-shutdown"`) {
			t.Errorf("SHUTDOWN %s, want reason guest-shutdown", ev.Data)
		}
		g.waitExit(t, 30*time.Second-time.Since(start))
		t.Logf("QEMU exited %v after system_powerdown", time.Since(start).Round(100*time.Millisecond))
	})

	t.Run("panic", func(t *testing.T) {
		t.Parallel()
		g := boot(t, img, "")
		g.waitLine(t, bootDeadline, "the NOMAC line", func(l string) bool { return strings.Contains(l, NoMAC) })
		g.waitReady(t, "none")
		g.send(t, CmdPanic)
		g.waitEvent(t, 30*time.Second, "GUEST_PANICKED")
		// panic=0: the kernel halts after its panic; it does not reboot.
		if ev, ok := g.nextEvent(2 * time.Second); ok {
			t.Errorf("after GUEST_PANICKED: event %s %s, want none", ev.Event, ev.Data)
		}
	})
}

// guest is one QEMU process booting a copy of the image.
type guest struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	exited chan struct{} // closed when cmd.Wait returns

	serial net.Conn
	lines  chan string // serial console lines, \r removed
	qmp    net.Conn
	events chan qmpMessage
	// returns gets the answer to each command: "return" or "error".
	returns chan qmpMessage

	mu  sync.Mutex
	log strings.Builder // all serial output, for failures
}

type qmpMessage struct {
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

// boot starts QEMU on copies of img and the OVMF vars, with a virtio NIC of
// that MAC (none when mac is empty) whose netdev goes nowhere. QEMU connects
// its serial port and QMP to sockets the test listens on; it is killed
// when the test ends.
func boot(t *testing.T, img, mac string) *guest {
	t.Helper()
	code, vars, err := OVMF()
	if err != nil {
		t.Fatal(err)
	}
	disk := TempCopy(t, img)
	vars = TempCopy(t, vars)
	dir := t.TempDir()
	serialL := listen(t, filepath.Join(dir, "serial.sock"))
	qmpL := listen(t, filepath.Join(dir, "qmp.sock"))

	args := []string{
		"-machine", "q35", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + code,
		"-drive", "if=pflash,format=raw,unit=1,file=" + vars,
		"-drive", "if=none,id=disk0,format=raw,file=" + disk,
		"-device", "virtio-blk-pci,drive=disk0,bootindex=0",
		"-device", "pvpanic",
		"-action", "panic=none",
		"-chardev", "socket,id=serial0,path=" + serialL.Addr().String(),
		"-serial", "chardev:serial0",
		"-chardev", "socket,id=qmp0,path=" + qmpL.Addr().String(),
		"-mon", "chardev=qmp0,mode=control",
	}
	if mac != "" {
		args = append(args,
			"-netdev", "hubport,id=net0,hubid=0",
			"-device", "virtio-net-pci,netdev=net0,romfile=,mac="+mac)
	}
	g := &guest{
		lines:   make(chan string, 4096),
		events:  make(chan qmpMessage, 64),
		returns: make(chan qmpMessage, 1),
		exited:  make(chan struct{}),
	}
	g.cmd = exec.Command(QEMU, args...)
	g.cmd.Stderr = &g.stderr
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		g.cmd.Wait()
		close(g.exited)
	}()
	t.Cleanup(func() {
		g.cmd.Process.Kill()
		<-g.exited
		if g.serial != nil {
			g.serial.Close()
		}
		if g.qmp != nil {
			g.qmp.Close()
		}
		if t.Failed() {
			g.mu.Lock()
			t.Logf("serial console:\n%s", g.log.String())
			g.mu.Unlock()
			t.Logf("QEMU's stderr:\n%s", g.stderr.Bytes())
		}
	})

	g.serial = accept(t, g, serialL)
	g.qmp = accept(t, g, qmpL)
	go g.readSerial()
	qr := bufio.NewReader(g.qmp)
	if _, err := qr.ReadBytes('\n'); err != nil { // the greeting
		t.Fatalf("QMP greeting: %v", err)
	}
	go g.readQMP(qr)
	g.execute(t, "qmp_capabilities")
	return g
}

func listen(t *testing.T, path string) *net.UnixListener {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// accept takes QEMU's connection to l, failing if QEMU exits first.
func accept(t *testing.T, g *guest, l *net.UnixListener) net.Conn {
	t.Helper()
	l.SetDeadline(time.Now().Add(30 * time.Second))
	c, err := l.Accept()
	if err != nil {
		select {
		case <-g.exited:
			t.Fatalf("QEMU exited: %v\n%s", g.cmd.ProcessState, g.stderr.Bytes())
		default:
		}
		t.Fatalf("QEMU did not connect to %s: %v", l.Addr(), err)
	}
	return c
}

func (g *guest) readSerial() {
	defer close(g.lines)
	r := bufio.NewReader(g.serial)
	for {
		line, err := r.ReadString('\n')
		g.mu.Lock()
		g.log.WriteString(line)
		g.mu.Unlock()
		if line != "" {
			select {
			case g.lines <- strings.TrimRight(line, "\r\n"):
			default: // nobody reads that far behind: the log keeps it
			}
		}
		if err != nil {
			return
		}
	}
}

func (g *guest) readQMP(r *bufio.Reader) {
	defer close(g.events)
	for {
		b, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var m qmpMessage
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		if m.Event != "" {
			g.events <- m
		} else {
			g.returns <- m
		}
	}
}

// execute runs a QMP command without arguments and waits for its answer.
func (g *guest) execute(t *testing.T, command string) {
	t.Helper()
	if _, err := fmt.Fprintf(g.qmp, `{"execute": %q}`+"\n", command); err != nil {
		t.Fatalf("QMP %s: %v", command, err)
	}
	select {
	case m := <-g.returns:
		if m.Error != nil {
			t.Fatalf("QMP %s: %s: %s", command, m.Error.Class, m.Error.Desc)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("QMP %s: no answer in 10s", command)
	}
}

// send types a line on the guest's serial console.
func (g *guest) send(t *testing.T, line string) {
	t.Helper()
	if _, err := g.serial.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("serial: %v", err)
	}
}

// waitLine waits for a serial line that match accepts, skipping others.
func (g *guest) waitLine(t *testing.T, d time.Duration, what string, match func(string) bool) string {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case l, ok := <-g.lines:
			if !ok {
				t.Fatalf("waiting for %s: the serial console closed (QEMU exited?)", what)
			}
			if match(l) {
				return l
			}
		case <-timeout:
			t.Fatalf("no %s on the serial console in %v", what, d)
		}
	}
}

// waitReady waits for the READY line and checks its MAC.
func (g *guest) waitReady(t *testing.T, mac string) {
	t.Helper()
	l := g.waitLine(t, bootDeadline, "READY line", func(l string) bool { return strings.Contains(l, ReadyPrefix) })
	if got := strings.TrimSpace(l[strings.Index(l, ReadyPrefix)+len(ReadyPrefix):]); got != mac {
		t.Fatalf("READY line %q: mac %q, want %q", l, got, mac)
	}
}

// nextEvent returns the next QMP event within d.
func (g *guest) nextEvent(d time.Duration) (qmpMessage, bool) {
	select {
	case m, ok := <-g.events:
		return m, ok
	case <-time.After(d):
		return qmpMessage{}, false
	}
}

// waitEvent waits for a QMP event of that name, skipping others.
func (g *guest) waitEvent(t *testing.T, d time.Duration, name string) qmpMessage {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		m, ok := g.nextEvent(time.Until(deadline))
		if !ok {
			t.Fatalf("no QMP event %s in %v", name, d)
		}
		if m.Event == name {
			return m
		}
	}
}

// waitExit waits for QEMU to exit by itself, with status 0.
func (g *guest) waitExit(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-g.exited:
		if !g.cmd.ProcessState.Success() {
			t.Fatalf("QEMU: %v", g.cmd.ProcessState)
		}
	case <-time.After(d):
		t.Fatalf("QEMU still running %v later", d)
	}
}

// randomMAC is a locally administered unicast MAC, lowercase with colons.
func randomMAC() string {
	b := make([]byte, 6)
	rand.Read(b)
	b[0] = b[0]&^1 | 2
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

// The cache keeps the image in use and those of other versions used
// lately; it removes the others, with their stamps, and the unversioned
// image of older caches.
func TestPruneKeepsWhatIsUsed(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	old := now.Add(-pruneAfter - time.Hour)
	file := func(name string, at time.Time) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keep := file("test-guest-aaaa.raw", old)
	file("test-guest-aaaa.raw.stamp", old) // in use: kept however old
	file("test-guest-bbbb.raw", old)
	file("test-guest-bbbb.raw.stamp", now.Add(-time.Hour))
	stale := file("test-guest-cccc.raw", now)
	file("test-guest-cccc.raw.stamp", old)
	unstamped := file("test-guest-dddd.raw", now)
	legacy := file("test-guest.raw", old)
	file("test-guest.raw.stamp", old)
	if err := os.Mkdir(legacy+".debs", 0o755); err != nil {
		t.Fatal(err)
	}
	file("lock", old)
	got := prune(dir, keep, now)
	slices.Sort(got)
	want := []string{stale, unstamped, legacy}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("removed %v, want %v", got, want)
	}
	left, _ := os.ReadDir(dir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	wantLeft := []string{"lock", "test-guest-aaaa.raw", "test-guest-aaaa.raw.stamp", "test-guest-bbbb.raw", "test-guest-bbbb.raw.stamp"}
	if !slices.Equal(names, wantLeft) {
		t.Errorf("left %v, want %v", names, wantLeft)
	}
}

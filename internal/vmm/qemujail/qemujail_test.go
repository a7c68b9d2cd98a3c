package qemujail

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	RunIfAsked()
	os.Exit(m.Run())
}

// Wrap makes the command start this program as the shut-in step, in new
// namespaces, with QEMU's program, arguments and descriptors kept and
// the descriptors counted.
func TestWrap(t *testing.T) {
	cmd := exec.Command("/usr/bin/qemu-system-x86_64", "-name", "vm", "-S")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.ExtraFiles = []*os.File{os.Stdin, os.Stdout}
	if err := Wrap(cmd, Config{UID: 70000, GID: 70000, Devices: []string{"/dev/kvm"}}); err != nil {
		t.Fatal(err)
	}
	if cmd.Path != "/proc/self/exe" {
		t.Errorf("Path %q", cmd.Path)
	}
	if len(cmd.Args) != 7 || cmd.Args[0] != Marker || !slices.Equal(cmd.Args[2:], []string{"/usr/bin/qemu-system-x86_64", "/usr/bin/qemu-system-x86_64", "-name", "vm", "-S"}) {
		t.Errorf("Args %q", cmd.Args)
	}
	var c Config
	if err := json.Unmarshal([]byte(cmd.Args[1]), &c); err != nil {
		t.Fatal(err)
	}
	if c.UID != 70000 || c.GID != 70000 || c.FDs != 2 || !slices.Equal(c.Show, DefaultShow) || !slices.Equal(c.Devices, []string{"/dev/kvm"}) {
		t.Errorf("config %+v", c)
	}
	a := cmd.SysProcAttr
	if !a.Setpgid || a.Cloneflags&(unix.CLONE_NEWNS|unix.CLONE_NEWNET|unix.CLONE_NEWIPC) != unix.CLONE_NEWNS|unix.CLONE_NEWNET|unix.CLONE_NEWIPC || a.Credential != nil {
		t.Errorf("SysProcAttr %+v", a)
	}
}

func TestWrapRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		cmd  func() *exec.Cmd
		c    Config
		want string
	}{
		{"root", func() *exec.Cmd { return exec.Command("/bin/true") }, Config{UID: 0, GID: 5}, "root"},
		{"root's group", func() *exec.Cmd { return exec.Command("/bin/true") }, Config{UID: 5000, GID: 0}, "root"},
		{"relative", func() *exec.Cmd { return &exec.Cmd{Path: "qemu", Args: []string{"qemu"}} }, Config{UID: 5000, GID: 5000}, "absolute"},
		{"credential", func() *exec.Cmd {
			c := exec.Command("/bin/true")
			c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 5000}}
			return c
		}, Config{UID: 5000, GID: 5000}, "credential"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := tt.cmd()
			err := Wrap(cmd, tt.c)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Wrap: %v, want %v saying %q", err, ErrConfig, tt.want)
			}
		})
	}
}

// The step refuses to run anywhere but in namespaces of its own: started
// without them (a command not made by Wrap), it touches no mount, runs
// nothing, and says why.
func TestStepRefusesHostNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the step runs as root")
	}
	conf, _ := json.Marshal(Config{UID: 70000, GID: 70000})
	cmd := &exec.Cmd{Path: os.Args[0], Args: []string{Marker, string(conf), "/bin/true", "true"}}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 127 || !strings.Contains(string(out), "qemujail: QEMU not started: not in a mnt namespace of its own") {
		t.Errorf("step: %v: %s", err, out)
	}
}

// Shut in, a program sees only what it is shown: a test of the step on
// its own (the VMM's whole start is qemuvm's TestQEMUReachesNothing).
func TestStepShutsIn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes namespaces and mounts")
	}
	// The program by a link, as QEMU's may be (Debian's alternatives): it
	// is shown at the link's path.
	dir, err := os.MkdirTemp("", "qemujail-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ls := filepath.Join(dir, "ls")
	if err := os.Symlink("/usr/bin/ls", ls); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(ls, "-1a", "/", "/dev", "/proc", "/etc/passwd", "/usr/bin")
	if err := Wrap(cmd, Config{UID: 70001, GID: 70001}); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("ls: %v, want exit 2 (some paths not found)", err)
	}
	s := string(out)
	for _, want := range []string{"cannot access '/proc'", "cannot access '/etc/passwd'", "cannot access '/usr/bin'", "\nnull\n", "\nurandom\n", "\nshm\n", "\nusr\n", "\ntmp\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, not := range []string{"\nkvm\n", "\nhome\n", "\nroot\n", "\nvar\n", "\nsys\n"} {
		if strings.Contains(s, not) {
			t.Errorf("output has %q", not)
		}
	}
}

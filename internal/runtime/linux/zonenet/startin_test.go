package zonenet

import (
	"errors"
	"os"
	"os/exec"
	"strconv"

	"github.com/vishvananda/netlink"
	"testing"
)

// A process started with StartIn is born in the namespace, and so are its
// children; the agent's own threads stay where they were.
func TestStartIn(t *testing.T) {
	e := newEnv(t)
	c := e.config(false)
	mustEnsure(t, c)

	// sh prints the namespace of a child it forks, then waits to be read.
	cmd := exec.Command("/bin/sh", "-c", "readlink /proc/self/ns/net; exec sleep 30")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := StartIn(c.Netns, cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if in, err := ProcessIn(cmd.Process.Pid, c.Netns); err != nil || !in {
		t.Fatalf("ProcessIn = %v, %v; want the process in %s", in, err, c.Netns)
	}
	b := make([]byte, 64)
	n, _ := out.Read(b)
	want, err := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b[:n]); got != want+"\n" {
		t.Errorf("the child's namespace is %q, want %q", got, want)
	}
	if in, err := ProcessIn(os.Getpid(), c.Netns); err != nil || in {
		t.Errorf("the agent itself moved into the zone: %v, %v", in, err)
	}
}

func TestStartInMissingNamespace(t *testing.T) {
	e := newEnv(t)
	cmd := exec.Command("/bin/true")
	err := StartIn(e.prefix+"oxz_none", cmd)
	if !errors.Is(err, ErrNoNetns) {
		t.Fatalf("StartIn = %v, want ErrNoNetns", err)
	}
	if cmd.Process != nil {
		t.Errorf("a process was started: %d", cmd.Process.Pid)
	}
	if err := StartIn("../escape", exec.Command("/bin/true")); !errors.Is(err, ErrInvalid) {
		t.Errorf("StartIn with a bad name = %v, want ErrInvalid", err)
	}
}

// The test machine's sysfs shows its own namespace; and what hostLinkMark
// reads there is what netlink says.
func TestHostLinkMark(t *testing.T) {
	e := newEnv(t)
	c := e.config(false)
	mustEnsure(t, c)
	h, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !sysfsShowsUs(h) {
		t.Fatal("sysfs does not show the test's own namespace")
	}
	up, np := pairs(c.Tag, c.ZoneID)
	l := hostLink(t, up.host)
	index, alias, err := hostLinkMark(h, up.host)
	if err != nil || index != l.Attrs().Index || alias != up.alias {
		t.Errorf("hostLinkMark(%s) = %d, %q, %v; want %d, %q", up.host, index, alias, err, l.Attrs().Index, up.alias)
	}
	if index, _, err := hostLinkMark(h, np.host); err != nil || index != 0 {
		t.Errorf("hostLinkMark of a missing link = %d, %v", index, err)
	}
	if _, _, err := hostLinkMark(h, "../lo"); !errors.Is(err, ErrInvalid) {
		t.Errorf("hostLinkMark of a path = %v, want ErrInvalid", err)
	}
}

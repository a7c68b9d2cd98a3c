package zonenet

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
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

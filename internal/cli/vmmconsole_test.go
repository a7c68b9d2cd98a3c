package cli

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY returns the terminal side of a new pseudo-terminal.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pts.Close() })
	return pts
}

// A terminal is put in raw mode (no echo, no line editing, no signals from
// keys, so Ctrl-] and Ctrl-C reach the console) and restored as it was; a
// pipe is left alone.
func TestRawMode(t *testing.T) {
	pts := openPTY(t)
	fd := int(pts.Fd())
	before, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if before.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG) == 0 {
		t.Fatalf("a new terminal is already raw: lflag %#x", before.Lflag)
	}
	restore, isTerm, err := rawMode(fd)
	if err != nil || !isTerm {
		t.Fatalf("rawMode = %v, %v", isTerm, err)
	}
	raw, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Lflag&(unix.ECHO|unix.ICANON|unix.ISIG|unix.IEXTEN) != 0 || raw.Iflag&(unix.ICRNL|unix.IXON) != 0 || raw.Oflag&unix.OPOST != 0 {
		t.Errorf("not raw: iflag %#x oflag %#x lflag %#x", raw.Iflag, raw.Oflag, raw.Lflag)
	}
	restore()
	after, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if *after != *before {
		t.Errorf("not restored: %+v, was %+v", after, before)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, isTerm, err := rawMode(int(r.Fd())); isTerm || err != nil {
		t.Errorf("rawMode of a pipe = %v, %v; want not a terminal", isTerm, err)
	}
}

// Package chrony runs chronyd for an NTP zone: its configuration, rendered
// from the zone's config into the zone root, the daemon as a child process,
// and chronyc's tracking and reload commands over the zone's command socket.
package chrony

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Dir is where scripts/setup puts Debian's chronyd and chronyc (taken out
// of the package, so that no system chrony service is ever enabled and no
// AppArmor profile confines them). Find looks there first.
const Dir = "/usr/local/libexec/sled-agent/chrony"

// ErrNotInstalled: chronyd or chronyc is not on this machine.
var ErrNotInstalled = errors.New("chrony is not installed (scripts/setup installs it as root)")

// Binaries are the paths of the two programs.
type Binaries struct {
	Chronyd string
	Chronyc string
}

// searchDirs are looked in after Dir and PATH: an agent started with a
// short PATH still finds a chrony installed by a package.
var searchDirs = []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"}

// Find locates chronyd and chronyc: in Dir, then on PATH, then in
// /usr/sbin, /sbin, /usr/bin and /bin. The error wraps ErrNotInstalled.
func Find() (Binaries, error) {
	var b Binaries
	var err error
	if b.Chronyd, err = look("chronyd"); err != nil {
		return Binaries{}, err
	}
	if b.Chronyc, err = look("chronyc"); err != nil {
		return Binaries{}, err
	}
	return b, nil
}

func look(name string) (string, error) {
	if p := filepath.Join(Dir, name); executable(p) {
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs, nil
		}
	}
	for _, d := range searchDirs {
		if p := filepath.Join(d, name); executable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s, on PATH or in %s: %w",
		name, Dir, strings.Join(searchDirs, ":"), ErrNotInstalled)
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// runDirMark is the file prepareRunDir writes in the tmpfs it mounts on the
// run dir: ReleaseRunDir unmounts only a tmpfs with it, never one the host
// or another program mounted. It goes with the tmpfs.
const runDirMark = ".mounted-by-sled-agent"

// ReleaseRunDir unmounts the tmpfs this runtime's kind mounted on the run
// dir (TmpfsRunDir; the agent's teardown, once its zones are gone) if it
// holds nothing but this runtime's: its tag's service root, empty, and its
// tag's boot token. It says what it released, or what it left and why; both
// "" if there was no such tmpfs.
func (r *Runtime) ReleaseRunDir() (released, left string, err error) {
	dir := r.opts.RunDir
	if !r.opts.TmpfsRunDir {
		return "", "", nil
	}
	if _, err := os.Stat(filepath.Join(dir, runDirMark)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", "", nil // not ours: the run dir is on the host's tmpfs
		}
		return "", "", fmt.Errorf("run dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", "", fmt.Errorf("run dir: %w", err)
	}
	var others []string
	for _, e := range ents {
		switch n := e.Name(); {
		case n == runDirMark, n == r.opts.Tag+".boot":
		case n == r.opts.Tag && e.IsDir():
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				others = append(others, n+"/ (not empty)")
			}
		default:
			others = append(others, n)
		}
	}
	if len(others) > 0 {
		slices.Sort(others)
		return "", fmt.Sprintf("run dir %s, a tmpfs the agent mounted, still mounted: it holds %s", dir, strings.Join(others, ", ")), nil
	}
	if err := unix.Unmount(dir, 0); err != nil {
		return "", fmt.Sprintf("run dir %s, a tmpfs the agent mounted, still mounted: %v", dir, err), nil
	}
	// The mount point too, if empty (the agent made it).
	os.Remove(dir)
	return fmt.Sprintf("run dir %s (tmpfs unmounted)", dir), "", nil
}

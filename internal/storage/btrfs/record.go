package btrfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
)

// The record of attached synthetic disks.
//
// A loop device outlives the agent that attached it, and the vdev dir it
// was attached for may not be given again (a teardown without --vdev-dir).
// So the backend writes the real path of each vdev file to
// Options.LoopRecord, durably, before it attaches a loop device to it, and
// Release detaches the loop devices of the recorded files as well as those
// of VdevDir, then forgets the files it released.

// recorded reads the record: the vdev files loop devices were attached to.
func (b *Backend) recorded() ([]string, error) {
	if b.opts.LoopRecord == "" {
		return nil, nil
	}
	data, err := os.ReadFile(b.opts.LoopRecord)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("record of attached vdev files: %w", err)
	}
	var files []string
	if err := json.Unmarshal(data, &files); err != nil {
		return nil, fmt.Errorf("record of attached vdev files %s: %w", b.opts.LoopRecord, err)
	}
	return files, nil
}

// writeRecord replaces the record with files (none: no record).
func (b *Backend) writeRecord(files []string) error {
	if len(files) == 0 {
		if err := os.Remove(b.opts.LoopRecord); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	data, err := json.Marshal(files)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(b.opts.LoopRecord, append(data, '\n'), atomicfile.Options{Perm: 0o600, Durable: true})
}

// record adds file (a real path) to the record before a loop device is
// attached to it; one writer at a time, waiting no longer than ctx.
func (b *Backend) record(ctx context.Context, file string) error {
	if b.opts.LoopRecord == "" {
		return nil
	}
	select {
	case b.recordSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("recording %s: %w", file, ctx.Err())
	}
	defer func() { <-b.recordSem }()
	files, err := b.recorded()
	if err != nil {
		return err
	}
	if slices.Contains(files, file) {
		return nil
	}
	if err := b.writeRecord(append(files, file)); err != nil {
		return fmt.Errorf("recording the vdev file %s: %w", file, err)
	}
	return nil
}

// recordedLoops lists the loop devices backed by a recorded file (deleted
// ones included) that vdevLoops did not list, and the record itself. A
// recorded file must still be named as a synthetic disk of this backend's
// tag: the record names files, never anything else to detach.
func (b *Backend) recordedLoops(seen []vdevLoop) ([]vdevLoop, []string, error) {
	files, err := b.recorded()
	if err != nil || len(files) == 0 {
		return nil, files, err
	}
	ents, _ := os.ReadDir(sysBlock)
	var out []vdevLoop
	for _, e := range ents {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "loop%d", &n); err != nil || e.Name() != fmt.Sprintf("loop%d", n) {
			continue
		}
		dev := "/dev/" + e.Name()
		if slices.ContainsFunc(seen, func(l vdevLoop) bool { return l.dev == dev }) {
			continue
		}
		f := readTrim(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		file, deleted := strings.CutSuffix(f, deletedSuffix)
		name, _, ok := parseVdevName(filepath.Base(file))
		if f == "" || !ok || !strings.HasPrefix(name, b.opts.Tag) || !slices.Contains(files, file) {
			continue
		}
		out = append(out, vdevLoop{dev: dev, file: file, deleted: deleted})
	}
	slices.SortFunc(out, func(x, y vdevLoop) int { return strings.Compare(x.dev, y.dev) })
	return out, files, nil
}

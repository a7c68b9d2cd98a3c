//go:build linux

package supervise

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
)

// MarkerEnv is the environment entry the run script gives the service, with
// the service directory as its value: the mark by which Stop and Status
// recognise the service's processes without asking runsv.
const MarkerEnv = "SLED_AGENT_SUPERVISE_DIR"

// Names of the files in a service directory.
const (
	runFile      = "run"
	finishFile   = "finish"
	logFile      = "runsv.log"
	lastExitFile = "last-exit"
)

// finishScript records how the service last exited. runsv runs it in the
// service directory with two arguments: the exit code of ./run, or -1 when a
// signal ended it, and the low byte of the wait status (the signal number).
const finishScript = `#!/bin/sh
# Written by sled-agent (package supervise). Records how ./run last exited.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
printf '%s %s\n' "$1" "$2" >` + lastExitFile + `.new && exec mv -f ` + lastExitFile + `.new ` + lastExitFile + `
`

// defaultPath is the service's PATH when env does not set one.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Prepare writes the runit service directory dir, creating it if missing: an
// executable run script that execs argv with the environment env (plus
// MarkerEnv, and defaultPath when env has no PATH; nothing else is inherited
// from the agent, and runsv has only PATH), and a finish script that records the exit status in
// dir/last-exit. Every argument and environment entry is single-quoted, so the
// shell interprets none of it; NUL bytes are refused. Prepare is idempotent: a
// file is rewritten (temp file and rename) only when its content changed.
func Prepare(dir string, argv []string, env []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", dir, err)
	}
	abs, err := canonical(dir)
	if err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", dir, err)
	}
	run, err := runScript(abs, argv, env)
	if err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", abs, err)
	}
	// A directory PrepareDirect wrote before: its run is a link to the
	// program, and runsv would start with the program's environment.
	if err := os.Remove(filepath.Join(abs, argsFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("supervise: prepare %s: %w", abs, err)
	}
	if fi, err := os.Lstat(filepath.Join(abs, runFile)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if err := os.Remove(filepath.Join(abs, runFile)); err != nil {
			return fmt.Errorf("supervise: prepare %s: %w", abs, err)
		}
	}
	if err := writeIfChanged(filepath.Join(abs, runFile), run, 0o755); err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", abs, err)
	}
	if err := writeIfChanged(filepath.Join(abs, finishFile), []byte(finishScript), 0o755); err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", abs, err)
	}
	return nil
}

// runScript returns the run script for the service in directory abs.
func runScript(abs string, argv, env []string) ([]byte, error) {
	if err := checkCommand(argv, env); err != nil {
		return nil, err
	}
	// runsv runs the script with only PATH in its environment (see
	// spawn); the script sets exactly the service's and execs it, with no
	// program in between.
	var b bytes.Buffer
	b.WriteString("#!/bin/sh\n# Written by sled-agent (package supervise); rewritten by every Prepare.\n")
	for _, w := range serviceEnv(abs, env) {
		k, v, _ := strings.Cut(w, "=")
		b.WriteString(k + "=" + shellQuote(v) + "; export " + k + "\n")
	}
	b.WriteString("exec")
	for _, a := range argv {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString("\n")
	return b.Bytes(), nil
}

// checkCommand accepts a service's argv and environment: a program, no NUL
// bytes, NAME=value entries, and not the mark, which is the package's own.
func checkCommand(argv, env []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("empty argv")
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("argv[%d] contains a NUL byte", i)
		}
	}
	for _, e := range env {
		k, _, ok := strings.Cut(e, "=")
		switch {
		case strings.IndexByte(e, 0) >= 0:
			return fmt.Errorf("environment entry %q contains a NUL byte", k)
		case !ok || !validEnvName(k):
			return fmt.Errorf("environment entry %q is not NAME=value", e)
		case k == MarkerEnv:
			return fmt.Errorf("environment entry %s is reserved", MarkerEnv)
		}
	}
	return nil
}

// shellQuote quotes s for sh: inside single quotes nothing is special but the
// single quote itself, which closes the quotes, is written escaped and
// reopens them.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func validEnvName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// writeIfChanged makes path hold content with mode perm, replacing it
// atomically (temp file, fsync, rename) only when its content differs.
func writeIfChanged(path string, content []byte, perm fs.FileMode) error {
	return atomicfile.WriteFileIfChanged(path, content, atomicfile.Options{Perm: perm, Durable: true})
}

// canonical returns dir as an absolute path without symbolic links: the form
// in which the kernel reports runsv's working directory and open files.
func canonical(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

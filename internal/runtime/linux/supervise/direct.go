//go:build linux

package supervise

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// argsFile holds the argv and environment of a service prepared with
// PrepareDirect.
const argsFile = "run.args"

type directArgs struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
}

// PrepareDirect is Prepare for a program that knows this package. Instead of
// a run script, run is a symbolic link to the program (argv[0], an absolute
// path), so runsv execs it with no shell in between: where every start of a
// dynamically linked program costs the best part of a millisecond (a
// virtual machine traps the CPU feature probes of its C library), the shell
// was a tenth of a zone's start. The program, started as ./run, gets its
// argv from RunArgs. Its environment is runsv's: env, MarkerEnv and PATH
// (defaultPath when env has none), given to runsv when it starts, so a
// change of env takes effect with the next runsv.
func PrepareDirect(dir string, argv, env []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", dir, err)
	}
	abs, err := canonical(dir)
	if err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", dir, err)
	}
	if err := prepareDirect(abs, argv, env); err != nil {
		return fmt.Errorf("supervise: prepare %s: %w", abs, err)
	}
	return nil
}

func prepareDirect(abs string, argv, env []string) error {
	if err := checkCommand(argv, env); err != nil {
		return err
	}
	if !filepath.IsAbs(argv[0]) {
		return fmt.Errorf("program %q: want an absolute path", argv[0])
	}
	b, err := json.Marshal(directArgs{Argv: argv, Env: serviceEnv(abs, env)})
	if err != nil {
		return err
	}
	if err := writeIfChanged(filepath.Join(abs, argsFile), b, 0o644); err != nil {
		return err
	}
	if err := writeIfChanged(filepath.Join(abs, finishFile), []byte(finishScript), 0o755); err != nil {
		return err
	}
	run := filepath.Join(abs, runFile)
	if target, err := os.Readlink(run); err == nil && target == argv[0] {
		return nil
	}
	tmp := run + ".new"
	os.Remove(tmp)
	if err := os.Symlink(argv[0], tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, run); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// serviceEnv is the environment of the service in abs: env, with PATH if env
// has none, and the mark.
func serviceEnv(abs string, env []string) []string {
	out := []string{MarkerEnv + "=" + abs}
	if !hasPath(env) {
		out = append(out, defaultPath)
	}
	return append(out, env...)
}

func hasPath(env []string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return true
		}
	}
	return false
}

// runsvEnv is the environment runsv starts with in abs: a direct service's
// own (its run is runsv's child, execed with runsv's environment), or only
// PATH, for a run script that sets the service's.
func runsvEnv(abs string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(abs, argsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return []string{defaultPath}, nil
	}
	if err != nil {
		return nil, err
	}
	var a directArgs
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%s: %w", argsFile, err)
	}
	return a.Env, nil
}

// envCurrent reports whether runsv pid has the environment the directory abs
// asks for (a directory that cannot say asks for nothing in particular).
func envCurrent(pid int, abs string) bool {
	want, err := runsvEnv(abs)
	if err != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return true // gone, or not ours to read: waitReady will tell
	}
	return string(b) == strings.Join(want, "\x00")+"\x00"
}

// RunArgs returns the argv of a service prepared with PrepareDirect when the
// running program is one (ok): started as ./run, with the mark of its
// service directory in its environment. Such a program calls it first
// thing, and runs as if started with the argv it returns. An error means it
// was started as ./run but its arguments cannot be found: it must exit
// rather than go on as if asked for nothing (runsv would start it again
// and again).
func RunArgs() (argv []string, ok bool, err error) {
	if len(os.Args) != 1 || os.Args[0] != "./"+runFile {
		return nil, false, nil
	}
	dir := os.Getenv(MarkerEnv)
	if dir == "" {
		return nil, false, fmt.Errorf("started as ./%s without %s in the environment", runFile, MarkerEnv)
	}
	b, err := os.ReadFile(filepath.Join(dir, argsFile))
	if err != nil {
		return nil, false, fmt.Errorf("started as ./%s: %w", runFile, err)
	}
	var a directArgs
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, false, fmt.Errorf("started as ./%s: %s: %w", runFile, argsFile, err)
	}
	if len(a.Argv) == 0 {
		return nil, false, fmt.Errorf("started as ./%s: %s has no argv", runFile, argsFile)
	}
	return a.Argv, true, nil
}

// title holds what /proc/<pid>/cmdline shows after SetTitle; it must live as
// long as the process.
var title []byte

// SetTitle makes ps show the process as argv rather than ./run: its command
// line, and its name (comm) as argv[0]'s base name. Moving the command line
// needs CAP_SYS_RESOURCE, which root in a container may lack (the error
// wraps EPERM); then only the name changes.
func SetTitle(argv []string) error {
	if len(argv) == 0 {
		return errors.New("empty argv")
	}
	// The thread group leader's name, whichever thread writes it.
	err := os.WriteFile("/proc/self/comm", []byte(filepath.Base(argv[0])), 0)
	b := []byte(strings.Join(argv, "\x00") + "\x00")
	title = b
	start := uintptr(unsafe.Pointer(&b[0]))
	end := start + uintptr(len(b))
	// After each call the kernel wants arg_start <= arg_end: move first the
	// end that keeps it so.
	set := func(opt int, addr uintptr) error { return unix.Prctl(unix.PR_SET_MM, uintptr(opt), addr, 0, 0) }
	if set(unix.PR_SET_MM_ARG_START, start) == nil {
		return errors.Join(err, set(unix.PR_SET_MM_ARG_END, end))
	}
	if perr := set(unix.PR_SET_MM_ARG_END, end); perr != nil {
		return errors.Join(err, fmt.Errorf("setting the command line: %w", perr))
	}
	return errors.Join(err, set(unix.PR_SET_MM_ARG_START, start))
}

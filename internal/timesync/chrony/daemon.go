package chrony

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/procgroup"
)

// ErrNotRunning: no chronyd listens on the instance's command socket (the
// socket file is absent).
var ErrNotRunning = errors.New("chronyd is not running")

// ErrExited: chronyd exited without being asked to.
var ErrExited = errors.New("chronyd exited")

// Defaults of Options.
const (
	DefaultCommandTimeout = 5 * time.Second
	DefaultStopTimeout    = 5 * time.Second
)

// waitDelay is how long a killed command's output may stay open, and how
// long a killed process is waited for before the caller is let go.
const waitDelay = 500 * time.Millisecond

// Options tune a Daemon; zero values are the defaults.
type Options struct {
	// Binaries are chronyd and chronyc; zero is Find's.
	Binaries Binaries
	// Log receives chronyd's messages and the daemon's own; nil discards.
	Log *slog.Logger
	// CommandTimeout bounds each chronyc run (within the caller's deadline).
	CommandTimeout time.Duration
	// StopTimeout is how long chronyd has to exit after SIGTERM before its
	// process group is killed.
	StopTimeout time.Duration
}

// Daemon is one chronyd instance: its config and files, the process when
// Run runs it, and chronyc's commands over its socket. Tracking and
// SetServers work whoever started chronyd (Run, or a zone's supervisor
// running Binaries.Chronyd with Config.Args).
type Daemon struct {
	bins  Binaries
	log   *slog.Logger
	cmdTO time.Duration
	stop  time.Duration

	mu  sync.Mutex
	cfg Config // Servers change with SetServers
	gen uint64 // bumped with every change of cfg
}

// New checks cfg and returns its Daemon; nothing is written or started.
func New(cfg Config, opts Options) (*Daemon, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if opts.Binaries == (Binaries{}) {
		b, err := Find()
		if err != nil {
			return nil, err
		}
		opts.Binaries = b
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.CommandTimeout <= 0 {
		opts.CommandTimeout = DefaultCommandTimeout
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	cfg.Servers = slices.Clone(cfg.Servers)
	cfg.Allow = slices.Clone(cfg.Allow)
	return &Daemon{
		bins:  opts.Binaries,
		log:   opts.Log.With("component", "chrony", "root", cfg.Root),
		cmdTO: opts.CommandTimeout,
		stop:  opts.StopTimeout,
		cfg:   cfg,
	}, nil
}

// Config is the current config (with the servers of the last SetServers).
func (d *Daemon) Config() Config {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.cfg
	c.Servers = slices.Clone(c.Servers)
	c.Allow = slices.Clone(c.Allow)
	return c
}

// Argv is the command line that runs this instance: chronyd's path and
// Config.Args. A zone's supervisor runs it.
func (d *Daemon) Argv() []string {
	return append([]string{d.bins.Chronyd}, d.Config().Args()...)
}

// WriteConfig writes the instance's files (see Write), with the servers of
// the last SetServers.
func (d *Daemon) WriteConfig() error {
	return d.writeLatest(Write)
}

// writeLatest runs write with the current config until the config did not
// change while it ran: a SetServers racing with another leaves the files
// of the later one, without a lock held across the writes.
func (d *Daemon) writeLatest(write func(Config) error) error {
	for {
		d.mu.Lock()
		gen := d.gen
		d.mu.Unlock()
		if err := write(d.Config()); err != nil {
			return err
		}
		d.mu.Lock()
		same := d.gen == gen
		d.mu.Unlock()
		if same {
			return nil
		}
	}
}

// Run writes the config and runs chronyd as a child in its own process
// group until ctx ends, then stops it: SIGTERM to the group, SIGKILL after
// StopTimeout. It returns nil once chronyd is stopped that way, and an
// error wrapping ErrExited, with chronyd's last words, if chronyd exits
// first. chronyd also gets SIGTERM if this process dies.
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.WriteConfig(); err != nil {
		return err
	}
	argv := d.Argv()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out := &lineLog{log: d.log}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chrony: start %s: %w", argv[0], err)
	}
	pgid := cmd.Process.Pid
	d.log.Info("chronyd started", "pid", pgid, "argv", strings.Join(argv, " "))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		syscall.Kill(-pgid, syscall.SIGKILL) // whatever it left in its group
		return fmt.Errorf("chrony: %w (%v): %s", ErrExited, err, out.tail())
	case <-ctx.Done():
	}
	syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(d.stop)
	defer t.Stop()
	select {
	case <-done:
		syscall.Kill(-pgid, syscall.SIGKILL)
		d.log.Info("chronyd stopped", "pid", pgid)
		return nil
	case <-t.C:
	}
	d.log.Warn("chronyd did not stop at SIGTERM: killing its process group", "pid", pgid, "after", d.stop)
	syscall.Kill(-pgid, syscall.SIGKILL)
	t.Reset(d.stop)
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("chrony: chronyd (pid %d) killed, still not exited after %v", pgid, d.stop)
	}
}

// Tracking runs "chronyc -c tracking" and returns its CSV line (without
// the newline): reference id, address, stratum, reference time, system
// time offset, last offset, RMS offset, frequency, residual frequency,
// skew, root delay, root dispersion, update interval, leap status.
// Addresses are not resolved to names (-n).
func (d *Daemon) Tracking(ctx context.Context) (string, error) {
	out, err := d.chronyc(ctx, "-c", "tracking")
	if err != nil {
		return "", err
	}
	line := strings.TrimSpace(string(out))
	if line == "" || strings.ContainsRune(line, '\n') || !strings.Contains(line, ",") {
		return "", fmt.Errorf("chrony: tracking: not one CSV line: %q", procgroup.Snippet([]byte(line), 512))
	}
	return line, nil
}

// SetServers makes servers the instance's servers: the sources file is
// replaced atomically and "chronyc reload sources" makes the running
// chronyd apply it (dropping servers not in the list). With no chronyd
// running the file is still replaced, for its next start, and the error
// wraps ErrNotRunning.
func (d *Daemon) SetServers(ctx context.Context, servers []netip.Addr) error {
	for _, a := range servers {
		if err := checkServer(a); err != nil {
			return err
		}
	}
	d.mu.Lock()
	next := d.cfg
	next.Servers = slices.Clone(servers)
	if err := next.validate(); err != nil {
		d.mu.Unlock()
		return err
	}
	d.cfg.Servers = next.Servers
	d.gen++
	d.mu.Unlock()
	err := d.writeLatest(func(c Config) error {
		if err := privateDir(c.Paths().Dir); err != nil {
			return err
		}
		return writeSources(c.Paths().Sources, renderSources(c))
	})
	if err != nil {
		return err
	}
	_, err = d.chronyc(ctx, "reload", "sources")
	return err
}

// CommandError is a chronyc run that failed.
type CommandError struct {
	Args   []string
	Err    error
	Output string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("chronyc %s: %v: %q", strings.Join(e.Args, " "), e.Err, e.Output)
}

func (e *CommandError) Unwrap() error { return e.Err }

// chronyc runs chronyc with args on the instance's socket, in its own
// process group, killed at the earlier of ctx's deadline and
// CommandTimeout. It returns stdout.
func (d *Daemon) chronyc(ctx context.Context, args ...string) ([]byte, error) {
	p := d.Config().Paths()
	if _, err := os.Stat(p.Socket); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("chrony: %w: no socket %s", ErrNotRunning, p.Socket)
	}
	ctx, cancel := context.WithTimeout(ctx, d.cmdTO)
	defer cancel()
	argv := append([]string{"-n", "-h", p.Socket}, args...)
	cmd := exec.Command(d.bins.Chronyc, argv...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	res, err := procgroup.Run(ctx, cmd, procgroup.Options{WaitDelay: waitDelay})
	if errors.Is(err, procgroup.ErrStart) {
		return nil, fmt.Errorf("chrony: start %s: %w", d.bins.Chronyc, err)
	}
	if err != nil {
		// A chronyc that did not exit by itself leaves its own socket
		// behind (it binds one in the server socket's directory).
		os.Remove(filepath.Join(p.SocketDir, "chronyc."+strconv.Itoa(res.Pid)+".sock"))
	}
	if errors.Is(err, procgroup.ErrKilled) || errors.Is(err, procgroup.ErrStuck) {
		return nil, fmt.Errorf("chronyc %s: killed at its deadline: %w", strings.Join(args, " "), ctx.Err())
	}
	if err != nil {
		return nil, &CommandError{Args: args, Err: err, Output: procgroup.Snippet([]byte(string(res.Stdout)+" "+string(res.Stderr)), 512)}
	}
	return res.Stdout, nil
}

// lineLog logs chronyd's output a line at a time and keeps the last lines
// for the error of an unexpected exit. exec writes to it from one
// goroutine; tail is read after Wait.
type lineLog struct {
	log     *slog.Logger
	mu      sync.Mutex
	partial []byte
	last    []string
}

const keepLines = 10

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		l.log.Info("chronyd", "line", line)
		l.last = append(l.last, line)
		if len(l.last) > keepLines {
			l.last = l.last[1:]
		}
	}
	if len(l.partial) > 4096 {
		l.partial = l.partial[:0]
	}
	return len(p), nil
}

func (l *lineLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := slices.Clone(l.last)
	if len(l.partial) > 0 {
		lines = append(lines, string(l.partial))
	}
	return strings.Join(lines, " | ")
}

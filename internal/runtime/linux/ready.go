package linux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/procgroup"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// Ready says how an image's service shows that it is ready, and healthy: at
// most one of its fields is set, and with none the check is a TCP connect to
// the zone's service address. Readiness (Ensure) and health (Healthy) are
// the same check; each run of it has a deadline (Options.HealthTimeout).
//
// Upstream waits for a zone's SMF service to come online, which each
// service's manifest defines; runsv says only that the process runs, so here
// the image says what ready means.
//
// A TCP connect cannot tell a stopped service (SIGSTOP) from a live one: the
// kernel completes the handshake from the listen queue without the service.
// An HTTP check, or a command that asks the service something, can.
type Ready struct {
	// TCP: a connection to the zone's service address and port is
	// accepted.
	TCP *TCPReady `json:"tcp,omitempty"`
	// HTTP: a GET of a path on the zone's service address and port
	// answers with the expected status.
	HTTP *HTTPReady `json:"http,omitempty"`
	// Command: a command run in the zone's network namespace exits 0. Its
	// argv holds the image's placeholders; it runs without a shell, in its
	// own process group, which is killed at the check's deadline.
	Command []string `json:"command,omitempty"`

	// zoneService: GET /health answers with the agent's zone service's
	// health report (the agent's own images).
	zoneService bool
}

// TCPReady is a TCP connect check; it has no settings.
type TCPReady struct{}

// HTTPReady is an HTTP GET check.
type HTTPReady struct {
	// Path is what is asked for, "/healthz" (default "/").
	Path string `json:"path,omitempty"`
	// Status is the answer that means ready (default 200).
	Status int `json:"status,omitempty"`
}

// probe is one zone's readiness check, ready to run.
type probe struct {
	// what names what the check waits for: "tcp [fd00::5]:32345".
	what string
	// check runs the check once, within ctx's deadline: nil means ready.
	check func(ctx context.Context) error
	// patient checks get the whole timeout at every try: a command's
	// start takes longer than a refused connection.
	patient bool
}

// run runs the check once under its deadline: poll's, which starts short
// and grows up to the health timeout, for network checks while a zone
// starts; else (poll nil, or a command) the whole timeout.
func (p probe) run(ctx context.Context, poll *zoneservice.Poller, timeout time.Duration) error {
	if poll != nil && !p.patient {
		return poll.Run(ctx, p.check)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return p.check(ctx)
}

// waiting is what a zone waiting for readiness waits for, and the check's
// last answer.
func (p probe) waiting(last error) string {
	if last == nil {
		return "waiting for " + p.what
	}
	return "waiting for " + p.what + ": " + last.Error()
}

// probeFor builds the readiness check of a zone running img, with its
// root at root ({root}; spec.Storage.Data is {data}).
func (r *Runtime) probeFor(spec zone.Spec, img Image, root string) (probe, error) {
	addr, ok := spec.Config.ServiceAddr()
	if !ok {
		return probe{}, fmt.Errorf("zone %s has no underlay service address", spec.Name)
	}
	netns := r.netnsName(spec.Name)
	start := func(cmd *exec.Cmd) error { return zonenet.StartIn(netns, cmd) }
	return img.Ready.probe(addr, expander(spec, addr, r.agent, root, r.opts.Tag), start)
}

// probe builds the check for a service at addr; start starts a command
// where the service runs.
func (rd Ready) probe(addr netip.AddrPort, ph placeholders, start func(*exec.Cmd) error) (probe, error) {
	switch {
	case rd.zoneService:
		return probe{what: "zone service health GET " + addr.String() + "/health", check: func(ctx context.Context) error {
			return short(zoneservice.Check(ctx, addr.String()))
		}}, nil
	case rd.HTTP != nil:
		path, status := httpDefaults(*rd.HTTP)
		return probe{what: "http GET " + addr.String() + path, check: func(ctx context.Context) error {
			return checkHTTP(ctx, addr, path, status)
		}}, nil
	case rd.Command != nil:
		argv, err := ph.expand(rd.Command)
		if err != nil {
			return probe{}, err
		}
		if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
			return probe{}, fmt.Errorf("readiness command %q: want an absolute path first", argv)
		}
		return probe{what: "command " + strings.Join(argv, " "), patient: true, check: func(ctx context.Context) error {
			return checkCommand(ctx, argv, start)
		}}, nil
	default:
		return probe{what: "tcp " + addr.String(), check: func(ctx context.Context) error {
			return checkTCP(ctx, addr)
		}}, nil
	}
}

func httpDefaults(h HTTPReady) (path string, status int) {
	path, status = h.Path, h.Status
	if path == "" {
		path = "/"
	}
	if status == 0 {
		status = http.StatusOK
	}
	return path, status
}

func checkTCP(ctx context.Context, addr netip.AddrPort) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return short(err)
	}
	c.Close()
	return nil
}

// readyClient keeps no connections and follows no redirects: a redirect is
// an answer, and its status is checked like any other.
var readyClient = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{}).DialContext,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

func checkHTTP(ctx context.Context, addr netip.AddrPort, path string, want int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+path, nil)
	if err != nil {
		return err
	}
	resp, err := readyClient.Do(req)
	if err != nil {
		return short(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != want {
		return fmt.Errorf("status %d, want %d", resp.StatusCode, want)
	}
	return nil
}

// commandWaitDelay is how long a readiness command's output may stay open
// after the command is gone (a child that escaped its process group).
const commandWaitDelay = 100 * time.Millisecond

// checkCommand runs argv (argv[0] an absolute path), started by start, in
// its own process group (internal/procgroup); the group is killed at ctx's
// deadline, and whatever of it is left once the command exits. The command
// is not in the zone's cgroup: one the agent did not wait for (the agent
// died meanwhile) outlives the zone.
func checkCommand(ctx context.Context, argv []string, start func(*exec.Cmd) error) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	res, err := procgroup.Run(ctx, cmd, procgroup.Options{Start: start, WaitDelay: commandWaitDelay, Combined: true})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, procgroup.ErrKilled), errors.Is(err, procgroup.ErrStuck):
		return &notReady{msg: "killed at its deadline", err: ctx.Err()}
	}
	if s := procgroup.Snippet(res.Stdout, 200); s != "" {
		return fmt.Errorf("%w: %q", err, s)
	}
	return err
}

// notReady is a check's answer cut to what a person needs ("connection
// refused"), with its cause kept for errors.Is.
type notReady struct {
	msg string
	err error
}

func (e *notReady) Error() string { return e.msg }
func (e *notReady) Unwrap() error { return e.err }

// short cuts a network error to its heart: the errno ("connection
// refused", "no route to host") or "no answer in time"; others are kept.
func short(err error) error {
	if err == nil {
		return nil
	}
	var errno syscall.Errno
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &notReady{msg: "no answer in time", err: err}
	case errors.As(err, &errno):
		return &notReady{msg: errno.Error(), err: err}
	}
	return err
}

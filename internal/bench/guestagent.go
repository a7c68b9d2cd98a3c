package bench

// The guest benchmark's agent side: the agent binary run with the linux
// runtime, and VMMs registered, run and stopped through its API.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

const (
	// agentCallTimeout bounds each request to the agent.
	agentCallTimeout = 30 * time.Second
	// agentStartTimeout bounds the agent's start until it answers.
	agentStartTimeout = 30 * time.Second
	// agentStopTimeout is how long the agent has to exit on SIGTERM.
	agentStopTimeout = time.Minute
	// guestPoll is how often a console is dialled until it answers, and a
	// VMM's state read while it stops.
	guestPoll = 20 * time.Millisecond
	// propolisPort is every VMM's service port.
	propolisPort = 12400
)

// guestAgent is the agent process of a run.
type guestAgent struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd has been waited for
	base    string        // http://127.0.0.1:port
	hc      *http.Client
	logPath string
}

// agentConfig is the agent's config as `sled-agent teardown` would read it.
func (b *guestBench) agentConfig() agent.Config {
	return agent.Config{DataDir: filepath.Join(b.dir, "data"), RunDir: b.runDir, Runtime: "linux", ZoneTag: b.tag, NetnsPrefix: b.prefix,
		UnderlayIP: guestPrefix + "1"} // its VMMs are in that /64
}

// startAgent runs the agent binary and waits until it answers. b.agent is
// set once the process runs, so that cleanup stops it whatever happens.
func (b *guestBench) startAgent(ctx context.Context) error {
	listen, err := freeLoopbackPort()
	if err != nil {
		return err
	}
	cfg := b.agentConfig()
	logPath := cmp.Or(b.opts.AgentLog, filepath.Join(b.dir, "agent.log"))
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(b.opts.Agent, "run", "--runtime", "linux", "--data-dir", cfg.DataDir, "--run-dir", cfg.RunDir,
		"--listen", listen, "--skip-timesync", "--ddm-url", "", "--zone-tag", b.tag, "--netns-prefix", b.prefix,
		"--vmm-image-dir", b.images, "--vmm-accel", "tcg", "--underlay-ip", cfg.UnderlayIP, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), b.opts.AgentEnv...)
	// Its own process group, so that Ctrl-C reaches only the benchmark,
	// which stops the agent once it has unregistered its VMMs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	a := &guestAgent{cmd: cmd, exited: make(chan struct{}), base: "http://" + listen,
		hc: &http.Client{Timeout: agentCallTimeout}, logPath: logPath}
	go func() { cmd.Wait(); close(a.exited) }()
	b.agent = a
	deadline := time.Now().Add(agentStartTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := a.do(cctx, http.MethodGet, "/agent/vmms", "", nil)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-a.exited:
			return fmt.Errorf("the agent exited at start: %s", a.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not answer within %s: %w; %s", agentStartTimeout, err, a.logTail())
		}
		if err := sleepCtx(ctx, guestPoll); err != nil {
			return err
		}
	}
}

// stop ends the agent: SIGTERM, then SIGKILL. Its zones stay.
func (a *guestAgent) stop() error {
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
		return nil
	case <-time.After(agentStopTimeout):
	}
	a.cmd.Process.Kill()
	select {
	case <-a.exited:
		return fmt.Errorf("the agent did not exit within %s of SIGTERM: killed", agentStopTimeout)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("the agent (pid %d) did not die of SIGKILL", a.cmd.Process.Pid)
	}
}

func (a *guestAgent) running() bool {
	select {
	case <-a.exited:
		return false
	default:
		return true
	}
}

// logTail is the end of the agent's log, for errors.
func (a *guestAgent) logTail() string {
	b, err := os.ReadFile(a.logPath)
	if err != nil {
		return "no agent log: " + err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return "the agent's log ends: " + strings.Join(lines[max(0, len(lines)-8):], "\n  ")
}

// statusError is an answer of the agent that is not a success.
type statusError struct {
	method, path string
	status       int
	body         string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.method, e.path, e.status, e.body)
}

func (a *guestAgent) do(ctx context.Context, method, path, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return &statusError{method, path, resp.StatusCode, string(bytes.TrimSpace(b))}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// unregister deletes a VMM; one the agent does not know is gone already.
func (a *guestAgent) unregister(ctx context.Context, id string) error {
	err := a.do(ctx, http.MethodDelete, "/vmms/"+id, "", nil)
	if se, ok := errors.AsType[*statusError](err); ok && se.status == http.StatusNotFound {
		return nil
	}
	return err
}

// vmms is GET /agent/vmms: its first page of the most a page holds (a
// benchmark has a few VMMs).
func (a *guestAgent) vmms(ctx context.Context) ([]vmm.Info, error) {
	var page struct{ Items []vmm.Info }
	err := a.do(ctx, http.MethodGet, "/agent/vmms?limit=100", "", &page)
	return page.Items, err
}

// agentVM is one VMM of a phase.
type agentVM struct {
	id, addr, disk string
	body           string
	console        consoleTimes
	connected      time.Duration
}

// agentPhase registers n VMMs at once, runs them and times their consoles
// until every one shows the marker, samples memory, then stops them all
// and times until every one is destroyed. The VMMs are unregistered and
// their disks removed before it returns.
func (b *guestBench) agentPhase(ctx context.Context, n int) (p phase, err error) {
	vms := make([]*agentVM, n)
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), b.opts.StopTimeout)
		defer cancel()
		for _, v := range vms {
			if v == nil {
				continue
			}
			if uerr := b.agent.unregister(uctx, v.id); uerr != nil {
				err = errors.Join(err, fmt.Errorf("unregistering VMM %s: %w", v.id, uerr))
			} else {
				b.reg.doneVMM(v.id)
			}
			os.Remove(v.disk)
		}
	}()
	for i := range vms {
		b.seq++
		id := uuid.NewString()
		v := &agentVM{id: id, addr: netip.AddrPortFrom(guestAddr(b.seq), propolisPort).String(), disk: filepath.Join(b.images, id+".raw")}
		vms[i] = v
		if err := copyDisk(v.disk, b.opts.Image); err != nil {
			return p, err
		}
		v.body = string(vmmtest.Body(uuid.NewString(), v.addr, guestSpec(v.disk, "vopte0"), nil))
	}

	if p.mem.AgentIdleKiB, err = rssKiB(b.agent.cmd.Process.Pid); err != nil {
		return p, err
	}
	bctx, cancel := context.WithTimeout(ctx, b.opts.BootTimeout)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, v := range vms {
		v.console.t0 = t0
		wg.Go(func() { errs[i] = b.agentBoot(bctx, v) })
	}
	wg.Wait()
	if err := vmErrors(errs, func(i int) string { return "VMM " + vms[i].id }); err != nil {
		return p, err
	}
	for _, v := range vms {
		p.connected = append(p.connected, v.connected)
		p.firstByte = append(p.firstByte, v.console.first)
		p.marker = append(p.marker, v.console.marker)
	}

	// While the guests run: memory, the first QEMU's command line, and
	// the agent's record of the first VMM.
	if p.mem.AgentKiB, err = rssKiB(b.agent.cmd.Process.Pid); err != nil {
		return p, err
	}
	for i, v := range vms {
		procs, err := zoneProcs(zonenet.NetnsPath(b.prefix + zone.VMMNamePrefix + v.id))
		if err != nil {
			return p, fmt.Errorf("VMM %s's processes: %w", v.id, err)
		}
		if len(procs.qemu) != 1 || len(procs.service) != 1 {
			return p, fmt.Errorf("VMM %s's zone holds QEMU %v and services %v: want one of each", v.id, procs.qemu, procs.service)
		}
		p.mem.add(procs)
		if i == 0 {
			argv, err := cmdline(procs.qemu[0])
			if err != nil {
				return p, err
			}
			p.argv = normaliseArgv(argv, v.id, v.disk)
		}
	}
	infos, err := b.agent.vmms(ctx)
	if err != nil {
		return p, err
	}
	p.history = historyOf(infos, vms[0].id, t0)
	for _, info := range infos {
		if info.ID == vms[0].id {
			p.detail = info.Detail
		}
	}

	sctx, cancel := context.WithTimeout(ctx, b.opts.StopTimeout)
	defer cancel()
	t1 := time.Now()
	for i, v := range vms {
		wg.Go(func() { errs[i] = b.agentStop(sctx, v.id) })
	}
	wg.Wait()
	p.stop = time.Since(t1)
	if err := vmErrors(errs, func(i int) string { return "VMM " + vms[i].id }); err != nil {
		return p, err
	}
	if infos, err = b.agent.vmms(ctx); err != nil {
		return p, err
	}
	for _, v := range vms {
		p.forced += forcedStop(infos, v.id)
	}
	p.stopHistory = historyOf(infos, vms[0].id, t1)
	return p, nil
}

// agentBoot registers a VMM, asks it to run (the agent keeps the request
// until its service is up), connects to its console and reads it until
// the marker.
func (b *guestBench) agentBoot(ctx context.Context, v *agentVM) error {
	b.reg.addVMM(v.id)
	if err := b.agent.do(ctx, http.MethodPut, "/vmms/"+v.id, v.body, nil); err != nil {
		return err
	}
	if err := b.agent.do(ctx, http.MethodPut, "/vmms/"+v.id+"/state", `{"state":{"type":"running"}}`, nil); err != nil {
		return err
	}
	// A short handshake: an attempt sent before the zone's address is
	// routed waits for nothing, and must not hold up the next.
	c := propolisapi.NewClient(v.addr)
	c.Timeout = 200 * time.Millisecond
	var con *propolisapi.SerialConn
	for {
		var err error
		if con, err = c.SerialConnect(ctx, propolisapi.SerialFromStart(0)); err == nil {
			break
		}
		if serr := sleepCtx(ctx, guestPoll); serr != nil {
			return fmt.Errorf("its serial console never answered: %w (%w)", err, serr)
		}
	}
	v.connected = time.Since(v.console.t0)
	defer con.Close()
	for {
		out, err := con.ReadOutput(ctx)
		if v.console.add(out, time.Now()) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("no marker on its console: %w; it printed %q", err, v.console.tail())
		}
	}
}

// agentStop asks a VMM to stop and waits until it is destroyed.
func (b *guestBench) agentStop(ctx context.Context, id string) error {
	if err := b.agent.do(ctx, http.MethodPut, "/vmms/"+id+"/state", `{"state":{"type":"stopped"}}`, nil); err != nil {
		return err
	}
	last := ""
	for {
		var st struct {
			State vmm.RuntimeState `json:"vmm_state"`
		}
		err := b.agent.do(ctx, http.MethodGet, "/vmms/"+id+"/state", "", &st)
		switch {
		case err == nil && st.State.State == vmm.StateDestroyed:
			return nil
		case err == nil && st.State.State == vmm.StateFailed:
			return errors.New("failed while stopping")
		case err == nil:
			last = st.State.State
		}
		if serr := sleepCtx(ctx, guestPoll); serr != nil {
			return fmt.Errorf("not destroyed (%s, %v): %w", last, err, serr)
		}
	}
}

// historyOf is the agent's record of VMM id from t0 on: ms from t0 to the
// first event of each name.
func historyOf(infos []vmm.Info, id string, t0 time.Time) map[string]float64 {
	out := map[string]float64{}
	for _, info := range infos {
		if info.ID != id {
			continue
		}
		for _, e := range info.History {
			if _, ok := out[e.Event]; !ok && !e.At.Before(t0) {
				out[e.Event] = msOf(e.At.Sub(t0))
			}
		}
	}
	return out
}

// forcedStop is 1 if the agent had to force VMM id's stop.
func forcedStop(infos []vmm.Info, id string) int {
	for _, info := range infos {
		if info.ID == id {
			for _, e := range info.History {
				if e.Event == "stop overdue" {
					return 1
				}
			}
		}
	}
	return 0
}

// vmErrors joins the errors of a phase's VMs, each named.
func vmErrors(errs []error, name func(int) string) error {
	var out []error
	for i, err := range errs {
		if err != nil {
			out = append(out, fmt.Errorf("%s: %w", name(i), err))
		}
	}
	return errors.Join(out...)
}

// guestPrefix is the /64 of the VMMs' addresses (host 0x10+i, salted as
// zoneAddr's).
const guestPrefix = "fd00:1122:3344:1f1::"

func guestAddr(i int) netip.Addr {
	a := netip.MustParseAddr(guestPrefix).As16()
	copy(a[8:12], addrSalt[:])
	v := uint32(0x10 + i)
	a[12], a[13], a[14], a[15] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	return netip.AddrFrom16(a)
}

func freeLoopbackPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

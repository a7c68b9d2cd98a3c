// Package standin is the network of a stand-in guest: a VMM whose guest is
// not a machine but a network namespace, so that tests of guests'
// networking (the VPC data path) run without booting anything. Each NIC of
// the guest is a veth pair: the end named as the guest's tap would be
// (vn<mac>, spec.VNICName), where the tap would be, and the guest's end,
// eth0, eth1, …, with the NIC's MAC, in the guest's namespace.
//
// The guest's namespace is held by a child process of this binary
// (`<binary> stand-in-guest`, RunIfAsked) made in a new network namespace,
// not by a name in /run/netns: it lives exactly as long as the child, which
// lives as long as the process that made it (it exits when its standard
// input ends) or until Close, and it is in the VMM zone's cgroup, so the
// zone's destruction ends it too. Nothing of it can be left behind. Tests
// and operators enter it through the child: /proc/<pid>/ns/net (NetnsPath).
package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
)

// ChildArg is the argument the guest's namespace holder is started with.
const ChildArg = "stand-in-guest"

// NIC is one NIC of the guest: the name of its host end (the tap's) and its
// MAC.
type NIC struct {
	Tap string
	MAC net.HardwareAddr
}

// Net is a stand-in guest's network: its namespace's holder and the host
// ends of its NICs.
type Net struct {
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{}
	taps  []string
}

// stopTimeout bounds the holder's exit at Close.
const stopTimeout = 5 * time.Second

// Attach makes the guest's namespace and a veth pair per NIC, the host end
// named nic.Tap in this thread's (the process's) namespace, up and with no
// IPv6 of its own, the guest end eth<i> with nic.MAC, up. On error nothing
// of it is left.
func Attach(ctx context.Context, nics []NIC) (n *Net, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("stand-in guest: %w", err)
	}
	for _, nic := range nics {
		if _, err := netlink.LinkByName(nic.Tap); err == nil {
			return nil, fmt.Errorf("stand-in guest: a link called %s is there already", nic.Tap)
		}
	}
	cmd := exec.Command(exe, ChildArg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("stand-in guest: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("stand-in guest: starting its namespace's holder: %w", err)
	}
	n = &Net{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() { cmd.Wait(); close(n.done) }()
	defer func() {
		if err != nil {
			n.Close()
			n = nil
		}
	}()
	ns, err := netns.GetFromPid(cmd.Process.Pid)
	if err != nil {
		return n, fmt.Errorf("stand-in guest: its namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return n, fmt.Errorf("stand-in guest: %w", err)
	}
	defer h.Close()
	if err := setUp(h, "lo"); err != nil {
		return n, err
	}
	for i, nic := range nics {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		guestEnd := fmt.Sprintf("eth%d", i)
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nic.Tap}, PeerName: guestEnd,
			PeerHardwareAddr: nic.MAC, PeerNamespace: netlink.NsFd(int(ns))}
		if err := netlink.LinkAdd(veth); err != nil {
			return n, fmt.Errorf("stand-in guest: adding %s (its guest end %s): %w", nic.Tap, guestEnd, err)
		}
		n.taps = append(n.taps, nic.Tap)
		// The host end is a port's, not the host's: the kernel must not
		// speak on it (router solicitations, DAD).
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+nic.Tap+"/disable_ipv6", []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, fmt.Errorf("stand-in guest: %s: %w", nic.Tap, err)
		}
		if err := setUp(nil, nic.Tap); err != nil {
			return n, err
		}
		if err := setUp(h, guestEnd); err != nil {
			return n, err
		}
	}
	return n, nil
}

// setUp sets the link name up, through h (nil: this namespace).
func setUp(h *netlink.Handle, name string) error {
	if h == nil {
		h = &netlink.Handle{}
	}
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("stand-in guest: setting %s up: %w", name, err)
	}
	return nil
}

// PID is the process holding the guest's namespace.
func (n *Net) PID() int { return n.cmd.Process.Pid }

// NetnsPath is the guest's network namespace, to enter (setns, nsenter).
func (n *Net) NetnsPath() string { return fmt.Sprintf("/proc/%d/ns/net", n.PID()) }

// Close ends the guest's namespace, which takes its NICs' veth pairs with
// it, and removes any host end still there.
func (n *Net) Close() error {
	n.stdin.Close()
	select {
	case <-n.done:
	case <-time.After(stopTimeout):
		n.cmd.Process.Kill()
		<-n.done
	}
	var errs []error
	for _, tap := range n.taps {
		if l, err := netlink.LinkByName(tap); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("stand-in guest: removing %s: %w", tap, err))
			}
		}
	}
	return errors.Join(errs...)
}

// RunIfAsked holds a stand-in guest's namespace when the binary was started
// as Attach starts it: it returns at once otherwise, and exits the process
// once its standard input ends (the process that made it closed it, or
// died).
func RunIfAsked() {
	if len(os.Args) != 2 || os.Args[1] != ChildArg {
		return
	}
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// AttachFor is Attach as simguest.Options.Attach takes it: the guest's NICs
// attached when the guest is made, and detached when it halts, with what
// goes wrong then logged.
//
// The guest says on its console where its namespace is (NotePrefix): the
// way in for a test or an operator (`sled-agent vmm console --history`).
func AttachFor(log *slog.Logger) func(ctx context.Context, nics []simguest.NIC) (func(), string, error) {
	return func(ctx context.Context, nics []simguest.NIC) (func(), string, error) {
		ours := make([]NIC, len(nics))
		for i, n := range nics {
			ours[i] = NIC(n)
		}
		n, err := Attach(ctx, ours)
		if err != nil {
			return nil, "", err
		}
		log.Info("stand-in guest attached", "netns", n.NetnsPath(), "nics", len(nics))
		return func() {
			if err := n.Close(); err != nil {
				log.Warn("stand-in guest detached", "err", err)
			}
		}, NotePrefix + n.NetnsPath(), nil
	}
}

// NotePrefix starts the console line of a stand-in guest that says where
// its network namespace is; the path follows.
const NotePrefix = "STAND-IN GUEST netns="

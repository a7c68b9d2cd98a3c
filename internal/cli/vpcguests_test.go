package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
)

// realGuestWait bounds a boot of the test guest through OVMF under TCG up
// to its lease (two at once on a busy 2-core machine: a minute or two),
// and a ping's answer: hang detectors, not timings.
const realGuestWait = 6 * time.Minute

// VPC.md S3 with real guests: two sleds, each an agent run as a sled in a
// namespace of its own with its data path and the linux runtime's VMMs,
// each booting the test guest under TCG. Each guest learns its address by
// DHCP from its port's gateway, as a rack's guest does (a /32, the gateway
// on-link by option 121); the VPC is pushed to both sleds as Nexus pushes
// it; the guest on one sled pings the guest on the other, through both
// sleds' data paths and Geneve between them, and its console says it was
// answered.
func TestTwoSledsRealGuestsPingAcrossTheVPC(t *testing.T) {
	image := testguest.Image(t) // skips without root, QEMU or OVMF
	images := t.TempDir()
	a, b := twoSleds(t, "--vmm-image-dir", images, "--vmm-accel", "tcg")
	sleds := []*vpcSled{a, b}
	for _, s := range sleds {
		disk := filepath.Join(images, s.tag+".raw")
		if err := testguest.CopyTo(disk, image); err != nil {
			t.Fatal(err)
		}
		s.runGuest(t, ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: 256, NICID: s.nic, Image: disk}))
	}
	start := time.Now()
	pushVPC(t, sleds...)

	ctx, cancel := context.WithTimeout(t.Context(), realGuestWait)
	defer cancel()
	cons := make([]*guestConsole, len(sleds))
	for i, s := range sleds {
		cons[i] = s.console(t, ctx)
	}
	for i, s := range sleds {
		want := testguest.NetPrefix + s.ip + " router=172.30.0.1"
		if _, err := cons[i].waitFor(ctx, want); err != nil {
			t.Fatalf("sled %s: the guest's console did not show %q: %v; it shows:\n%s\nthe data path: %s", s.tag, want, err, cons[i].tail(), s.dataPathState())
		}
		t.Logf("sled %s: the guest has its lease %s after the VMM was asked to run", s.tag, time.Since(start).Round(100*time.Millisecond))
	}

	if err := cons[0].send(ctx, testguest.CmdPing+b.ip); err != nil {
		t.Fatal(err)
	}
	line, err := cons[0].waitFor(ctx, testguest.PingPrefix+b.ip+" ")
	if err != nil {
		t.Fatalf("the guest on %s printed no ping line: %v; it shows:\n%s", a.tag, err, cons[0].tail())
	}
	t.Logf("guest on %s: %s", a.tag, line)
	if !regexp.MustCompile(` ok avg=[0-9.]+ms 3 packets transmitted, [1-3] packets received`).MatchString(line) {
		t.Fatalf("the guest on %s pinged the guest on %s: %s\nthe data paths:\n%s\n%s", a.tag, b.tag, line, a.dataPathState(), b.dataPathState())
	}
}

// dataPathState is the sled's data path's state as `sled-agent vpc`
// prints it, for a failure's message.
func (s *vpcSled) dataPathState() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.dataPath().State(ctx)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%+v", st)
}

// dialIn dials addr from inside the sled's namespace.
func (s *vpcSled) dialIn(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := zonenet.RunInPath("/run/netns/"+s.ns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// forward listens on loopback outside the sled and carries every
// connection to addr inside it (the VMM's service, on the sled's
// underlay), until the test ends. It returns the loopback address.
func (s *vpcSled) forward(t *testing.T, addr string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				in, err := s.dialIn(ctx, "tcp", addr)
				cancel()
				if err != nil {
					return
				}
				defer in.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(in, c); done <- struct{}{} }()
				go func() { io.Copy(c, in); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return l.Addr().String()
}

// guestConsole is a real guest's serial console, read as Nexus reads it
// (the VMM service's websocket), from the start of its history.
type guestConsole struct {
	c    *propolisapi.SerialConn
	seen []byte
	// from is where the next search begins in seen.
	from int
}

// console connects to the sled's guest's console; it is closed when the
// test ends. The VMM's service may not listen yet: connecting is tried
// again until ctx ends.
func (s *vpcSled) console(t *testing.T, ctx context.Context) *guestConsole {
	t.Helper()
	pc := propolisapi.NewClient(s.forward(t, s.addr))
	for {
		c, err := pc.SerialConnect(ctx, propolisapi.SerialFromStart(0))
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return &guestConsole{c: c}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sled %s: the guest's console: %v", s.tag, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitFor reads the console until a line holding want is complete, and
// returns that line from want on; the next wait begins after it.
func (g *guestConsole) waitFor(ctx context.Context, want string) (string, error) {
	for {
		if i := strings.Index(string(g.seen[g.from:]), want); i >= 0 {
			rest := string(g.seen[g.from+i:])
			if j := strings.IndexAny(rest, "\r\n"); j >= 0 {
				g.from += i + j
				return rest[:j], nil
			}
		}
		out, err := g.c.ReadOutput(ctx)
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return "", fmt.Errorf("not within %s: %w", realGuestWait, err)
			}
			return "", err
		}
		g.seen = append(g.seen, out...)
	}
}

// send types line on the console.
func (g *guestConsole) send(ctx context.Context, line string) error {
	return g.c.WriteInput(ctx, []byte(line+"\n"))
}

// tail is the console's last lines, for a failure's message.
func (g *guestConsole) tail() string {
	return strings.Join(lastLines(g.seen, 15), "\n")
}

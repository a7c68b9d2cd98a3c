package simguest

import (
	"context"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// output is all the console's output so far.
func output(g *Guest) string {
	data, _ := g.Console().Read(0, 1<<20)
	return string(data)
}

func write(t *testing.T, g *Guest, s string) {
	t.Helper()
	n, err := g.Console().Write(t.Context(), []byte(s))
	if n != len(s) || err != nil {
		t.Fatalf("Write(%q) = %d, %v", s, n, err)
	}
}

func lines(s string) []string {
	return strings.Split(strings.TrimSuffix(s, "\r\n"), "\r\n")
}

func count(ls []string, line string) int {
	n := 0
	for _, l := range ls {
		if l == line {
			n++
		}
	}
	return n
}

// Every boot prints the firmware's and the kernel's lines and READY with
// the first NIC's MAC by the time the guest is Running; a running guest
// echoes lines, one that does not run loses its input; a stop ends the
// console.
func TestConsole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuest(t, timings)
		ready := ReadyPrefix + macA
		if out := output(g); out != "" {
			t.Errorf("output before a boot: %q", out)
		}
		write(t, g, "lost\n")
		request(t, g, propolisapi.RequestRun)
		if out := output(g); !strings.HasPrefix(out, "BdsDxe: loading Boot0001") || strings.Contains(out, ready) {
			t.Errorf("output while booting: %q", out)
		}
		write(t, g, "lost too\n")
		sleep(timings.BootTime)
		ls := lines(output(g))
		if ls[len(ls)-1] != ready || count(ls, ready) != 1 {
			t.Errorf("after a boot, the last line is not %q:\n%s", ready, strings.Join(ls, "\n"))
		}
		for _, want := range []string{"smpboot: Allowing 2 CPUs", "Memory: 262144K available", "eth0: MAC " + macA} {
			if !strings.Contains(output(g), want) {
				t.Errorf("no %q in the boot lines", want)
			}
		}

		end := g.Console().End()
		write(t, g, "hello\r\nwor")
		write(t, g, "ld\n\r\n")
		write(t, g, strings.Repeat("x", maxLine+1)+"\r")
		got, _ := g.Console().Read(end, 1<<20)
		want := "hello\r\nworld\r\n\r\n" + strings.Repeat("x", maxLine) + "\r\nx\r\n"
		if string(got) != want {
			t.Errorf("echo: %q, want %q", got, want)
		}
		if strings.Contains(output(g), "lost") {
			t.Error("input to a guest that did not run was echoed")
		}

		request(t, g, propolisapi.RequestReboot)
		if !strings.HasSuffix(output(g), "reboot: Restarting system\r\n"+string(firmwareLines())) {
			t.Errorf("a reboot's output: %q", output(g))
		}
		sleep(timings.RebootTime)
		if n := count(lines(output(g)), ready); n != 2 {
			t.Errorf("READY %d times after a reboot", n)
		}

		if err := g.NMI(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(output(g), "NMI received for unknown reason 30 on CPU 0.\r\n") {
			t.Errorf("an NMI's output: %q", output(g))
		}

		request(t, g, propolisapi.RequestStop)
		select {
		case <-g.Console().Notify(g.Console().End()):
			t.Error("the console ended before the guest stopped")
		default:
		}
		sleep(timings.StopTime)
		if !strings.HasSuffix(output(g), "reboot: Power down\r\n") {
			t.Errorf("a stop's output: %q", output(g))
		}
		select {
		case <-g.Console().Notify(g.Console().End()):
		default:
			t.Error("the console of a destroyed guest has not ended")
		}
	})
}

// The READY line names the NIC at the lowest PCI path, whatever its key;
// the sled's NICs, when given, are where its MAC comes from; a guest
// without a NIC says none.
func TestReadyMAC(t *testing.T) {
	withNICs := sled
	withNICs.NICs = map[string]net.HardwareAddr{nicA: mustMAC("02:00:00:00:00:0a"), nicB: mustMAC("02:00:00:00:00:0b")}
	two := specJSON(2, nic{"net0", nicA, spec.VNICName(mustMAC(macA)), 9}, nic{"net1", strings.ToUpper(nicB), spec.VNICName(mustMAC(macB)), 8})
	for _, c := range []struct {
		name string
		sled spec.Sled
		raw  []byte
		mac  string
	}{
		{"lowest slot", sled, two, macB},
		{"the sled's NICs", withNICs, two, "02:00:00:00:00:0b"},
		{"no NIC", sled, specJSON(1), NoMAC},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts := timings
				opts.Sled = c.sled
				g := New(opts)
				defer g.Close()
				if err := g.Ensure(context.Background(), props, c.raw); err != nil {
					t.Fatal(err)
				}
				request(t, g, propolisapi.RequestRun)
				time.Sleep(timings.BootTime)
				st := g.Wait(t.Context(), 2)
				// Running is never seen before the output that leads to it.
				if st.State != propolisapi.StateRunning || !strings.HasSuffix(output(g), "\r\n"+ReadyPrefix+c.mac+"\r\n") {
					t.Errorf("%s: %q", st.State, output(g))
				}
				if c.mac == NoMAC && strings.Contains(output(g), "eth0") {
					t.Errorf("a guest without a NIC has eth0: %q", output(g))
				}
			})
		})
	}
}

// NMI is nil whatever the guest's state; only a running guest speaks of
// it.
func TestNMIQuietUnlessRunning(t *testing.T) {
	g := newGuest(t, timings)
	if err := g.NMI(t.Context()); err != nil || output(g) != "" {
		t.Errorf("NMI to a creating guest: %v, output %q", err, output(g))
	}
}

package simguest

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

const (
	nicA = "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e01"
	nicB = "0b7e2c1d-3a4f-4e5d-8c6b-7a8f9e0d1c2b"
	macA = "a8:40:25:f0:00:07"
	macB = "a8:40:25:f0:00:08"
)

var props = propolisapi.Properties{ID: "4f1a7d4e-6a53-4d0c-9d57-5d6e4f1b2c01", Name: "sim", Description: "a simulated guest"}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func comp(typ string, c map[string]any) map[string]any {
	return map[string]any{"type": typ, "component": c}
}

func pci(dev int) map[string]any { return map[string]any{"bus": 0, "device": dev, "function": 0} }

// nic is one virtio NIC of a test spec.
type nic struct {
	key, id, vnic string
	slot          int
}

// specJSON is a spec as the agent sends one: a board of cpus, com1 and the
// NICs, each backend named after its MAC.
func specJSON(cpus int, nics ...nic) json.RawMessage {
	comps := map[string]any{"com1": comp("serial_port", map[string]any{"num": "com1"})}
	for _, n := range nics {
		comps[n.key] = comp("virtio_nic", map[string]any{"backend_id": n.key + "-backend", "interface_id": n.id, "pci_path": pci(n.slot)})
		comps[n.key+"-backend"] = comp("virtio_network_backend", map[string]any{"vnic_name": n.vnic})
	}
	doc := map[string]any{
		"board":      map[string]any{"cpus": cpus, "memory_mb": 256, "chipset": map[string]any{"type": "i440_fx", "value": map[string]any{"enable_pcie": false}}},
		"components": comps,
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
}

// oneNIC is a spec with NIC A at slot 8.
func oneNIC() json.RawMessage {
	return specJSON(2, nic{"net0", nicA, spec.VNICName(mustMAC(macA)), 8})
}

var sled = spec.Sled{Threads: 4}

var timings = Options{BootTime: 2 * time.Second, StopTime: time.Second, RebootTime: 3 * time.Second, Sled: sled}

// newGuest returns a guest with timings, ensured with oneNIC, closed at
// the test's end.
func newGuest(t *testing.T, opts Options) *Guest {
	t.Helper()
	g := New(opts)
	t.Cleanup(g.Close)
	if err := g.Ensure(t.Context(), props, oneNIC()); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return g
}

func status(g *Guest) propolisapi.Status {
	_, _, st, _ := g.Instance()
	return st
}

func wantStatus(t *testing.T, what string, g *Guest, want propolisapi.Status) {
	t.Helper()
	if got := status(g); got != want {
		t.Errorf("%s: status %+v, want %+v", what, got, want)
	}
}

func request(t *testing.T, g *Guest, r propolisapi.StateRequest) {
	t.Helper()
	if err := g.Request(t.Context(), r); err != nil {
		t.Fatalf("Request %s: %v", r, err)
	}
}

// sleep advances the bubble's clock by d and lets every timer that fired
// finish.
func sleep(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// The guest is Creating once ensured, boots for BootTime when asked to
// run, reboots for RebootTime, and stops for StopTime, after which it is
// Stopped and at once Destroyed.
func TestLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuest(t, timings)
		wantStatus(t, "ensured", g, propolisapi.Status{Gen: 1, State: propolisapi.StateCreating, Detail: detailWaiting})
		sleep(time.Hour)
		wantStatus(t, "an hour later", g, propolisapi.Status{Gen: 1, State: propolisapi.StateCreating, Detail: detailWaiting})

		request(t, g, propolisapi.RequestRun)
		wantStatus(t, "asked to run", g, propolisapi.Status{Gen: 2, State: propolisapi.StateStarting, Detail: detailBooting})
		sleep(2*time.Second - time.Millisecond)
		wantStatus(t, "just before BootTime", g, propolisapi.Status{Gen: 2, State: propolisapi.StateStarting, Detail: detailBooting})
		sleep(time.Millisecond)
		wantStatus(t, "after BootTime", g, propolisapi.Status{Gen: 3, State: propolisapi.StateRunning, Detail: detailRunning})

		request(t, g, propolisapi.RequestReboot)
		wantStatus(t, "asked to reboot", g, propolisapi.Status{Gen: 4, State: propolisapi.StateRebooting, Detail: detailRebooting})
		sleep(3*time.Second - time.Millisecond)
		wantStatus(t, "just before RebootTime", g, propolisapi.Status{Gen: 4, State: propolisapi.StateRebooting, Detail: detailRebooting})
		sleep(time.Millisecond)
		wantStatus(t, "after RebootTime", g, propolisapi.Status{Gen: 5, State: propolisapi.StateRunning, Detail: detailRunning})

		request(t, g, propolisapi.RequestStop)
		wantStatus(t, "asked to stop", g, propolisapi.Status{Gen: 6, State: propolisapi.StateStopping, Detail: "stop requested while running"})
		sleep(time.Second - time.Millisecond)
		wantStatus(t, "just before StopTime", g, propolisapi.Status{Gen: 6, State: propolisapi.StateStopping, Detail: "stop requested while running"})
		sleep(time.Millisecond)
		// Stopped was generation 7.
		wantStatus(t, "after StopTime", g, propolisapi.Status{Gen: 8, State: propolisapi.StateDestroyed, Detail: detailDestroyed})
		sleep(time.Hour)
		wantStatus(t, "an hour later", g, propolisapi.Status{Gen: 8, State: propolisapi.StateDestroyed, Detail: detailDestroyed})
	})
}

// Zero timings are the defaults.
func TestDefaultTimings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuest(t, Options{Sled: sled})
		start := time.Now()
		request(t, g, propolisapi.RequestRun)
		st := g.Wait(t.Context(), 2)
		if st.State != propolisapi.StateRunning || time.Since(start) != DefaultBootTime {
			t.Errorf("booted to %s after %s, want Running after %s", st.State, time.Since(start), DefaultBootTime)
		}
		start = time.Now()
		request(t, g, propolisapi.RequestReboot)
		if st := g.Wait(t.Context(), 4); st.State != propolisapi.StateRunning || time.Since(start) != DefaultRebootTime {
			t.Errorf("rebooted to %s after %s, want Running after %s", st.State, time.Since(start), DefaultRebootTime)
		}
		start = time.Now()
		request(t, g, propolisapi.RequestStop)
		if st := g.Wait(t.Context(), 6); st.State != propolisapi.StateDestroyed || time.Since(start) != DefaultStopTime {
			t.Errorf("stopped to %s after %s, want Destroyed after %s", st.State, time.Since(start), DefaultStopTime)
		}
	})
}

// A stop interrupts a boot or a reboot: the guest never runs again.
func TestStopInterrupts(t *testing.T) {
	for _, c := range []struct {
		name  string
		reach func(t *testing.T, g *Guest)
		was   string
	}{
		{"boot", func(t *testing.T, g *Guest) { request(t, g, propolisapi.RequestRun) }, "starting"},
		{"reboot", func(t *testing.T, g *Guest) {
			request(t, g, propolisapi.RequestRun)
			sleep(timings.BootTime)
			request(t, g, propolisapi.RequestReboot)
		}, "rebooting"},
		{"creating", func(t *testing.T, g *Guest) {}, "creating"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGuest(t, timings)
				c.reach(t, g)
				sleep(time.Second / 2)
				gen := status(g).Gen
				request(t, g, propolisapi.RequestStop)
				wantStatus(t, "asked to stop", g, propolisapi.Status{Gen: gen + 1, State: propolisapi.StateStopping, Detail: "stop requested while " + c.was})
				sleep(timings.StopTime)
				wantStatus(t, "stopped", g, propolisapi.Status{Gen: gen + 3, State: propolisapi.StateDestroyed, Detail: detailDestroyed})
				sleep(time.Hour)
				wantStatus(t, "an hour later", g, propolisapi.Status{Gen: gen + 3, State: propolisapi.StateDestroyed, Detail: detailDestroyed})
			})
		})
	}
}

// Every request from every state: taken, a no-op, or refused with
// upstream's reason and nothing changed.
func TestRequests(t *testing.T) {
	reach := map[propolisapi.InstanceState]func(t *testing.T, g *Guest){
		propolisapi.StateCreating: func(t *testing.T, g *Guest) {},
		propolisapi.StateStarting: func(t *testing.T, g *Guest) { request(t, g, propolisapi.RequestRun) },
		propolisapi.StateRunning: func(t *testing.T, g *Guest) {
			request(t, g, propolisapi.RequestRun)
			sleep(timings.BootTime)
		},
		propolisapi.StateRebooting: func(t *testing.T, g *Guest) {
			request(t, g, propolisapi.RequestRun)
			sleep(timings.BootTime)
			request(t, g, propolisapi.RequestReboot)
		},
		propolisapi.StateStopping: func(t *testing.T, g *Guest) { request(t, g, propolisapi.RequestStop) },
		propolisapi.StateDestroyed: func(t *testing.T, g *Guest) {
			request(t, g, propolisapi.RequestStop)
			sleep(timings.StopTime)
		},
	}
	const taken, noop = "taken", "no-op"
	for _, c := range []struct {
		from propolisapi.InstanceState
		r    propolisapi.StateRequest
		want string // taken, noop, or upstream's reason
		to   propolisapi.InstanceState
	}{
		{propolisapi.StateCreating, propolisapi.RequestRun, taken, propolisapi.StateStarting},
		{propolisapi.StateCreating, propolisapi.RequestReboot, "Operation requires an active instance", ""},
		{propolisapi.StateCreating, propolisapi.RequestStop, taken, propolisapi.StateStopping},
		{propolisapi.StateStarting, propolisapi.RequestRun, noop, ""},
		{propolisapi.StateStarting, propolisapi.RequestReboot, "Instance is currently starting", ""},
		{propolisapi.StateStarting, propolisapi.RequestStop, taken, propolisapi.StateStopping},
		{propolisapi.StateRunning, propolisapi.RequestRun, noop, ""},
		{propolisapi.StateRunning, propolisapi.RequestReboot, taken, propolisapi.StateRebooting},
		{propolisapi.StateRunning, propolisapi.RequestStop, taken, propolisapi.StateStopping},
		{propolisapi.StateRebooting, propolisapi.RequestRun, noop, ""},
		{propolisapi.StateRebooting, propolisapi.RequestReboot, noop, ""},
		{propolisapi.StateRebooting, propolisapi.RequestStop, taken, propolisapi.StateStopping},
		{propolisapi.StateStopping, propolisapi.RequestRun, "Instance is preparing to stop", ""},
		{propolisapi.StateStopping, propolisapi.RequestReboot, "Instance is preparing to stop", ""},
		{propolisapi.StateStopping, propolisapi.RequestStop, noop, ""},
		{propolisapi.StateDestroyed, propolisapi.RequestRun, "Instance has already halted", ""},
		{propolisapi.StateDestroyed, propolisapi.RequestReboot, "Instance has already halted", ""},
		{propolisapi.StateDestroyed, propolisapi.RequestStop, noop, ""},
	} {
		t.Run(string(c.from)+"/"+string(c.r), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGuest(t, timings)
				reach[c.from](t, g)
				before := status(g)
				if before.State != c.from {
					t.Fatalf("reached %s, not %s", before.State, c.from)
				}
				err := g.Request(t.Context(), c.r)
				after := status(g)
				switch c.want {
				case taken:
					if err != nil || after.State != c.to || after.Gen != before.Gen+1 {
						t.Errorf("%v, then %+v; want %s", err, after, c.to)
					}
				case noop:
					if err != nil || after != before {
						t.Errorf("%v, then %+v; want no change from %+v", err, after, before)
					}
				default:
					if !errors.Is(err, propolisapi.ErrInvalidTransition) || err.Error() != "instance state change not allowed: "+c.want {
						t.Errorf("error %v, want %q", err, c.want)
					}
					if after != before {
						t.Errorf("refused, yet %+v became %+v", before, after)
					}
				}
			})
		})
	}
}

// Ensure again with the same properties and spec (spaced otherwise)
// changes nothing; other ones conflict. Before Ensure there is nothing.
func TestEnsure(t *testing.T) {
	g := New(timings)
	defer g.Close()
	if _, _, _, ok := g.Instance(); ok {
		t.Error("an instance before Ensure")
	}
	if g.Console() != nil {
		t.Error("a console before Ensure")
	}
	if err := g.Request(t.Context(), propolisapi.RequestRun); !errors.Is(err, propolisapi.ErrInvalidTransition) {
		t.Errorf("Run before Ensure: %v", err)
	}
	raw := oneNIC()
	if err := g.Ensure(t.Context(), props, raw); err != nil {
		t.Fatal(err)
	}
	spaced := []byte(strings.ReplaceAll(string(raw), ",", " ,\n "))
	if err := g.Ensure(t.Context(), props, spaced); err != nil {
		t.Errorf("the same again: %v", err)
	}
	other := props
	other.Name = "other"
	if err := g.Ensure(t.Context(), other, raw); !errors.Is(err, propolisapi.ErrConflict) {
		t.Errorf("other properties: %v", err)
	}
	if err := g.Ensure(t.Context(), props, specJSON(1)); !errors.Is(err, propolisapi.ErrConflict) {
		t.Errorf("another spec: %v", err)
	}
	gotProps, gotRaw, st, ok := g.Instance()
	if !ok || gotProps != props || string(gotRaw) != string(raw) || st.Gen != 1 || st.State != propolisapi.StateCreating {
		t.Errorf("Instance = %+v %s %+v %v", gotProps, gotRaw, st, ok)
	}
}

// A spec the sled cannot realise is a *SpecError naming the problem, and
// leaves the guest as it was.
func TestEnsureRefusesBadSpec(t *testing.T) {
	withNICs := sled
	withNICs.NICs = map[string]net.HardwareAddr{nicB: mustMAC(macB)}
	for _, c := range []struct {
		name string
		sled spec.Sled
		raw  json.RawMessage
		want string
	}{
		{"too many CPUs", sled, specJSON(8), "board.cpus 8: this sled has 4 hardware threads"},
		{"not a spec", sled, json.RawMessage(`{"board":1}`), "not an InstanceSpec"},
		{"vnic_name not the agent's", sled, specJSON(1, nic{"net0", nicA, "vopte0", 8}), `vnic_name "vopte0" is not one this sled's agent made`},
		{"NIC not the sled's", withNICs, oneNIC(), `interface_id "` + nicA + `" names no NIC`},
		{"NIC at the host bridge", sled, specJSON(1, nic{"net0", nicA, spec.VNICName(mustMAC(macA)), 0}), "slot 0 is the host bridge"},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := timings
			opts.Sled = c.sled
			g := New(opts)
			defer g.Close()
			err := g.Ensure(t.Context(), props, c.raw)
			se, ok := errors.AsType[*propolisapi.SpecError](err)
			if !ok || !strings.Contains(se.Msg, c.want) {
				t.Errorf("Ensure: %v, want a SpecError with %q", err, c.want)
			}
			if _, _, _, ok := g.Instance(); ok {
				t.Error("a refused spec made an instance")
			}
			good := oneNIC()
			if c.sled.NICs != nil {
				good = specJSON(1, nic{"net0", nicB, "any", 8})
			}
			if err := g.Ensure(t.Context(), props, good); err != nil {
				t.Errorf("a good spec after a refusal: %v", err)
			}
		})
	}
}

// With Options.Running, Ensure leaves the guest Running.
func TestRunningOption(t *testing.T) {
	opts := timings
	opts.Running = true
	g := newGuest(t, opts)
	wantStatus(t, "ensured", g, propolisapi.Status{Gen: 2, State: propolisapi.StateRunning, Detail: detailResumed})
	if out := output(g); out != ReadyPrefix+macA+"\r\n" {
		t.Errorf("console %q", out)
	}
	if err := g.Request(t.Context(), propolisapi.RequestReboot); err != nil {
		t.Errorf("a resumed guest reboots: %v", err)
	}
}

// After Close, transitions in progress and later ones never complete;
// requests are still taken.
func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuest(t, timings)
		request(t, g, propolisapi.RequestRun)
		g.Close()
		sleep(time.Hour)
		wantStatus(t, "closed while booting", g, propolisapi.Status{Gen: 2, State: propolisapi.StateStarting, Detail: detailBooting})
		request(t, g, propolisapi.RequestStop)
		sleep(time.Hour)
		if st := status(g); st.State != propolisapi.StateStopping {
			t.Errorf("a stop after Close: %+v", st)
		}
	})
}

// Wait answers at once for a generation passed, when the next comes, or
// with the current status when its context ends.
func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuest(t, timings)
		if st := g.Wait(t.Context(), 0); st.Gen != 1 {
			t.Errorf("Wait(0) = %+v", st)
		}
		go func() {
			time.Sleep(time.Minute)
			g.Request(context.Background(), propolisapi.RequestRun)
		}()
		start := time.Now()
		if st := g.Wait(t.Context(), 1); st.Gen != 2 || time.Since(start) != time.Minute {
			t.Errorf("Wait(1) = %+v after %s", st, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		if st := g.Wait(ctx, 5); st.Gen != 2 || time.Since(start) != time.Second {
			t.Errorf("Wait(5) = %+v after %s, want generation 2 after 1s", st, time.Since(start))
		}
	})
}

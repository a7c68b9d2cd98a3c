package probes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/backoff"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// fakeZones records every call and holds the zones it made; failEnsure
// and failList script failures.
type fakeZones struct {
	mu         sync.Mutex
	calls      []string
	zones      map[string]Zone
	failEnsure map[string]error
	failList   error
}

var _ Zones = (*fakeZones)(nil)

func newFake(existing ...string) *fakeZones {
	f := &fakeZones{zones: map[string]Zone{}, failEnsure: map[string]error{}}
	for _, id := range existing {
		f.zones[id] = Zone{ID: id}
	}
	return f
}

func (f *fakeZones) List(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "list")
	if f.failList != nil {
		return nil, f.failList
	}
	var out []string
	for id := range f.zones {
		out = append(out, id)
	}
	return out, nil
}

func (f *fakeZones) Ensure(ctx context.Context, z Zone) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("ensure %s %v gw %v", z.ID, z.Addrs, z.Gateway))
	if err := f.failEnsure[z.ID]; err != nil {
		return err
	}
	f.zones[z.ID] = z
	return nil
}

func (f *fakeZones) Remove(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "remove "+id)
	delete(f.zones, id)
	return nil
}

func (f *fakeZones) Where(id string) (string, string) {
	return "/run/netns/" + ZoneName(id), "ozn-" + id[:4]
}

// take returns the calls since the last take.
func (f *fakeZones) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeZones) script(id string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failEnsure[id] = err
}

const (
	idA = "a0000000-0000-4000-8000-0000000000e1"
	idB = "b0000000-0000-4000-8000-0000000000e1"
)

func probe(id, ip string) told.Probe {
	return told.Probe{ID: id, Interface: told.NIC{ID: id, Kind: sledconfig.NICKind{Type: "probe", ID: id}, MAC: "A8:40:25:F0:00:0" + ip[len(ip)-1:],
		IPConfig: sledconfig.IPConfig{Type: "v4", Value: sledconfig.IPConfigValue{IP: ip, Subnet: "172.30.0.0/22"}}, VNI: 7777}}
}

// start runs r in the bubble until the test's end.
func start(t *testing.T, r *Reconciler) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// The set replaces the one before: added probes get a zone with their
// address alone and their gateway, removed ones lose it, kept ones are
// made again only as Ensure keeps what is right; a zone found there at the
// start is adopted.
func TestSetReplaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(idB) // B's zone outlived the agent
		r := New(Options{Zones: f, Resync: time.Hour})
		r.Set([]told.Probe{probe(idA, "172.30.0.9"), probe(idB, "172.30.0.8")})
		start(t, r)
		synctest.Wait()
		want := []string{"list", "ensure " + idA + " [172.30.0.9/32] gw 172.30.0.1", "ensure " + idB + " [172.30.0.8/32] gw 172.30.0.1"}
		if got := f.take(); !slices.Equal(got, want) {
			t.Fatalf("calls %q, want %q", got, want)
		}
		st := r.Status()
		if len(st.Probes) != 2 || st.Probes[0].State != "ready" || st.Probes[0].Adopted || !st.Probes[1].Adopted || st.Probes[1].Link != "ozn-b000" {
			t.Errorf("status %+v", st)
		}
		r.Set([]told.Probe{probe(idA, "172.30.0.9")})
		synctest.Wait()
		want = []string{"list", "ensure " + idA + " [172.30.0.9/32] gw 172.30.0.1", "remove " + idB}
		if got := f.take(); !slices.Equal(got, want) {
			t.Fatalf("calls %q, want %q", got, want)
		}
		if st := r.Status(); len(st.Probes) != 1 || st.Probes[0].ID != idA {
			t.Errorf("status after B left %+v", st)
		}
		r.Set(nil)
		synctest.Wait()
		if got := f.take(); !slices.Equal(got, []string{"list", "remove " + idA}) {
			t.Fatalf("calls %q", got)
		}
		if st := r.Status(); len(st.Probes) != 0 || st.Failures != 0 {
			t.Errorf("status after the empty set %+v", st)
		}
	})
}

// A failed pass is tried again after delays that double up to the cap,
// with its error in the status; a new set does not wait for the delay;
// once it succeeds the error goes.
func TestRetryIsCappedAndVisible(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		f.script(idA, errors.New("no namespace for you"))
		r := New(Options{Zones: f, Resync: time.Hour, Retry: backoff.Backoff{Initial: time.Second, Max: 4 * time.Second}})
		r.Set([]told.Probe{probe(idA, "172.30.0.9")})
		start(t, r)
		synctest.Wait()
		t0 := time.Now()
		var at []time.Duration
		for range 5 {
			f.take()
			st := r.Status()
			if st.Failures == 0 || st.NextRetry == nil || !strings.Contains(st.LastError, "no namespace for you") ||
				st.Probes[0].State != "failed" || st.Probes[0].Attempts != st.Failures {
				t.Fatalf("status after a failure %+v", st)
			}
			time.Sleep(st.NextRetry.Sub(time.Now()))
			synctest.Wait()
			at = append(at, time.Since(t0))
		}
		if want := []time.Duration{1, 3, 7, 11, 15}; !slices.EqualFunc(at, want, func(a, b time.Duration) bool { return a == b*time.Second }) {
			t.Errorf("retries at %v, want 1s 3s 7s 11s 15s (1, 2, 4, then the 4 s cap)", at)
		}
		f.take()
		f.script(idA, nil)
		r.Set([]told.Probe{probe(idA, "172.30.0.9")}) // at once, not at the next retry
		synctest.Wait()
		if got := f.take(); len(got) != 2 {
			t.Errorf("calls after the new set %q", got)
		}
		if st := r.Status(); st.Failures != 0 || st.LastError != "" || st.NextRetry != nil || st.Probes[0].State != "ready" || st.Probes[0].Attempts != 0 {
			t.Errorf("status after success %+v", st)
		}
	})
}

// A list that fails changes nothing and is tried again; a zone removed
// from outside is made again at the next resync.
func TestListFailureAndResync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		f.failList = errors.New("netlink says no")
		r := New(Options{Zones: f, Resync: time.Minute})
		r.Set([]told.Probe{probe(idA, "172.30.0.9")})
		start(t, r)
		synctest.Wait()
		if got := f.take(); !slices.Equal(got, []string{"list"}) {
			t.Fatalf("calls %q: nothing but the list", got)
		}
		if st := r.Status(); !strings.Contains(st.LastError, "netlink says no") {
			t.Errorf("status %+v", st)
		}
		f.mu.Lock()
		f.failList = nil
		f.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := f.take(); len(got) != 2 {
			t.Fatalf("calls after the retry %q", got)
		}
		f.mu.Lock()
		delete(f.zones, idA)
		f.mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := f.take(); !slices.Equal(got, []string{"list", "ensure " + idA + " [172.30.0.9/32] gw 172.30.0.1"}) {
			t.Fatalf("calls at the resync %q", got)
		}
	})
}

func TestZoneFor(t *testing.T) {
	p := probe(idA, "172.30.0.9")
	p.Interface.IPConfig = sledconfig.IPConfig{Type: "dual_stack", Value: sledconfig.IPConfigValue{
		V4: &sledconfig.PrivateIP{IP: "172.30.1.9", Subnet: "172.30.1.0/24"}, V6: &sledconfig.PrivateIP{IP: "fd77::9", Subnet: "fd77::/64"}}}
	z, err := ZoneFor(p)
	if err != nil || z.ID != idA || fmt.Sprint(z.Addrs) != "[172.30.1.9/32 fd77::9/128]" || z.Gateway.String() != "172.30.1.1" || z.MAC.String() != "a8:40:25:f0:00:09" {
		t.Errorf("ZoneFor = %+v, %v", z, err)
	}
	p.ID = "../../etc"
	if _, err := ZoneFor(p); err == nil {
		t.Error("ZoneFor took an id that is not a UUID")
	}
}

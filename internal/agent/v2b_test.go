package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
)

// The boundary table is what the routing daemon learned, as ddmd programs
// OPTE: per overlay prefix (host bits cleared) its endpoints, once each, in
// address order; where some have a metric above zero, only those.
func TestV2BFromTunnelRoutes(t *testing.T) {
	a, b := netip.MustParseAddr("fd00:99::1"), netip.MustParseAddr("fd00:99::2")
	route := func(p string, tep netip.Addr, metric uint64) ddm.TunnelRoute {
		return ddm.TunnelRoute{Nexthop: netip.MustParseAddr("fe80::1"), Origin: ddm.TunnelOrigin{OverlayPrefix: netip.MustParsePrefix(p), BoundaryAddr: tep, VNI: 99, Metric: metric}}
	}
	got := v2bFrom([]ddm.TunnelRoute{
		route("0.0.0.0/0", b, 0), route("0.0.0.0/0", a, 0), route("0.0.0.0/0", a, 0),
		route("198.51.100.7/24", a, 0), route("198.51.100.0/24", b, 5),
	})
	want := []mappings.Boundary{
		{Prefix: netip.MustParsePrefix("0.0.0.0/0"), TEPs: []mappings.TEP{{Addr: a, VNI: 99}, {Addr: b, VNI: 99}}},
		{Prefix: netip.MustParsePrefix("198.51.100.0/24"), TEPs: []mappings.TEP{{Addr: b, VNI: 99}}},
	}
	if !slices.EqualFunc(got, want, sameBoundary) {
		t.Errorf("v2b %+v, want %+v", got, want)
	}
}

type fakeTunnelEndpoints []ddm.TunnelRoute

func (f fakeTunnelEndpoints) TunnelEndpoints(context.Context) ([]ddm.TunnelRoute, error) {
	return f, nil
}

// fakeV2B records when it was given a table; it fails while down.
type fakeV2B struct {
	mu    sync.Mutex
	down  bool
	given []time.Time
}

func (f *fakeV2B) SetV2B(context.Context, []mappings.Boundary) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errors.New("data path down")
	}
	f.given = append(f.given, time.Now())
	return nil
}

func (f *fakeV2B) times() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.given)
}

// The boundary table is given every v2bPeriod, every second while the data
// path refuses it, and at once when the data path restarted, not at the
// next period: a restarted data path has no way out of the rack until then.
func TestKeepV2B(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := fakeTunnelEndpoints{{Origin: ddm.TunnelOrigin{OverlayPrefix: netip.MustParsePrefix("0.0.0.0/0"), BoundaryAddr: netip.MustParseAddr("fd00:99::1"), VNI: 99}}}
		dp := &fakeV2B{down: true}
		restarted := make(chan struct{}, 1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); keepV2B(ctx, slog.New(slog.DiscardHandler), src, dp, restarted) }()
		start := time.Now()

		time.Sleep(2500 * time.Millisecond)
		synctest.Wait()
		if got := dp.times(); len(got) != 0 {
			t.Fatalf("given %d times while the data path was down", len(got))
		}
		dp.mu.Lock()
		dp.down = false
		dp.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := dp.times(); len(got) != 1 || got[0].Sub(start) != 3*time.Second {
			t.Fatalf("given at %v after the start, want once, at the first retry after it came up (3s)", got)
		}

		time.Sleep(v2bPeriod / 2)
		at := time.Now()
		restarted <- struct{}{}
		synctest.Wait()
		if got := dp.times(); len(got) != 2 || !got[1].Equal(at) {
			t.Fatalf("given at %v, want again at once on the restart (%v)", got, at)
		}
		time.Sleep(v2bPeriod)
		synctest.Wait()
		if got := dp.times(); len(got) != 3 || got[2].Sub(got[1]) != v2bPeriod {
			t.Fatalf("given at %v, want again a period after the restart", got)
		}
		cancel()
		<-done
	})
}

package ntpzone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
)

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// chronyd that keeps exiting is started again after 1, 2, 4 … s, at most
// 30 s apart; a run of a minute or more starts the count again.
func TestSuperviseRestartsWithCappedBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		t0 := time.Now()
		var starts []time.Duration
		runs := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			supervise(ctx, testLog(t), func(ctx context.Context) error {
				starts = append(starts, time.Since(t0))
				runs++
				switch {
				case runs == 9: // a steady run
					time.Sleep(2 * time.Minute)
				case runs == 12:
					cancel()
					<-ctx.Done()
					return nil
				}
				return fmt.Errorf("chronyd exited (%d)", runs)
			})
		}()
		<-done
		s := time.Second
		want := []time.Duration{0, 1 * s, 3 * s, 7 * s, 15 * s, 31 * s, 61 * s, 91 * s, 121 * s,
			// after the steady run (121 s + 2 min): 1 s, then 2 s
			242 * s, 244 * s, 248 * s}
		if !slices.Equal(starts, want) {
			t.Errorf("starts at %v, want %v", starts, want)
		}
	})
}

// A supervisor stops at once when its ctx ends during a delay.
func TestSuperviseStopsDuringDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		n := 0
		supervise(ctx, testLog(t), func(context.Context) error { n++; return errors.New("exited") })
		if n != 4 { // at 0, 1, 3 and 7 s; the next would be at 15
			t.Errorf("%d runs, want 4", n)
		}
	})
}

// fakeLookup answers a name with scripted results, one per call; the last
// repeats.
type fakeLookup struct {
	mu      sync.Mutex
	answers map[string][]lookupAnswer
	calls   []string
}

type lookupAnswer struct {
	addrs []string
	err   error
}

func (f *fakeLookup) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	as := f.answers[name]
	a := as[0]
	if len(as) > 1 {
		f.answers[name] = as[1:]
	}
	var out []netip.Addr
	for _, s := range a.addrs {
		out = append(out, netip.MustParseAddr(s))
	}
	return out, a.err
}

// A boundary zone whose only servers are names starts chronyd once one
// resolves; names are looked up again on failure (1 s, 2 s …) and every
// 2 minutes once all resolve, and a name that fails keeps its addresses.
func TestFollowNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := errors.New("dns down")
		f := &fakeLookup{answers: map[string][]lookupAnswer{
			"a.test": {{err: down}, {err: down}, {addrs: []string{"fd00::a"}}, {err: down}, {addrs: []string{"fd00::a2"}}},
			"b.test": {{err: down}, {addrs: []string{"fd00::b"}}, {addrs: []string{"fd00::b"}}},
		}}
		info := zoneInfo{name: "oxz_ntp_x", kind: "boundary_ntp", names: []string{"a.test", "b.test"},
			base: chrony.Config{Kind: chrony.Boundary}}
		z := newZone(info, chrony.Binaries{}, testLog(t), f.lookup)
		select {
		case <-z.known:
			t.Fatal("servers known before any name resolved")
		default:
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go z.followNames(ctx)
		servers := func() []string {
			z.mu.Lock()
			defer z.mu.Unlock()
			var out []string
			for _, a := range z.servers {
				out = append(out, a.String())
			}
			return out
		}
		synctest.Wait()
		if s := servers(); len(s) != 0 {
			t.Fatalf("servers %v with every name failing", s)
		}
		if _, err := z.Tracking(ctx); !errors.Is(err, chrony.ErrNotRunning) || !strings.Contains(err.Error(), "no server of ntp_servers") {
			t.Errorf("Tracking before chronyd: %v", err)
		}
		time.Sleep(time.Second) // first retry: b resolves
		synctest.Wait()
		if s := servers(); !slices.Equal(s, []string{"fd00::b"}) {
			t.Fatalf("servers %v, want b's", s)
		}
		select {
		case <-z.known:
		default:
			t.Fatal("servers not known once one resolved")
		}
		time.Sleep(2 * time.Second) // second retry: a resolves too
		synctest.Wait()
		if s := servers(); !slices.Equal(s, []string{"fd00::a", "fd00::b"}) {
			t.Fatalf("servers %v, want a's and b's", s)
		}
		time.Sleep(2 * time.Minute) // refresh: a fails, keeps its address
		synctest.Wait()
		if s := servers(); !slices.Equal(s, []string{"fd00::a", "fd00::b"}) {
			t.Fatalf("servers %v after a failed, want a's kept", s)
		}
		time.Sleep(time.Second) // retry: a moved
		synctest.Wait()
		if s := servers(); !slices.Equal(s, []string{"fd00::a2", "fd00::b"}) {
			t.Fatalf("servers %v, want a's new address", s)
		}
		if n := len(f.calls); n != 10 {
			t.Errorf("%d lookups %v, want 10", n, f.calls)
		}
		cancel()
	})
}

// Before chronyd is started, ntp-admin answers 500 saying why.
func TestTimesyncBeforeChronyd(t *testing.T) {
	z := newZone(zoneInfo{base: chrony.Config{Kind: chrony.Boundary}}, chrony.Binaries{}, testLog(t), nil)
	z.setWhy("no server of ntp_servers is an address or resolved yet")
	srv := httptest.NewServer(timesync.NewHandler(z, timesync.HandlerOptions{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/timesync")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "chronyd not started: no server of ntp_servers") {
		t.Errorf("GET /timesync = %s %s, want 500 saying why", resp.Status, body)
	}
	if _, err := z.Tracking(t.Context()); err == nil || !strings.Contains(err.Error(), "chronyd not started: no server of ntp_servers") {
		t.Errorf("Tracking = %v", err)
	}
}

package sim

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/timesync"
)

// The simulated machine's NTP zones: a running one answers ntp-admin's
// GET /timesync (internal/timesync's handler, over a transport that never
// touches the network) as a chronyd synchronized to a stratum-2 peer does,
// at once; the fault map's "timesync": {"synced": false} holds it
// unsynchronized (chronyd before its first update) until it says true.

// TimeSyncFaults is the time-sync part of the fault map.
type TimeSyncFaults struct {
	// Synced false holds the NTP zones unsynchronized; absent or true:
	// they are synchronized as soon as they run.
	Synced *bool `json:"synced,omitempty" doc:"false holds the NTP zones unsynchronized; absent or true: synchronized once they run."`
}

// unsyncedLine is what chronyc -c tracking says before chronyd's first
// update (recorded from chrony 4.3).
const unsyncedLine = "00000000,,0,0.000000000,0.000000000,0.000000000,0.000000000,0.000,0.000,0.000,1.000000000,1.000000000,0.0,Not synchronised"

// tracking is chronyc -c tracking of the simulated NTP zones.
func (r *Runtime) tracking(context.Context) (string, error) {
	r.mu.Lock()
	held := r.timeHeld
	r.mu.Unlock()
	if held {
		return unsyncedLine, nil
	}
	now := time.Now()
	return fmt.Sprintf("C0000201,192.0.2.1,2,%d.%09d,0.000000120,0.000000080,0.000000150,1.250,0.000,0.020,0.000250000,0.000120000,64.0,Normal",
		now.Unix(), now.Nanosecond()), nil
}

type trackerFunc func(context.Context) (string, error)

func (f trackerFunc) Tracking(ctx context.Context) (string, error) { return f(ctx) }

// NTPAdmin returns the transport to the simulated NTP zones' ntp-admin:
// a request to [addr]:10123 is answered by the zone zoneAt names for addr
// if that zone runs, and refused otherwise, as a real connection would be.
func (r *Runtime) NTPAdmin(zoneAt func(netip.Addr) (name string, ok bool)) http.RoundTripper {
	return &ntpAdmin{r: r, zoneAt: zoneAt, h: timesync.NewHandler(trackerFunc(r.tracking), timesync.HandlerOptions{})}
}

type ntpAdmin struct {
	r      *Runtime
	zoneAt func(netip.Addr) (string, bool)
	h      http.Handler
}

func (t *ntpAdmin) RoundTrip(req *http.Request) (*http.Response, error) {
	ap, err := netip.ParseAddrPort(req.URL.Host)
	if err != nil {
		return nil, fmt.Errorf("sim ntp-admin: %w", err)
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	name, ok := t.zoneAt(ap.Addr().Unmap())
	if !ok || ap.Port() != timesync.AdminPort || !t.r.running(name) {
		return nil, refused
	}
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, req)
	return rec.Result(), nil
}

// running reports whether the named zone runs.
func (r *Runtime) running(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	z, ok := r.zones[name]
	return ok && z.running
}

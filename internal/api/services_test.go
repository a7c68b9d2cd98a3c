package api

import (
	"testing"

	"github.com/sled-agent/sled-agent/internal/reconciler"
)

// Which zones' services are reported as enabled but not online, and how.
func TestNotOnlineState(t *testing.T) {
	failing := reconciler.Health{State: reconciler.HealthFailing, Failures: 2}
	for _, c := range []struct {
		name string
		z    reconciler.ZoneStatus
		want string
	}{
		{"starting", reconciler.ZoneStatus{Wanted: true, Exists: true, State: reconciler.StateStarting}, "offline"},
		{"failed", reconciler.ZoneStatus{Wanted: true, Exists: true, State: reconciler.StateFailed}, "maintenance"},
		{"waiting, something of it left", reconciler.ZoneStatus{Wanted: true, Exists: true, State: reconciler.StateWaiting}, "offline"},
		{"waiting, not yet created", reconciler.ZoneStatus{Wanted: true, State: reconciler.StateWaiting}, ""},
		{"running, failing health checks", reconciler.ZoneStatus{Wanted: true, Exists: true, State: reconciler.StateRunning, Health: failing}, "degraded"},
		{"running and healthy", reconciler.ZoneStatus{Wanted: true, Exists: true, State: reconciler.StateRunning, Health: reconciler.Health{State: reconciler.HealthOK}}, ""},
		{"failed and gone", reconciler.ZoneStatus{Wanted: true, State: reconciler.StateFailed}, ""},
		{"pending, not yet created", reconciler.ZoneStatus{Wanted: true, State: reconciler.StatePending}, ""},
		{"being removed", reconciler.ZoneStatus{Exists: true, State: reconciler.StateStopping}, ""},
		{"unmanaged", reconciler.ZoneStatus{Exists: true, State: reconciler.StateUnmanaged}, ""},
	} {
		if got := notOnlineState(&c.z); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	got := servicesNotOnline([]reconciler.ZoneStatus{
		{Name: "oxz_crucible_a", Kind: "crucible", Wanted: true, Exists: true, State: reconciler.StateStarting},
		{Name: "oxz_ntp_b", Kind: "internal_ntp", Wanted: true, Exists: true, State: reconciler.StateRunning},
	})
	if len(got) != 1 || got[0] != (SvcEnabledNotOnline{FMRI: "svc:/oxide/crucible:default", Zone: "oxz_crucible_a", State: "offline"}) {
		t.Errorf("services not online: %+v", got)
	}
}

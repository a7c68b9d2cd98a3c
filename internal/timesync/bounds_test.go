package timesync

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/httpbound/httpboundtest"
)

// ntp-admin takes no body: one announced over the limit is a 413 at once,
// and one that stops coming is cut at its deadline.
func TestAdminBodiesAreBounded(t *testing.T) {
	const d = 100 * time.Millisecond
	srv := httptest.NewServer(NewHandler(&fakeTracker{line: recSyncedV4}, HandlerOptions{BodyReadTimeout: d}))
	t.Cleanup(srv.Close)
	rt := httpbound.Route{MaxBodyBytes: httpbound.SmallBody, ReadTimeout: d}
	for _, op := range []httpboundtest.Op{
		{Method: http.MethodGet, Path: "/timesync", Route: rt},
		{Method: http.MethodPut, Path: "/timesync", Route: rt},
		{Method: http.MethodGet, Path: "/elsewhere", Route: rt},
	} {
		t.Run(op.Method+" "+op.Path, func(t *testing.T) { httpboundtest.Check(t, srv.Listener.Addr().String(), op) })
	}
}

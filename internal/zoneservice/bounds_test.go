package zoneservice

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/httpbound/httpboundtest"
)

// No request to a zone's service takes a body: one announced over the
// limit is a 413 at once, and one that stops coming is cut at its deadline.
func TestBodiesAreBounded(t *testing.T) {
	rt := httpbound.Route{MaxBodyBytes: httpbound.SmallBody, ReadTimeout: 100 * time.Millisecond}
	srv := httptest.NewServer(handler([]byte(`{}`), rt))
	t.Cleanup(srv.Close)
	for _, op := range []httpboundtest.Op{
		{Method: http.MethodGet, Path: "/health", Route: rt},
		{Method: http.MethodPut, Path: "/health", Route: rt},
		{Method: http.MethodGet, Path: "/elsewhere", Route: rt},
	} {
		t.Run(op.Method+" "+op.Path, func(t *testing.T) { httpboundtest.Check(t, srv.Listener.Addr().String(), op) })
	}
}

package propolisapi_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/httpbound/httpboundtest"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/propolisapi/propolisapitest"
)

// Every operation bounds its body: a Content-Length over its limit is a 413
// at once, and a body that stops coming is cut at its deadline.
func TestEveryOperationIsBounded(t *testing.T) {
	srv := httptest.NewServer(propolisapi.NewHandlerReadTimeout(propolisapitest.New(1024), nil, 100*time.Millisecond))
	t.Cleanup(srv.Close)
	// The operations that read a JSON body before anything else.
	reads := map[string]bool{
		"PUT /instance": true, "GET /instance/state-monitor": true,
		"PUT /instance/state": true, "PUT /instance/disk/{id}/vcr": true,
	}
	ops := propolisapi.Operations()
	if len(ops) < 12 {
		t.Fatalf("%d operations, want every one of the API's", len(ops))
	}
	fill := strings.NewReplacer("{migration_id}", "8d1b1f0e-6a5c-4e0b-9f0a-2b3c4d5e6f70", "{id}", "8d1b1f0e-6a5c-4e0b-9f0a-2b3c4d5e6f71", "{snapshot_id}", "8d1b1f0e-6a5c-4e0b-9f0a-2b3c4d5e6f72")
	for _, op := range ops {
		t.Run(op.Method+" "+op.Path, func(t *testing.T) {
			httpboundtest.Check(t, srv.Listener.Addr().String(), httpboundtest.Op{
				Method: op.Method, Path: fill.Replace(op.Path), Route: op.Bounds,
				Header:    map[string]string{"api-version": propolisapi.APIVersion},
				ReadsBody: reads[op.Method+" "+op.Path],
			})
		})
	}
}

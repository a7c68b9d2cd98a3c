package service_test

import (
	"net/http"
	"testing"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/httpbound/httpboundtest"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
)

// The service bounds every body, its health's as its API's: a Content-Length
// over the limit is a 413 at once. (The API's deadlines are
// propolisapi's TestEveryOperationIsBounded.)
func TestBodiesAreBounded(t *testing.T) {
	e := start(t)
	ops := []httpboundtest.Op{
		{Method: http.MethodGet, Path: "/health", Route: httpbound.Small},
		{Method: http.MethodPut, Path: "/health", Route: httpbound.Small},
	}
	for _, op := range propolisapi.Operations() {
		if op.Path == "/instance" || op.Path == "/instance/state" {
			ops = append(ops, httpboundtest.Op{Method: op.Method, Path: op.Path, Route: op.Bounds,
				Header: map[string]string{"api-version": propolisapi.APIVersion}})
		}
	}
	for _, op := range ops {
		t.Run(op.Method+" "+op.Path, func(t *testing.T) { httpboundtest.CheckTooLarge(t, e.addr, op) })
	}
}

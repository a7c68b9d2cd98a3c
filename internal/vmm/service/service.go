// Package service is the VMM service, what a VMM's zone runs:
// propolis-server 6.0.0's API, and 5.0.0's (internal/propolisapi), over a backend that is
// the guest (a simulated one, internal/vmm/simguest, or a QEMU machine,
// internal/vmm/qemuvm), and the health report the Linux runtime's readiness
// check reads (GET /health, as internal/zoneservice answers it).
package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// ZoneKind is the kind a VMM zone's service reports in its health.
const ZoneKind = "propolis-server"

// ZoneName is the name of the zone of the VMM propolisID,
// oxz_propolis-server_<id>, as upstream names it.
func ZoneName(propolisID string) string {
	return zone.VMMNamePrefix + strings.ToLower(propolisID)
}

// health is the body of GET /health: what zoneservice.Get reads, plus the
// status field of a propolis-style health answer.
type health struct {
	Status string `json:"status"`
	zoneservice.Health
}

// Health is the body of GET /health of the service of the VMM propolisID,
// a UUID in its 36-character form (it names the zone), started now by
// this process.
func Health(propolisID string) ([]byte, error) {
	if _, err := uuid.Parse(propolisID); err != nil || len(propolisID) != 36 {
		return nil, fmt.Errorf("vmm service: propolis id %q is not a UUID", propolisID)
	}
	return json.Marshal(health{Status: "ok", Health: zoneservice.Health{
		Zone:      ZoneName(propolisID),
		ID:        propolisID,
		Kind:      ZoneKind,
		PID:       os.Getpid(),
		StartedAt: time.Now().UTC(),
	}})
}

// shutdownTimeout bounds the graceful shutdown once ctx ends. Long polls
// and serial consoles end with ctx, so only short requests remain by then.
const shutdownTimeout = 2 * time.Second

// Serve serves backend's API and health (a body made by Health) on ln,
// which it closes, until ctx ends; then it shuts down gracefully within a
// short bound. It returns nil after a shutdown caused by ctx. The backend
// is the caller's: Serve neither stops nor closes it.
func Serve(ctx context.Context, ln net.Listener, backend propolisapi.Backend, health []byte, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Headers, bodies (per operation) and idle connections have deadlines
	// and the connections a cap, but there is no WriteTimeout: it would
	// have to outlast the longest long poll.
	srv := httpbound.NewServer(handler(backend, health, log))
	// Requests live in ctx: when it ends, state monitors answer and
	// serial consoles close at once (Shutdown does not wait for an
	// upgraded connection), and Shutdown has only short requests to wait
	// for.
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	capped := httpbound.Listener(ln, httpbound.MaxConns(), log)
	log.Info("vmm service serving", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(capped) }()
	select {
	case err := <-errc:
		return fmt.Errorf("vmm service on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		err = errors.Join(fmt.Errorf("vmm service: graceful shutdown: %w", err), srv.Close())
	}
	<-errc // Serve returns ErrServerClosed at once after Shutdown or Close
	log.Info("vmm service stopped serving")
	return err
}

// bounded is a /health handler behind httpbound.Small: it takes no body.
func bounded(h http.HandlerFunc) http.Handler {
	return httpbound.Small.Handler(h, func(w http.ResponseWriter, status int, msg string) {
		body, _ := json.Marshal(map[string]string{"request_id": uuid.NewString(), "message": msg})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body)
	})
}

// handler is GET /health beside the API, which answers everything else.
func handler(backend propolisapi.Backend, health []byte, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /health", bounded(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(health)
	}))
	mux.Handle("/health", bounded(func(w http.ResponseWriter, r *http.Request) {
		id := uuid.NewString()
		body, _ := json.Marshal(map[string]string{"request_id": id, "message": "Method Not Allowed"})
		w.Header().Set("x-request-id", id)
		w.Header().Set("Allow", "GET, HEAD")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		w.Write(body)
	}))
	mux.Handle("/", propolisapi.NewHandler(backend, log))
	return mux
}

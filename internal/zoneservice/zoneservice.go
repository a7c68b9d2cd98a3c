// Package zoneservice is the default zone image: a small HTTP service that
// plays a zone's service on Linux, and the health check the agent runs
// against it.
package zoneservice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// Info names the zone the service runs for.
type Info struct {
	Name string // zone name, oxz_<kind-prefix>_<uuid>
	ID   string // zone UUID
	Kind string // zone kind, as in the sled config
}

// Health is the body of GET /health.
type Health struct {
	Zone      string    `json:"zone"`
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
}

// shutdownTimeout bounds the graceful shutdown once ctx ends.
const shutdownTimeout = 5 * time.Second

// defaultCheckTimeout bounds Check when its ctx has no deadline.
const defaultCheckTimeout = 10 * time.Second

// Serve listens on the TCP address listen and serves the zone's health until
// ctx ends, then shuts down gracefully within a deadline. It returns nil after
// a shutdown caused by ctx.
func Serve(ctx context.Context, listen string, info Info) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		return fmt.Errorf("zone service: %w", err)
	}
	return ServeListener(ctx, ln, info)
}

// ServeListener is Serve on a listener the caller opened (tests listen on
// port 0). It closes ln.
func ServeListener(ctx context.Context, ln net.Listener, info Info) error {
	h := Health{Zone: info.Name, ID: info.ID, Kind: info.Kind, PID: os.Getpid(), StartedAt: time.Now().UTC()}
	body, err := json.Marshal(h)
	if err != nil {
		ln.Close()
		return fmt.Errorf("zone service: %w", err)
	}
	return ServeHandler(ctx, ln, handler(body, httpbound.Small), "zone service")
}

// ServeHandler serves h on ln (which it closes) until ctx ends, then shuts
// down gracefully within a deadline, with the bounds every server in a
// zone has (httpbound: header and idle deadlines, a connection cap; h
// bounds its bodies). It returns nil after a shutdown caused by ctx; what
// names the server in errors.
func ServeHandler(ctx context.Context, ln net.Listener, h http.Handler, what string) error {
	srv := httpbound.NewServer(h)
	// The answers are small and never wait: a write that takes longer
	// is a client not reading.
	srv.WriteTimeout = 10 * time.Second
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(httpbound.Listener(ln, httpbound.MaxConns(), nil)) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s on %s: %w", what, ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		err = errors.Join(fmt.Errorf("%s: graceful shutdown: %w", what, err), srv.Close())
	}
	<-errc // Serve returns ErrServerClosed at once after Shutdown or Close
	return err
}

// handler answers GET /health with health; no request takes a body (rt
// bounds it).
func handler(health []byte, rt httpbound.Route) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(health)
	})
	return rt.Handler(mux, func(w http.ResponseWriter, status int, msg string) { http.Error(w, msg, status) })
}

// client does not keep connections: a health check every few seconds to each
// of many zones would otherwise hold idle sockets, and no proxy from the
// environment stands between the agent and its zones.
var client = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{}).DialContext,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Check asks the zone service at addr (host:port; an IPv6 host in brackets)
// for its health: nil when it answers 200 with a health body. It waits no
// longer than ctx allows, and no longer than 10 seconds when ctx has no
// deadline.
func Check(ctx context.Context, addr string) error {
	_, err := Get(ctx, addr)
	return err
}

// Get is Check returning what the service says about itself, so the agent
// can tell that the zone that answers is the one it expects.
func Get(ctx context.Context, addr string) (Health, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultCheckTimeout)
		defer cancel()
	}
	url := "http://" + addr + "/health"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Health{}, fmt.Errorf("health check %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Health{}, fmt.Errorf("health check: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Health{}, fmt.Errorf("health check %s: reading the answer: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Health{}, fmt.Errorf("health check %s: %s: %q", url, resp.Status, snippet(b))
	}
	var h Health
	if err := json.Unmarshal(b, &h); err != nil {
		return Health{}, fmt.Errorf("health check %s: answer is not a health report: %w", url, err)
	}
	return h, nil
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

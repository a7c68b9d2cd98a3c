package zoneservice

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

var testInfo = Info{Name: "oxz_ntp_3c3a8e4b-6d4f-4c6e-9a51-2c0f3e2b9a11", ID: "3c3a8e4b-6d4f-4c6e-9a51-2c0f3e2b9a11", Kind: "internal_ntp"}

// serve runs the service on a free loopback port and returns its address
// and the channel Serve's result arrives on.
func serve(t *testing.T, ctx context.Context) (string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ServeListener(ctx, ln, testInfo) }()
	return ln.Addr().String(), done
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestHealth(t *testing.T) {
	ctx, stop := context.WithCancel(testCtx(t))
	defer stop()
	addr, done := serve(t, ctx)
	if err := Check(testCtx(t), addr); err != nil {
		t.Fatalf("Check: %v", err)
	}
	h, err := Get(testCtx(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	if h.Zone != testInfo.Name || h.ID != testInfo.ID || h.Kind != testInfo.Kind || h.PID != os.Getpid() {
		t.Errorf("health %+v, want %+v and pid %d", h, testInfo, os.Getpid())
	}
	if d := time.Since(h.StartedAt); d < 0 || d > time.Minute {
		t.Errorf("started_at %v, want just now", h.StartedAt)
	}

	// The wire format has the names the agent and operators read.
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	err = json.NewDecoder(resp.Body).Decode(&raw)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"zone", "id", "kind", "pid", "started_at"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("health JSON %v lacks %q", raw, k)
		}
	}

	for _, path := range []string{"/other", "/", "/health/x"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, resp.StatusCode)
		}
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its ctx was cancelled")
	}
	if err := Check(testCtx(t), addr); err == nil {
		t.Error("Check succeeded after the service stopped")
	}
}

func TestCheckErrors(t *testing.T) {
	// A closed port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if err := Check(testCtx(t), closed); err == nil {
		t.Error("Check against a closed port succeeded")
	}

	// Something that is not the zone service.
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not here", http.StatusServiceUnavailable)
	})}
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	err = Check(testCtx(t), ln.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "not here") {
		t.Errorf("Check against a 503 = %v, want an error naming the status and body", err)
	}

	// A service that never answers: the ctx deadline ends the wait.
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := Check(ctx, hang.Addr().String()); err == nil {
		t.Error("Check against a silent listener succeeded")
	}
}

func TestServeBadAddress(t *testing.T) {
	if err := Serve(testCtx(t), "256.0.0.1:1", testInfo); err == nil {
		t.Error("Serve on a bad address succeeded")
	}
}

func TestServeCancelledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, done := serve(t, ctx)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve with a cancelled ctx did not return")
	}
}

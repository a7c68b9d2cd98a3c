package linux_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// standInIfAsked plays, for TestMain, what these tests run that is not the
// agent: "tcp-listen ADDR" is a plain TCP service (it accepts connections
// and closes them, and speaks no HTTP), "zone-probe ADDR" a readiness
// command that succeeds only inside the zone's namespace, where underlay0
// is, and when ADDR accepts connections.
func standInIfAsked() {
	if len(os.Args) != 3 {
		return
	}
	switch os.Args[1] {
	case "tcp-listen":
		ln, err := net.Listen("tcp", os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			c.Close()
		}
	case "zone-probe":
		if _, err := net.InterfaceByName("underlay0"); err != nil {
			fmt.Fprintln(os.Stderr, "not in the zone:", err)
			os.Exit(1)
		}
		c, err := net.DialTimeout("tcp", os.Args[2], time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c.Close()
		// Not os.Exit: with the race detector, that waits a second for
		// the other threads, as long as the whole check may take.
		syscall.Exit(0)
	}
}

// progress collects what a runtime call reports while it waits.
type progress struct {
	mu   sync.Mutex
	said []string
}

func (p *progress) ctx(ctx context.Context) context.Context {
	return zone.WithProgress(ctx, func(s string) {
		p.mu.Lock()
		p.said = append(p.said, s)
		p.mu.Unlock()
	})
}

func (p *progress) has(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.said {
		if m == s {
			return true
		}
	}
	return false
}

// A zone whose image is a plain TCP service, not the agent's, is ready
// once the service accepts connections: images that are not the agent's
// are ready on a TCP connect unless they say otherwise.
func TestPlainTCPServiceIsReady(t *testing.T) {
	e := newEnv(t, map[string]linux.Image{"crucible": {Command: []string{"{agent}", "tcp-listen", "{listen}"}}})
	s := spec(8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.rt.Ensure(ctx, s); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), startTimeout)
	defer hcancel()
	if err := e.rt.Healthy(hctx, s); err != nil {
		t.Errorf("Healthy: %v", err)
	}
}

// While a zone waits for readiness it says what it waits for and the last
// answer, and the error at the deadline says the same.
func TestReadinessWaitSaysWhatItWaitsFor(t *testing.T) {
	e := newEnv(t, map[string]linux.Image{
		"crucible": {Command: []string{"{agent}", "never-ready"}},
		// The agent's zone service answers /health, not /healthz: 404,
		// like a service whose health is elsewhere.
		"clickhouse": {
			Command: []string{"{agent}", "zone-service", "--listen", "{listen}", "--zone", "{name}", "--id", "{id}", "--kind", "{kind}"},
			Ready:   linux.Ready{HTTP: &linux.HTTPReady{Path: "/healthz"}},
		},
	})
	never := spec(9)
	wrongPath := spec(10)
	wrongPath.Config.ZoneType.Type = "clickhouse"
	wrongPath = zone.SpecFor(&wrongPath.Config)
	for _, c := range []struct {
		s    zone.Spec
		want string
	}{
		{never, "waiting for tcp [fd00:1122:3344:109::5]:32345: connection refused"},
		{wrongPath, "waiting for http GET [fd00:1122:3344:10a::5]:32345/healthz: status 404, want 200"},
	} {
		var p progress
		ctx, cancel := context.WithTimeout(p.ctx(context.Background()), 3*time.Second)
		err := e.rt.Ensure(ctx, c.s)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Ensure = %v, want a deadline error saying %q", c.s.Config.ZoneType.Type, err, c.want)
		}
		if !p.has(c.want) {
			t.Errorf("%s: progress %q, want %q", c.s.Config.ZoneType.Type, p.said, c.want)
		}
		hctx, hcancel := context.WithTimeout(context.Background(), startTimeout)
		err = e.rt.Healthy(hctx, c.s)
		hcancel()
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(c.want, "waiting for ")) {
			t.Errorf("%s: Healthy = %v, want %q", c.s.Config.ZoneType.Type, err, c.want)
		}
	}
}

// A readiness command runs in the zone's network namespace, with the
// image's placeholders filled in.
func TestReadinessCommandRunsInTheZone(t *testing.T) {
	e := newEnv(t, map[string]linux.Image{"crucible": {
		Command: []string{"{agent}", "tcp-listen", "{listen}"},
		Ready:   linux.Ready{Command: []string{"{agent}", "zone-probe", "{listen}"}},
	}})
	s := spec(11)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.rt.Ensure(ctx, s); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), startTimeout)
	defer hcancel()
	if err := e.rt.Healthy(hctx, s); err != nil {
		t.Errorf("Healthy: %v", err)
	}
}

// Package agenttest runs an agent in a test's process, as the tests of the
// packages around the agent (the operator commands, the examples) need
// one.
package agenttest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// StopDeadline bounds how long a stopped agent may take to return.
const StopDeadline = 20 * time.Second

// Run builds an agent from cfg, logging to the test's output, and runs it
// until the test ends; a Run that fails, or does not return within
// StopDeadline of being stopped, fails the test.
func Run(t testing.TB, cfg agent.Config) *agent.Agent {
	t.Helper()
	a, err := agent.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(StopDeadline):
			t.Errorf("Run did not return within %s of its context being cancelled", StopDeadline)
		}
	})
	return a
}

package zoneservice

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

func TestPollerPauses(t *testing.T) {
	p := NewPoller(time.Second)
	var got []time.Duration
	for range 6 {
		got = append(got, p.Pause())
	}
	want := []time.Duration{10, 20, 40, 80, 100, 100}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("pauses = %v, want %v ms", got, want)
		}
	}
}

// A service that accepts connections but never answers makes each check
// time out, and each timeout doubles the next check's, up to the maximum.
func TestPollerTimeoutGrows(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn // never answered; closed with the listener's test
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	p := NewPoller(150 * time.Millisecond)
	for _, want := range []time.Duration{50, 100, 150, 150} {
		t0 := time.Now()
		err := p.Check(testCtx(t), ln.Addr().String())
		took := time.Since(t0)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Check = %v, want a deadline error", err)
		}
		// Only a lower bound: a shared machine may be slow, never fast.
		if took < want*time.Millisecond {
			t.Fatalf("check gave up after %v, want at least %v ms", took, want)
		}
	}
}

func TestPollerAnswers(t *testing.T) {
	ctx, stop := context.WithCancel(testCtx(t))
	defer stop()
	addr, _ := serve(t, ctx)
	if err := NewPoller(time.Second).Check(ctx, addr); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

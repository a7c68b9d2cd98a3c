package zoneservice

import (
	"context"
	"errors"
	"time"
)

// Poller health-checks a service that is starting, on the schedule the zone
// runtime waits for readiness on (and the zone benchmark's floor too, so
// that both wait alike). Checks start impatient: a connection attempt made
// while a zone's new links are still settling can lose its first SYN, and
// waiting out TCP's one-second retransmission is slower than trying again.
// A check that times out doubles the next one's timeout, up to MaxTimeout.
// The pause between checks doubles from 10 ms to 100 ms.
type Poller struct {
	timeout, maxTimeout, delay time.Duration
}

// NewPoller returns a Poller whose checks time out after at most maxTimeout.
func NewPoller(maxTimeout time.Duration) *Poller {
	return &Poller{timeout: min(50*time.Millisecond, maxTimeout), maxTimeout: maxTimeout, delay: 10 * time.Millisecond}
}

// Check checks the zone service at addr once.
func (p *Poller) Check(ctx context.Context, addr string) error {
	return p.Run(ctx, func(ctx context.Context) error { return Check(ctx, addr) })
}

// Run runs one check of any kind (the zone runtime's readiness checks: a TCP
// connect, an HTTP GET) under this check's timeout.
func (p *Poller) Run(ctx context.Context, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	err := check(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		p.timeout = min(2*p.timeout, p.maxTimeout)
	}
	return err
}

// Pause returns how long to wait before the next check.
func (p *Poller) Pause() time.Duration {
	d := p.delay
	p.delay = min(2*p.delay, 100*time.Millisecond)
	return d
}

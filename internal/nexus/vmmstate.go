package nexus

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/backoff"
)

// VMMs is what the Publisher needs of Nexus (*Client).
type VMMs interface {
	PutVMM(ctx context.Context, propolisID string, st SledVmmState) error
}

// PublisherOptions tune a Publisher; zero values are the defaults.
type PublisherOptions struct {
	// Retry is the wait after consecutive transient failures of one VMM's
	// state (default 250 ms doubling up to 4 s: with the request deadline,
	// a state reaches a Nexus that comes back within 10 s).
	Retry backoff.Backoff
	// Parallel caps the requests in flight at once, over all VMMs
	// (default 16).
	Parallel int
	Log      *slog.Logger
}

// Delivery is where one VMM's state stands with Nexus, for people.
type Delivery struct {
	PropolisID string `json:"propolis_id"`
	// Latest is the newest state the VMM had; Delivered the generation
	// Nexus last took (0: none yet).
	Latest    VmmRuntimeState `json:"latest"`
	Delivered uint64          `json:"delivered_gen"`
	// Pending is true while Nexus has neither taken nor refused the
	// newest state; Sending while a request for it is in flight or waits
	// to be retried (a state handed over before the publisher runs is
	// pending, not yet sending).
	Pending     bool       `json:"pending"`
	Sending     bool       `json:"sending"`
	Failures    int        `json:"failures,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// Refused counts states Nexus refused for good (4xx): they are not
	// sent again, a later state is.
	Refused int `json:"refused,omitempty"`
}

// Publisher tells Nexus every VMM state change (cpapi_instances_put). Per
// VMM the newest state wins: states produced while a request is in flight
// are coalesced into the latest, sent in generation order, never lost.
// Transient failures are retried with backoff until Nexus takes the state;
// a 4xx is permanent for that state (logged and shown), and a later state
// is sent anyway. Publish never blocks, so a VMM's monitor, the API and
// other VMMs never wait for Nexus.
type Publisher struct {
	nexus VMMs
	opts  PublisherOptions
	sem   chan struct{}
	wg    sync.WaitGroup

	mu   sync.Mutex
	ctx  context.Context // Run's; nil before Run
	vmms map[string]*delivery
}

type delivery struct {
	Delivery
	// done is the newest generation Nexus took or refused for good.
	done uint64
	// gone: the VMM was forgotten; the slot goes once its last state is
	// done.
	gone bool
}

// NewPublisher returns a publisher; states handed to it before Run are
// sent once it runs.
func NewPublisher(nexus VMMs, opts PublisherOptions) *Publisher {
	if opts.Retry == (backoff.Backoff{}) {
		opts.Retry = backoff.Backoff{Initial: 250 * time.Millisecond, Max: 4 * time.Second}
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 16
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{nexus: nexus, opts: opts, sem: make(chan struct{}, opts.Parallel), vmms: map[string]*delivery{}}
}

// Run delivers states until ctx ends, and returns once no delivery runs.
func (p *Publisher) Run(ctx context.Context) {
	p.mu.Lock()
	p.ctx = ctx
	for id, d := range p.vmms {
		p.startLocked(id, d)
	}
	p.mu.Unlock()
	<-ctx.Done()
	p.wg.Wait()
}

// startLocked starts d's delivery unless one runs, or the publisher does
// not (yet, or any more).
func (p *Publisher) startLocked(id string, d *delivery) {
	if d.Sending || p.ctx == nil || p.ctx.Err() != nil || d.done >= d.Latest.Gen {
		return
	}
	d.Sending = true
	ctx := p.ctx
	p.wg.Go(func() { p.deliver(ctx, id, d) })
}

// Publish hands Nexus a VMM's state. A state no newer than one already
// handed is ignored. It never blocks. Nexus is told it with no migration
// (migration_in and migration_out null): this agent migrates nothing.
func (p *Publisher) Publish(propolisID string, st VmmRuntimeState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.vmms[propolisID]
	if !ok {
		d = &delivery{Delivery: Delivery{PropolisID: propolisID}}
		p.vmms[propolisID] = d
	} else if st.Gen <= d.Latest.Gen {
		return
	}
	d.Latest, d.gone = st, false
	p.startLocked(propolisID, d)
}

// Forget drops a VMM once its newest state is delivered (or refused).
func (p *Publisher) Forget(propolisID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d, ok := p.vmms[propolisID]; ok {
		d.gone = true
		if !d.Sending && d.done >= d.Latest.Gen {
			delete(p.vmms, propolisID)
		}
	}
}

// Status is where every VMM's state stands, by id.
func (p *Publisher) Status() []Delivery {
	p.mu.Lock()
	out := make([]Delivery, 0, len(p.vmms))
	for _, d := range p.vmms {
		dd := d.Delivery
		dd.Pending = d.done < d.Latest.Gen
		out = append(out, dd)
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b Delivery) int { return cmp.Compare(a.PropolisID, b.PropolisID) })
	return out
}

// deliver sends d's newest state until Nexus has taken (or refused) the
// newest there is. One runs per VMM at a time, so states go out in order.
func (p *Publisher) deliver(ctx context.Context, id string, d *delivery) {
	for {
		p.mu.Lock()
		st := SledVmmState{VmmState: d.Latest}
		if d.done >= st.VmmState.Gen || ctx.Err() != nil {
			d.Sending = false
			if d.gone {
				delete(p.vmms, id)
			}
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()

		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		err := p.nexus.PutVMM(ctx, id, st)
		<-p.sem

		now := time.Now()
		p.mu.Lock()
		var wait time.Duration
		switch {
		case err == nil:
			d.done, d.Delivered, d.Failures = st.VmmState.Gen, st.VmmState.Gen, 0
		case Permanent(err):
			d.done, d.Failures = st.VmmState.Gen, 0
			d.Refused++
			d.LastError, d.LastErrorAt = err.Error(), &now
		default:
			d.Failures++
			d.LastError, d.LastErrorAt = err.Error(), &now
			wait = p.opts.Retry.Delay(d.Failures)
		}
		failures := d.Failures
		p.mu.Unlock()
		switch {
		case err == nil:
		case wait == 0:
			p.opts.Log.Error("Nexus refused a VMM state; not sending it again", "propolis_id", id, "gen", st.VmmState.Gen, "state", st.VmmState.State, "err", err)
		default:
			if failures == 1 || failures%10 == 0 {
				p.opts.Log.Warn("telling Nexus a VMM's state failed; retrying", "propolis_id", id, "gen", st.VmmState.Gen, "state", st.VmmState.State, "failures", failures, "retry_in", wait, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}
}

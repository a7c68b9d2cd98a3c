// Package vpcd is the sled's VPC data path as a process: the engine
// (internal/vpc/engine) between the sled's ports' links and its underlay
// socket (internal/vpc/netio), and a local API that mirrors OPTE's commands
// (create and delete a port, set its firewall rules and router entries,
// set and clear v2p mappings), which the agent's port manager drives.
//
// A port is told which link it is (a namespace and a link name: a guest's
// tap in its VMM's zone, a service zone's NIC's host end) and attaches to
// it when it can: a link that is not there yet (the VMM's service has not
// made its tap) or that went (the VMM stopped) is waited for, with a capped
// delay between tries, and the port's status says so. The engine's state
// lives in this process: the agent gives it again to a restarted one.
package vpcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/vpc/engine"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
)

// Options set a data path up.
type Options struct {
	// Underlay is the sled's underlay address: the Geneve socket is on
	// [Underlay]:6081 in Netns.
	Underlay netip.Addr
	// Netns is the sled's network namespace (a path; "" for this
	// process's).
	Netns string
	Log   *slog.Logger
	// MaxAttachDelay caps the delay between tries to attach a port to its
	// link (2s if 0).
	MaxAttachDelay time.Duration
	// SweepPeriod is how often idle flows are forgotten (1s if 0, as OPTE).
	SweepPeriod time.Duration
}

// Link is where a port's frames come and go: a link in a network namespace.
type Link struct {
	// Netns is the namespace's path ("" for the sled's).
	Netns string `json:"netns"`
	Name  string `json:"name"`
}

// Daemon is a running data path.
type Daemon struct {
	opts Options
	// boot names this run of the data path: a client that sees it change
	// knows the data path lost what it was given.
	boot string
	eng  *engine.Engine
	ul   *netio.Underlay

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// opMu orders the changes of ports; mu guards the map, and is held
	// only for a lookup or an update of it.
	opMu  sync.Mutex
	mu    sync.Mutex
	ports map[string]*attached
}

// Start opens the sled's Geneve socket and runs the data path until Close.
func Start(opts Options) (*Daemon, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxAttachDelay <= 0 {
		opts.MaxAttachDelay = 2 * time.Second
	}
	if opts.SweepPeriod <= 0 {
		opts.SweepPeriod = time.Second
	}
	eng, err := engine.New(engine.Config{Underlay: opts.Underlay})
	if err != nil {
		return nil, err
	}
	ul, err := netio.ListenUnderlay(opts.Netns, opts.Underlay)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Daemon{opts: opts, boot: newBoot(), eng: eng, ul: ul, ctx: ctx, cancel: cancel, ports: map[string]*attached{}}
	d.wg.Add(2)
	go func() { defer d.wg.Done(); d.underlayLoop() }()
	go func() { defer d.wg.Done(); d.sweepLoop() }()
	return d, nil
}

func newBoot() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Boot names this run of the data path.
func (d *Daemon) Boot() string { return d.boot }

// Engine is the daemon's engine, for its tables and views.
func (d *Daemon) Engine() *engine.Engine { return d.eng }

// Close stops every loop and closes every socket.
func (d *Daemon) Close() error {
	d.cancel()
	d.ul.Close()
	d.mu.Lock()
	ports := make([]*attached, 0, len(d.ports))
	for _, a := range d.ports {
		ports = append(ports, a)
	}
	d.mu.Unlock()
	for _, a := range ports {
		a.stop()
	}
	d.wg.Wait()
	return nil
}

// batch is how many frames or datagrams a loop reads, and sends on, in
// one system call at most.
const batch = 16

// underlayLoop takes Geneve from other sleds and the switch to the ports.
// It reads the datagrams waiting in one system call, and writes the frames
// of them that go to one port in a row in one.
func (d *Daemon) underlayLoop() {
	rs := netio.NewReads(batch, 1<<16, 0)
	ws := netio.NewWrites(batch)
	var to *attached // the port of what ws holds
	for d.ctx.Err() == nil {
		if err := d.ul.ReadBatch(rs); err != nil {
			if d.ctx.Err() == nil {
				d.opts.Log.Error("vpcd: reading the underlay", "err", err)
			}
			return
		}
		for i := range rs.Len() {
			n, cut := rs.Size(i)
			if cut {
				continue
			}
			r := d.eng.Inbound(rs.Buf(i)[:n])
			if r.Verdict != engine.ToPort {
				d.dispatch(r)
				continue
			}
			a := d.attachedOf(r.Port)
			if a == nil {
				continue
			}
			if a != to || ws.Full() {
				if to != nil {
					to.writeBatch(ws)
				}
				to = a
			}
			ws.Add(r.Data)
		}
		if to != nil {
			to.writeBatch(ws)
			to = nil
		}
	}
}

// writeUnderlay sends ws's datagrams and empties it.
func (d *Daemon) writeUnderlay(ws *netio.Writes) {
	if err := d.ul.WriteBatch(ws); err != nil {
		d.opts.Log.Debug("vpcd: sending to the underlay", "err", err)
	}
}

// attachedOf is the attached port of an engine's port, if it is still
// there.
func (d *Daemon) attachedOf(p *engine.Port) *attached {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ports[p.Config().Name]
}

// dispatch sends a result where the engine says.
func (d *Daemon) dispatch(r engine.Result) {
	switch r.Verdict {
	case engine.ToUnderlay:
		if err := d.ul.WriteTo(r.Data, r.Dst, r.SrcPort); err != nil {
			d.opts.Log.Debug("vpcd: sending to the underlay", "dst", r.Dst, "err", err)
		}
	case engine.ToPort:
		if a := d.attachedOf(r.Port); a != nil {
			a.write(r.Data)
		}
	}
}

func (d *Daemon) sweepLoop() {
	t := time.NewTicker(d.opts.SweepPeriod)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
			d.eng.Expire()
		}
	}
}

// ErrBadPort is a port spec the engine refuses.
var ErrBadPort = errors.New("vpcd: bad port")

func wrapBad(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadPort, err)
}

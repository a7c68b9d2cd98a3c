// Package toldtest is a data path for tests of internal/vpc/told and its
// users: it records what it is asked, one line a call, and fails while
// told to.
package toldtest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// Recorder is a told.DataPath that records its calls.
type Recorder struct {
	mu    sync.Mutex
	calls []string
	err   error
}

var _ told.DataPath = (*Recorder)(nil)

// Fail makes every call after it answer err (nil: succeed).
func (r *Recorder) Fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

// Took returns the calls recorded since the last Took, and forgets them.
func (r *Recorder) Took() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

func (r *Recorder) do(format string, args ...any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
	return r.err
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// CreatePort records "create <port> rules=<n> system=<routes> custom=<routes> ext=<json> gw=<json> subnets=<json>".
func (r *Recorder) CreatePort(_ context.Context, p told.PortConfig) error {
	return r.do("create %s rules=%d system=%s custom=%s ext=%s gw=%s subnets=%s", p.Port.Ref(), len(p.Rules),
		routes(p.System), routes(p.Custom), js(p.Port.External), js(p.Gateways), js(p.Subnets))
}

func routes(rs []told.Route) string {
	out := "["
	for i, r := range rs {
		if i > 0 {
			out += ","
		}
		out += r.Dest + ">" + r.Target.Type
	}
	return out + "]"
}

func (r *Recorder) DeletePort(_ context.Context, p told.PortRef) error { return r.do("delete %s", p) }

func (r *Recorder) SetV2P(_ context.Context, m told.V2P) error {
	return r.do("set-v2p %d %s %s %s", m.VNI, m.VirtualIP, m.VirtualMAC, m.PhysicalHostIP)
}

func (r *Recorder) ClearV2P(_ context.Context, m told.V2P) error {
	return r.do("clear-v2p %d %s", m.VNI, m.VirtualIP)
}

func (r *Recorder) SetFirewallRules(_ context.Context, p told.PortRef, rules []told.FirewallRule) error {
	return r.do("fw %s %d", p, len(rules))
}

func (r *Recorder) AddRouterEntry(_ context.Context, p told.PortRef, c told.RouterClass, rt told.Route) error {
	return r.do("add-route %s %s %s %s", p, c, rt.Dest, rt.Target.Type)
}

func (r *Recorder) DelRouterEntry(_ context.Context, p told.PortRef, c told.RouterClass, rt told.Route) error {
	return r.do("del-route %s %s %s %s", p, c, rt.Dest, rt.Target.Type)
}

func (r *Recorder) SetExternalIPs(_ context.Context, p told.PortRef, ips told.ExternalIPs, gw map[string][]string) error {
	return r.do("ext %s %s gw=%d", p, js(ips), len(gw))
}

func (r *Recorder) AttachSubnet(_ context.Context, p told.PortRef, s told.AttachedSubnet) error {
	return r.do("attach %s %s", p, s.Subnet)
}

func (r *Recorder) DetachSubnet(_ context.Context, p told.PortRef, s string) error {
	return r.do("detach %s %s", p, s)
}

package probes

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// Namespaces are probe zones as the linux runtime makes zones
// (internal/runtime/linux/zonenet): a network namespace named
// <prefix>oxz_probe_<id> with a veth pair, its host end in the sled's
// namespace carrying the sled's ownership mark and named from (tag, id)
// as a service zone's NIC's is, its zone end opte0 holding the NIC. Names
// come from the probe's id, the sled's namespace prefix and its tag
// alone, so two sleds on one host never touch each other's.
type Namespaces struct {
	// Prefix is the sled's namespace prefix (the runtime's NetnsPrefix).
	Prefix string
	// Tag is the sled's ownership tag (the runtime's Tag).
	Tag string
}

var _ Zones = Namespaces{}

// netns is probe id's namespace name.
func (n Namespaces) netns(id string) string { return n.Prefix + ZoneName(id) }

// Link is the host end of probe id's NIC, the link of its port.
func Link(tag, id string) string {
	_, nic := zonenet.LinkNames(tag, strings.ToLower(id))
	return nic
}

// Where is probe id's namespace and the host end of its NIC.
func (n Namespaces) Where(id string) (string, string) {
	return zonenet.NetnsPath(n.netns(id)), Link(n.Tag, id)
}

// List returns the probes whose namespace has this sled's prefix and
// holds the sled's NIC link, or holds nothing but its loopback (an Ensure
// cut short between making the namespace and its link).
func (n Namespaces) List(ctx context.Context) ([]string, error) {
	namespaces, links, err := zonenet.List(n.Prefix+ZonePrefix, n.Tag)
	if err != nil {
		return nil, err
	}
	ours := map[string]bool{}
	for _, l := range links {
		if l.Role == zonenet.RoleNIC {
			ours[strings.ToLower(l.ZoneID)] = true
		}
	}
	var out []string
	for _, ns := range namespaces {
		id := strings.TrimPrefix(ns, n.Prefix+ZonePrefix)
		if u, err := uuid.Parse(id); err != nil || u.String() != id {
			continue // not a probe's name
		}
		if ours[id] || empty(ns) {
			out = append(out, id)
		}
	}
	return out, ctx.Err()
}

// Ensure makes z's namespace and NIC.
func (n Namespaces) Ensure(ctx context.Context, z Zone) error {
	return zonenet.Ensure(ctx, zonenet.Config{Netns: n.netns(z.ID), Tag: n.Tag, ZoneID: z.ID,
		NIC: &zonenet.NIC{Addrs: z.Addrs, MAC: z.MAC, Gateway: z.Gateway}})
}

// Remove removes probe id's NIC and namespace.
func (n Namespaces) Remove(ctx context.Context, id string) error {
	return zonenet.Remove(ctx, n.netns(id), n.Tag, strings.ToLower(id))
}

// empty reports whether the namespace called name holds nothing but its
// loopback.
func empty(name string) bool {
	only := false
	err := zonenet.RunIn(name, func() error {
		ls, err := netlink.LinkList()
		only = err == nil && len(ls) == 1 && ls[0].Attrs().Name == "lo"
		return err
	})
	if err != nil {
		return false
	}
	return only
}

// RemoveAll removes every probe zone of the sled (teardown), and returns
// one line per zone removed.
func (n Namespaces) RemoveAll(ctx context.Context) ([]string, error) {
	ids, err := n.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the probe zones: %w", err)
	}
	var done []string
	for _, id := range ids {
		if err := n.Remove(ctx, id); err != nil {
			return done, err
		}
		done = append(done, "probe zone "+n.netns(id))
	}
	return done, nil
}

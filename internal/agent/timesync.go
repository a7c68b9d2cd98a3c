package agent

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/timesync/servers"
)

// Time sync: zones that need synchronized time (all but the NTP and
// internal DNS zones) start only while the sled's NTP zone's ntp-admin
// says time is synchronized (internal/timesync's watcher, asked through
// zoneTimeSync). --skip-timesync turns the gate off, as upstream's
// TimeSyncConfig::Skip does.

// isNTP reports whether a zone kind is an NTP zone.
func isNTP(kind string) bool { return kind == "boundary_ntp" || kind == "internal_ntp" }

// newTimeSync returns the watcher of the sled's NTP zone.
func (a *Agent) newTimeSync(cfg Config, log *slog.Logger) *timesync.Watcher {
	opts := timesync.Options{
		Skip:   cfg.SkipTimesync,
		Locate: a.locateNTP,
		Log:    log,
		// Zones held back by time are looked at again when it changes.
		OnChange: func(timesync.Status) { a.rec.TimeSyncChanged() },
	}
	if a.sim != nil {
		// The simulated NTP zones answer over a transport of the sim's.
		opts.Client = &http.Client{Transport: a.sim.NTPAdmin(a.ntpZoneAt)}
	}
	return timesync.NewWatcher(opts)
}

// ntpZones returns the wanted config's NTP zones.
func (a *Agent) ntpZones() []sledconfig.Zone {
	cfg := a.wanted.Load()
	if cfg == nil {
		return nil
	}
	var out []sledconfig.Zone
	for _, z := range cfg.Zones {
		if isNTP(z.ZoneType.Type) {
			out = append(out, z)
		}
	}
	return out
}

// locateNTP says where the sled's running NTP zone's ntp-admin listens.
func (a *Agent) locateNTP() (netip.AddrPort, error) {
	ntp := a.ntpZones()
	if len(ntp) == 0 {
		return netip.AddrPort{}, timesync.ErrNoNTPZone
	}
	var up []sledconfig.Zone
	var states []string
	for _, z := range ntp {
		if _, running := a.rec.RunningSpec(z.Name()); running {
			up = append(up, z)
			continue
		}
		state := "not known yet"
		if zs, ok := a.rec.Zone(z.Name()); ok {
			state = string(zs.State)
			if why := cmp.Or(zs.WaitingFor, zs.LastError); why != "" {
				state += " (" + why + ")"
			}
		}
		states = append(states, z.Name()+" is "+state)
	}
	switch len(up) {
	case 0:
		return netip.AddrPort{}, fmt.Errorf("%w: %s", timesync.ErrNTPZoneNotRunning, strings.Join(states, ", "))
	case 1:
	default:
		// Upstream's reconciler refuses this too: which one to believe?
		return netip.AddrPort{}, fmt.Errorf("%d NTP zones are running; a sled has one", len(up))
	}
	addr, ok := up[0].ServiceAddr()
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("NTP zone %s has no underlay address", up[0].Name())
	}
	return netip.AddrPortFrom(addr.Addr(), timesync.AdminPort), nil
}

// ntpZoneAt names the current config's NTP zone at addr (the sim's
// transport).
func (a *Agent) ntpZoneAt(addr netip.Addr) (string, bool) {
	for _, z := range a.ntpZones() {
		if ap, ok := z.ServiceAddr(); ok && ap.Addr() == addr {
			return z.Name(), true
		}
	}
	return "", false
}

// zoneTimeSync is the watcher as the zone reconciler sees it
// (reconciler.TimeSync).
type zoneTimeSync struct{ w *timesync.Watcher }

func (zt *zoneTimeSync) ZoneTimeSync(z *sledconfig.Zone) error {
	if !timesync.NeedsTimeSync(z.ZoneType.Type) {
		return nil
	}
	return zt.w.Check()
}

// runTimeSync runs the watcher until ctx ends.
func (a *Agent) runTimeSync(ctx context.Context) {
	if err := a.timeSync.Run(ctx); err != nil {
		a.log.Error("time sync watcher", "err", err)
	}
}

// TimeSync is the watcher of the sled's NTP zone.
func (a *Agent) TimeSync() *timesync.Watcher { return a.timeSync }

// newNTPServers returns the follower that keeps the running internal NTP
// zones' chronyd on the rack's boundary NTP servers, found through
// internal DNS; their chronyd is reached through its command socket
// (chrony.SocketDir) from the host.
func (a *Agent) newNTPServers(r *dns.Resolver, zs *zoneStorage, log *slog.Logger) (*servers.Follower, error) {
	bins, err := chrony.Find()
	if err != nil {
		// Without chronyc the zones' chronyd cannot be told; the NTP
		// zones cannot run either, and say so themselves.
		log.Warn("internal NTP zones will not be given the boundary NTP servers", "err", err)
		bins = chrony.Binaries{}
	}
	return servers.New(servers.Options{
		Resolver: r,
		Name:     dns.BoundaryNTPName,
		Zones:    a.internalNTPZones,
		Setter:   &chronySetter{a: a, zs: zs, bins: bins, log: log},
		Log:      log,
	})
}

// internalNTPZones lists the internal NTP zones that run, each start of one
// a new instance.
func (a *Agent) internalNTPZones() []servers.Zone {
	var out []servers.Zone
	for _, spec := range a.rec.RunningSpecs() {
		if spec.Config.ZoneType.Type != "internal_ntp" {
			continue
		}
		instance := ""
		if zs, ok := a.rec.Zone(spec.Name); ok {
			instance = zs.Since.String() // running since
		}
		out = append(out, servers.Zone{ID: spec.ID, Name: spec.Name, Instance: instance})
	}
	return out
}

// chronySetter sets an internal NTP zone's servers through its chronyd's
// command socket, in the sources file of its root.
type chronySetter struct {
	a    *Agent
	zs   *zoneStorage
	bins chrony.Binaries
	log  *slog.Logger
}

func (c *chronySetter) SetServers(ctx context.Context, z servers.Zone, addrs []netip.Addr) error {
	spec, ok := c.a.rec.RunningSpec(z.Name)
	if !ok {
		return fmt.Errorf("zone %s is not running", z.Name)
	}
	st, err := c.zs.ZoneStorage(&spec.Config)
	if err != nil {
		return fmt.Errorf("zone %s's root: %w", z.Name, err)
	}
	d, err := chrony.New(chrony.Config{Root: st.Root, Kind: chrony.Internal, SocketDir: chrony.SocketDir(cmp.Or(c.a.cfg.ZoneTag, DefaultZoneTag), z.ID)},
		chrony.Options{Binaries: c.bins, Log: c.log})
	if err != nil {
		return err
	}
	return d.SetServers(ctx, addrs)
}

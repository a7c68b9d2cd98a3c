// Package cli holds the sled-agent command line: the daemon, the development
// mode, the operator commands and the benchmarks.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/sledns"
)

// Main runs the command line and returns the exit code.
func Main(args []string) int {
	return run(args, os.Stdout, os.Stderr)
}

// run is Main with the command's output and error streams given.
func run(args []string, stdout, stderr io.Writer) int {
	return runIn(args, os.Stdin, stdout, stderr)
}

// runIn is run with the command's input given too.
func runIn(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		msg := oneLine(err.Error())
		if errors.Is(err, syscall.ECONNREFUSED) {
			// Nothing listens there: most often no agent runs, or the
			// command was not told where it does.
			msg += "; is an agent running? (--url / SLED_AGENT_URL)"
		}
		fmt.Fprintf(stderr, "sled-agent: %s\n", msg)
		return 1
	}
	return 0
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// globals are the flags every operator command shares.
type globals struct {
	url    string
	output string
}

// setup checks the output format and returns a client for the agent.
func (g *globals) setup() (c *client.Client, asJSON bool, err error) {
	switch g.output {
	case "table", "":
	case "json":
		asJSON = true
	default:
		return nil, false, fmt.Errorf("-o %q: want table or json", g.output)
	}
	c, err = client.New(g.url)
	return c, asJSON, err
}

// noOutputFlag annotates an operator command that prints one form only: it
// takes --url but not -o.
const noOutputFlag = "sled-agent/no-output-flag"

// addFlags gives every command of tree that runs the operator flags: --url,
// and -o unless the command prints one form only.
func (g *globals) addFlags(tree *cobra.Command) {
	if tree.Runnable() {
		defURL := os.Getenv("SLED_AGENT_URL")
		if defURL == "" {
			defURL = "http://" + agent.DefaultListen
		}
		tree.Flags().StringVar(&g.url, "url", defURL, "agent API URL (env SLED_AGENT_URL)")
		if tree.Annotations[noOutputFlag] == "" {
			tree.Flags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
		}
	}
	for _, c := range tree.Commands() {
		g.addFlags(c)
	}
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "sled-agent",
		Short:         "The agent that runs on every sled of a rack: zones, routes, NAT, inventory",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newDevCmd(), newBenchCmd(), newTeardownCmd(), newCrashTestCmd())
	// The operator commands, which talk to an agent: each has the flags
	// that say which and how to print what it says.
	for _, op := range []*cobra.Command{newConfigCmd(g), newInventoryCmd(g), newZonesCmd(g), newZoneCmd(g), newVMMCmd(g)} {
		g.addFlags(op)
		root.AddCommand(op)
	}
	root.AddCommand(newZoneServiceCmd())
	root.AddCommand(newVMMServiceCmd())
	root.AddCommand(newNTPZoneCmd())
	root.AddCommand(newSimCmd())
	root.AddCommand(newVPCCmd(), newVPCServiceCmd())
	return root
}

// daemonFlags are the flags of the agent's config: every one is a flag of
// run and a key of its config file (--config). dev and teardown take the
// same config file, but as flags only those they use.
type daemonFlags struct {
	cfg        agent.Config
	configFile string
	logLevel   string
	// all holds every daemon flag, bound to cfg and logLevel; a command's
	// flag set shares the *pflag.Flag of those it takes.
	all *pflag.FlagSet
}

func newDaemonFlags() *daemonFlags {
	d := &daemonFlags{all: pflag.NewFlagSet("agent", pflag.ContinueOnError)}
	c, f := &d.cfg, d.all
	f.StringVar(&c.Listen, "listen", agent.DefaultListen, "address the API listens on")
	f.IntVar(&c.MaxConnections, "max-connections", 0, "most connections the API holds open; more are closed at once (default: a quarter of the file descriptor limit, at most 4096)")
	f.StringVar(&c.DataDir, "data-dir", defaultDataDir(), "where the agent keeps its state")
	f.StringVar(&c.Netns, "netns", "", "run as a sled inside this network namespace (/run/netns/NAME), which plays its host: its underlay address, routes, listen address and zones' host ends are there (several sleds on one machine; give each its own --zone-tag)")
	f.StringVar(&c.RunDir, "run-dir", agent.DefaultRunDir, "where the linux runtime keeps per-boot state (a tmpfs is mounted there if it is not on one)")
	f.StringArrayVar(&c.LedgerDirs, "ledger-dir", nil, "directory for a copy of the config ledger (repeatable; default: two under --data-dir)")
	f.StringVar(&c.Runtime, "runtime", agent.DefaultRuntime, "zone runtime: sim (simulated zones) or linux (real ones; needs root)")
	f.StringVar(&c.SledID, "sled-id", "", "this sled's UUID (default: generated once and kept in --data-dir)")
	f.StringVar(&c.UnderlayIP, "underlay-ip", agent.DefaultUnderlayIP, "this sled's underlay IPv6 address")
	f.StringVar(&c.Role, "role", agent.DefaultRole, "sled role: gimlet or scrimlet")
	f.StringVar(&c.RackID, "rack-id", "", "the rack's UUID, reported in inventory (default: not known)")
	f.StringVar(&c.BaseboardPart, "baseboard-part", "", "the sled's part number (default: from the firmware's DMI, else i86pc)")
	f.StringVar(&c.BaseboardSerial, "baseboard-serial", "", "the sled's serial number (default: from the firmware's DMI, else the host name)")
	f.Var(uint32Flag{&c.BaseboardRevision}, "baseboard-revision", "the sled's revision (default: from the firmware's DMI, else 0)")
	f.StringVar(&c.SimFaults, "sim-faults", "", "fault map file for the sim runtime")
	f.StringVar(&c.DDMURL, "ddm-url", agent.DefaultDDMURL, `the routing daemon's (DDM) admin API, where the sled's prefixes are kept right ("" for none)`)
	f.StringVar(&c.BootstrapPrefix, "bootstrap-prefix", "", "the sled's bootstrap /64, advertised in DDM with the underlay /64 (default: none)")
	f.DurationVar(&c.PrefixPeriod, "prefix-period", 30*time.Second, "how often the prefixes in DDM are checked when nothing changed")
	f.StringArrayVar(&c.DNSServers, "dns-server", nil, "internal DNS server that names the switch daemons, [addr]:port (repeatable)")
	f.StringArrayVar(&c.Switches, "switch", nil, "switch daemon (dpd) address, [addr]:port, used when DNS is unreachable or names none (repeatable)")
	f.StringArrayVar(&c.Nexus, "nexus", nil, "Nexus internal API address, [addr]:port, told of the sled and its VMMs' states instead of the Nexus internal DNS names (repeatable)")
	f.DurationVar(&c.NATPeriod, "nat-period", 10*time.Second, "how often switches are found and their NAT entries checked")
	f.DurationVar(&c.HealthPeriod, "health-period", 5*time.Second, "how often every running zone is health-checked")
	f.IntVar(&c.HealthFailures, "health-failures", 3, "health checks in a row a running zone must fail to be reported unhealthy and restarted")
	f.DurationVar(&c.LedgerCheckPeriod, "ledger-check-period", 10*time.Second, "how often the config ledger's copies are checked and bad ones rewritten")
	f.StringVar(&c.VdevDir, "vdev-dir", "", "directory of file-backed synthetic disks, u2_<name>.vdev (linux runtime)")
	f.StringVar(&c.PoolRoot, "pool-root", "", "where the linux runtime's pools are mounted, <pool-root>/ext/<pool id> (default <data-dir>/storage)")
	f.BoolVar(&c.SkipTimesync, "skip-timesync", false, "start zones that need synchronized time without waiting for the NTP zone to say it is (development)")
	f.BoolVar(&c.VPCDataPath, "vpc-data-path", false, "run the sled's VPC data path (a runit service of its own with the linux runtime, in the agent with the sim runtime): guests', service zones' and probes' ports, their firewall rules, routes and NAT, Geneve between sleds on [underlay-ip]:6081 (needs root; its local API on <run-dir>/<zone-tag>-vpcd.sock, shown by sled-agent vpc)")
	f.BoolVar(&c.VMMStandIn, "vmm-stand-in", false, "every VMM's guest is a stand-in: simulated, with each NIC a veth pair whose host end is named and placed as its tap would be (vn<mac>, in the VMM's zone) and whose guest end, with the NIC's MAC, is in a network namespace of its own (tests of guests' networking; needs root)")
	f.BoolVar(&c.NTPNoClock, "ntp-no-clock", false, "the linux runtime's NTP zones only track time (chronyd -x) and never set the host's clock (development, tests)")
	f.IntVar(&c.VMMReservoirPercentage, "vmm-reservoir-percentage", 0, "the VMM reservoir, guests' memory, as a percentage (1-99) of usable memory (default 60, as upstream's non-gimlet sleds; 91 on gimlets)")
	f.Uint64Var(&c.VMMReservoirSizeMB, "vmm-reservoir-size-mb", 0, "the VMM reservoir as a size in MiB (instead of --vmm-reservoir-percentage)")
	f.StringVar(&c.VMMImageDir, "vmm-image-dir", "", "directory of guest disk images that a VMM's file backends may name, beside the pools' local_storage datasets")
	f.StringVar(&c.VMMAccel, "vmm-accel", "auto", "how the linux runtime's guests run: kvm, tcg, or auto (KVM only where hardware virtualisation is there: kvm_intel or kvm_amd)")
	f.StringVar(&c.VMMQEMUIDs, "vmm-qemu-ids", "", "user and group ids the VMM services run QEMU as, FIRST:COUNT (default: theirs, 1879048192:16777216); one per VMM, hashed from its id")
	f.StringVar(&d.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	// Another ownership tag and namespace prefix for the linux runtime's OS
	// objects: each sled of several on one host has its own (--netns), and
	// tests and the crash test never touch a real agent's.
	f.StringVar(&c.ZoneTag, "zone-tag", "", "ownership tag of the linux runtime's links, cgroups, run state and host lock: 1-20 of [a-z0-9-] (default sled-agent; each sled on a host its own)")
	f.StringVar(&c.NetnsPrefix, "netns-prefix", "", "prefix of the linux runtime's zone namespace names (default none; each sled on a host its own, e.g. <zone-tag>-)")
	markConfigKeys(f)
	return d
}

// configFileUsage is --config's help: of run, whose flags are its keys, and
// of the commands that take run's file but not all its flags.
const (
	configFileUsage      = "agent config file: JSON with these flags' names as keys; flags override it"
	otherConfigFileUsage = "agent config file, as run's (its keys are run's flags' names, also those this command does not take); flags override it"
)

// addAll gives cmd every daemon flag, and --config: run's flags.
func (d *daemonFlags) addAll(cmd *cobra.Command) {
	cmd.Flags().StringVar(&d.configFile, "config", "", configFileUsage)
	cmd.Flags().AddFlagSet(d.all)
}

// add gives cmd --config and the daemon flags named, those it uses. The
// config file's keys are still every daemon flag's: one cmd does not take
// sets the config as it does for run, which the command then ignores or
// refuses as it would have the flag.
func (d *daemonFlags) add(cmd *cobra.Command, names ...string) {
	cmd.Flags().StringVar(&d.configFile, "config", "", otherConfigFileUsage)
	for _, name := range names {
		fl := d.all.Lookup(name)
		if fl == nil {
			panic("cli: no daemon flag --" + name)
		}
		cmd.Flags().AddFlag(fl)
	}
}

// except returns the names of every daemon flag but those given.
func (d *daemonFlags) except(names ...string) []string {
	var keep []string
	d.all.VisitAll(func(fl *pflag.Flag) {
		if !slices.Contains(names, fl.Name) {
			keep = append(keep, fl.Name)
		}
	})
	return keep
}

// setDefault gives the daemon flag name a default of the command's own,
// shown in its help; usage, if not empty, replaces the flag's help.
func (d *daemonFlags) setDefault(name, value, usage string) {
	fl := d.all.Lookup(name)
	if err := fl.Value.Set(value); err != nil {
		panic(fmt.Sprintf("cli: default %q of --%s: %v", value, name, err))
	}
	fl.DefValue = value
	if usage != "" {
		fl.Usage = usage
	}
}

// resolve applies the config file to the flags the user did not set and
// returns the config they then hold.
func (d *daemonFlags) resolve(cmd *cobra.Command) (agent.Config, error) {
	return resolveConfig(cmd, d.all, &d.cfg, d.configFile)
}

// configKey marks the flags that are also keys of the agent config file:
// every daemon flag (newDaemonFlags). Deriving the keys from the flag set
// keeps the two from drifting apart.
const configKey = "sled-agent/config-key"

// markConfigKeys makes every flag of f so far a config key.
func markConfigKeys(f *pflag.FlagSet) {
	f.VisitAll(func(fl *pflag.Flag) {
		f.SetAnnotation(fl.Name, configKey, []string{"true"})
	})
}

// resolveConfig applies the config file to the daemon flags (keys, bound to
// flags) the user did not set on cmd's command line and returns the config
// they then hold. A key of the file is a daemon flag's name, whether cmd
// takes that flag or not, its value what the flag would be given (a
// string, number or boolean; a list of strings for a repeatable flag); the
// only other keys are those of agent.Config that no flag sets (images).
func resolveConfig(cmd *cobra.Command, keys *pflag.FlagSet, flags *agent.Config, configFile string) (agent.Config, error) {
	if configFile == "" {
		return *flags, nil
	}
	data, err := os.ReadFile(configFile)
	if err != nil {
		return agent.Config{}, fmt.Errorf("reading agent config: %w", err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		return agent.Config{}, fmt.Errorf("agent config %s: %w", configFile, err)
	}
	onCommandLine := map[string]bool{}
	cmd.Flags().Visit(func(fl *pflag.Flag) { onCommandLine[fl.Name] = true })
	// The reservoir is a percentage or a size, not both: either given on
	// the command line overrides both of the file.
	if onCommandLine["vmm-reservoir-percentage"] || onCommandLine["vmm-reservoir-size-mb"] {
		onCommandLine["vmm-reservoir-percentage"], onCommandLine["vmm-reservoir-size-mb"] = true, true
	}
	rest := map[string]json.RawMessage{}
	for _, key := range slices.Sorted(maps.Keys(doc)) {
		fl := keys.Lookup(key)
		if fl == nil || fl.Annotations[configKey] == nil {
			rest[key] = doc[key]
			continue
		}
		if onCommandLine[key] {
			continue
		}
		if err := setFromJSON(fl, doc[key]); err != nil {
			return agent.Config{}, fmt.Errorf("agent config %s: key %q: %w", configFile, key, err)
		}
		fl.Changed = true
	}
	// What is left must be agent.Config's own (file-only) keys.
	if len(rest) > 0 {
		restDoc, _ := json.Marshal(rest)
		dec := json.NewDecoder(bytes.NewReader(restDoc))
		dec.DisallowUnknownFields()
		var only agent.Config
		if err := dec.Decode(&only); err != nil {
			return agent.Config{}, fmt.Errorf("agent config %s: %w (its keys are the flags of run and images)", configFile, err)
		}
		flags.Images = only.Images
	}
	return *flags, nil
}

// setFromJSON gives a flag a config file's value, as the command line
// would give it.
func setFromJSON(fl *pflag.Flag, raw json.RawMessage) error {
	if sv, ok := fl.Value.(pflag.SliceValue); ok {
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil {
			return fmt.Errorf("want a list of strings")
		}
		return sv.Replace(list)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case bool:
		s = strconv.FormatBool(v)
	case float64:
		s = string(bytes.TrimSpace(raw))
	default:
		return fmt.Errorf("want a %s (a string, number or boolean)", fl.Value.Type())
	}
	if err := fl.Value.Set(s); err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	return nil
}

// uint32Flag is a number flag that sets *p only when it is given, so that
// "not given" and 0 differ.
type uint32Flag struct{ p **uint32 }

func (f uint32Flag) String() string {
	if f.p == nil || *f.p == nil {
		return ""
	}
	return strconv.FormatUint(uint64(**f.p), 10)
}

func (f uint32Flag) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("want a number from 0 to %d", uint32(math.MaxUint32))
	}
	v := uint32(n)
	*f.p = &v
	return nil
}

func (f uint32Flag) Type() string { return "uint32" }

func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/sled-agent"
	}
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".local", "state", "sled-agent")
	}
	return "sled-agent-data"
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func newRunCmd() *cobra.Command {
	d := newDaemonFlags()
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the sled agent daemon",
		Long:  "Run the sled agent daemon. SIGINT or SIGTERM stop the agent and leave its zones running.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := d.resolve(cmd)
			if err != nil {
				return err
			}
			log, err := newLogger(d.logLevel)
			if err != nil {
				return err
			}
			if cfg.Netns != "" {
				// Re-executes this binary there; returns there.
				if err := sledns.Enter(cfg.Netns); err != nil {
					return err
				}
			}
			a, err := agent.New(cfg, log)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			return a.Run(ctx)
		},
	}
	d.addAll(cmd)
	return cmd
}

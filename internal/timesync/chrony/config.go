package chrony

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
)

// ErrInvalidConfig: a Config that cannot be rendered; the error says why.
var ErrInvalidConfig = errors.New("invalid chrony config")

// Kind is what an instance is for.
type Kind int

const (
	// Internal is an internal NTP zone: it follows the rack's boundary NTP
	// servers and serves nobody.
	Internal Kind = iota + 1
	// Boundary is a boundary NTP zone: it follows servers outside the rack
	// and serves the rack's internal NTP zones on its own address.
	Boundary
	// Reference serves its own clock at a fixed stratum and follows
	// nobody: the server that tests and development point NTP zones at.
	// It never sets the clock.
	Reference
)

func (k Kind) String() string {
	switch k {
	case Internal:
		return "internal"
	case Boundary:
		return "boundary"
	case Reference:
		return "reference"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Poll bounds how often every server is asked: every 2^Min to 2^Max
// seconds (chrony's minpoll and maxpoll, -6 to 24).
type Poll struct{ Min, Max int }

// DefaultStratum is a Reference's stratum when Config.Stratum is 0: its
// clients are one more, 9, still synchronized by upstream's rule
// (stratum below 10, which is a boundary server's local clock).
const DefaultStratum = 8

// Config says what one chronyd is to do. Every file of the instance lives
// under Root/chrony, but for the command socket, which may be put in
// SocketDir (see there).
type Config struct {
	// Root is the zone root (absolute).
	Root string
	Kind Kind
	// Servers are the NTP servers to follow (Internal, Boundary), as
	// addresses: the caller resolves names. A Boundary needs at least one;
	// an Internal may have none yet (the boundary zones are found later).
	Servers []netip.Addr
	// ServerPort is the servers' NTP port; 0 is 123.
	ServerPort uint16
	// SetClock lets chronyd set this machine's clock (production). Without
	// it chronyd runs with -x and only tracks (--ntp-no-clock, tests).
	SetClock bool
	// Address is the address a Boundary or Reference serves on (the
	// zone's own): its NTP server socket is bound to it. Required for them.
	Address netip.Addr
	// Port is the NTP port a Boundary or Reference serves on; 0 is 123.
	Port uint16
	// Allow is who may ask a Boundary or Reference for time; empty is
	// anyone who can reach Address.
	Allow []netip.Prefix
	// Poll overrides the servers' polling bounds (tests use short ones);
	// nil is upstream's for the kind.
	Poll *Poll
	// Stratum is a Reference's stratum (1 to 15); 0 is DefaultStratum.
	Stratum int
	// SocketDir is the directory of the command socket; empty is
	// Root/chrony. A unix socket's path is at most 107 bytes, and chronyc
	// binds its own socket (chronyc.<pid>.sock) in the same directory, so
	// the directory's path may be at most MaxSocketDir bytes: a zone root
	// deep in a pool is longer, and an NTP zone's socket goes in
	// SocketDir(tag, zone id) instead, where the zone's chronyd and the
	// agent on the host both find it. chronyd disables the socket unless
	// the directory is owned by its user (root) and closed to others, so
	// Write makes it a 0700 directory owned by root.
	SocketDir string
}

// SocketRoot holds the command socket directories of NTP zones' chronyds
// (SocketDir): short, and per boot, like the sockets.
const SocketRoot = "/run/sled-agent-ntp"

// SocketDir is the command socket directory of the chronyd of the NTP zone
// zoneID of the agent tagged tag (the zone runtime's Options.Tag):
// SocketRoot/<tag>-<zone id>. The zone's chronyd binds its socket there and
// the agent reaches it there from the host (SetServers, Tracking), and the
// zone runtime removes it with the zone. With a tag of at most 29 bytes and
// a UUID it is within MaxSocketDir.
func SocketDir(tag, zoneID string) string {
	return SocketRoot + "/" + tag + "-" + zoneID
}

// MaxSocketDir is the longest path of Config.SocketDir (see there): 107
// bytes of a unix socket path less "/chronyc.4194304.sock".
const MaxSocketDir = 107 - len("/chronyc.4194304.sock")

// Paths are an instance's files.
type Paths struct {
	Dir        string // Root/chrony: everything of the instance but the socket
	Conf       string // chrony.conf
	SourcesDir string // sourcedir: Sources, re-read on "chronyc reload sources"
	Sources    string // the servers
	PID        string
	Drift      string
	Dump       string // dumpdir and ntsdumpdir
	Log        string // logdir
	SocketDir  string
	Socket     string // the command socket (bindcmdaddress)
}

// Paths returns the instance's files.
func (c Config) Paths() Paths {
	dir := filepath.Join(c.Root, "chrony")
	sock := c.SocketDir
	if sock == "" {
		sock = dir
	}
	return Paths{
		Dir:        dir,
		Conf:       filepath.Join(dir, "chrony.conf"),
		SourcesDir: filepath.Join(dir, "sources"),
		Sources:    filepath.Join(dir, "sources", "servers.sources"),
		PID:        filepath.Join(dir, "chronyd.pid"),
		Drift:      filepath.Join(dir, "drift"),
		Dump:       filepath.Join(dir, "dump"),
		Log:        filepath.Join(dir, "log"),
		SocketDir:  filepath.Clean(sock),
		Socket:     filepath.Join(sock, "chronyd.sock"),
	}
}

// Args are chronyd's arguments after its path: in the foreground (-d,
// logging to stderr), this config, and -x unless it may set the clock.
func (c Config) Args() []string {
	args := []string{"-d", "-f", c.Paths().Conf}
	if !c.SetClock {
		args = append(args, "-x")
	}
	return args
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
}

// validate checks c; the error wraps ErrInvalidConfig.
func (c Config) validate() error {
	if c.Root == "" || !filepath.IsAbs(c.Root) || filepath.Clean(c.Root) != c.Root {
		return invalid("root %q is not a clean absolute path", c.Root)
	}
	for _, p := range []string{c.Root, c.SocketDir} {
		if strings.ContainsAny(p, " \t\n\r#\"'\\") {
			return invalid("path %q has a character chrony.conf cannot hold", p)
		}
	}
	if c.SocketDir != "" && (!filepath.IsAbs(c.SocketDir) || filepath.Clean(c.SocketDir) != c.SocketDir) {
		return invalid("socket dir %q is not a clean absolute path", c.SocketDir)
	}
	if d := c.Paths().SocketDir; len(d) > MaxSocketDir {
		return invalid("command socket directory %s is %d bytes, a unix socket's at most %d: set SocketDir", d, len(d), MaxSocketDir)
	}
	switch c.Kind {
	case Internal, Boundary, Reference:
	default:
		return invalid("unknown kind %d", int(c.Kind))
	}
	for _, a := range c.Servers {
		if err := checkServer(a); err != nil {
			return err
		}
	}
	if c.Kind == Boundary && len(c.Servers) == 0 {
		return invalid("a boundary NTP zone needs at least one server")
	}
	if c.Kind == Reference {
		if len(c.Servers) > 0 {
			return invalid("a reference follows no servers")
		}
		if c.SetClock {
			return invalid("a reference never sets the clock")
		}
		if c.Stratum < 0 || c.Stratum > 15 {
			return invalid("stratum %d is not 1 to 15", c.Stratum)
		}
	}
	if c.Kind != Internal {
		if !c.Address.IsValid() || c.Address.IsUnspecified() || c.Address.Zone() != "" {
			return invalid("a %s serves on one address without a zone, not %q", c.Kind, c.Address.String())
		}
		for _, p := range c.Allow {
			if !p.IsValid() {
				return invalid("allow %q is not a prefix", p.String())
			}
		}
	}
	if p := c.Poll; p != nil && (p.Min < -6 || p.Max > 24 || p.Min > p.Max) {
		return invalid("poll %d..%d is not within -6..24", p.Min, p.Max)
	}
	return nil
}

func checkServer(a netip.Addr) error {
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return invalid("server %q is not a unicast address without a zone", a.String())
	}
	return nil
}

// Render returns chrony.conf and the servers' sources file for c. It is
// pure: Write puts them in place.
//
// Upstream (omicron's zone-setup, chrony-setup) is kept where it fits:
// leapsecmode slew with maxslewrate 2708.333 (a leap second slewed over
// about 37 s), makestep 0.1 3 in a boundary zone and 1.0 3 in an internal
// one, maxclockerror 60 in a boundary zone, maxdelay 0.1 on servers, and a
// boundary zone's servers polled every 1 to 32 s with at most 8 samples.
// Where we differ, and why:
//   - servers are addresses in a sourcedir file, not "pool <name>" lines
//     with "refresh 120": the agent resolves names and rewrites the file,
//     and "chronyc reload sources" applies it at once.
//   - no "failfast" on a boundary zone's servers: it is an option of
//     upstream's own chrony build, which Debian's chronyd refuses.
//   - a boundary zone has no "local stratum 10 orphan distance 0.4
//     activate 0.5": Debian's chronyd (4.3) has no "activate", and
//     without it the local clock would be served with authority before it
//     was ever synchronized (upstream's own reason for "activate"). Our
//     boundary zones serve time only while they follow their servers.
//   - makestep only when chronyd may set the clock; with -x it sets none.
//   - "log measurements statistics tracking" is left out: nothing here
//     rotates chronyd's log files; its messages go to stderr, to the
//     zone's supervisor. Every other file is in the zone root (or
//     SocketDir), as several chronyd instances share this machine.
//   - cmdport 0: chronyc talks to the unix socket only, never UDP 323;
//     an internal zone has port 0 (serves nobody) and a boundary zone
//     binds its NTP server socket to its own address.
//   - chronyd stays root ("user root"): the zone runtime creates every
//     file of a zone as root, and chronyd requires its command socket's
//     directory to be owned by the user it runs as.
func Render(c Config) (conf, sources []byte, err error) {
	if err := c.validate(); err != nil {
		return nil, nil, err
	}
	p := c.Paths()
	var b bytes.Buffer
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	line("# chronyd (%s), written by sled-agent from the zone's config: edits", c.Kind)
	line("# are overwritten.")
	line("user root")
	line("pidfile %s", p.PID)
	line("driftfile %s", p.Drift)
	line("dumpdir %s", p.Dump)
	line("ntsdumpdir %s", p.Dump)
	line("logdir %s", p.Log)
	line("bindcmdaddress %s", p.Socket)
	line("cmdport 0")
	switch c.Kind {
	case Internal:
		line("port 0")
	case Boundary, Reference:
		line("bindaddress %s", c.Address)
		line("port %d", port(c.Port))
		if len(c.Allow) == 0 {
			line("allow")
		}
		for _, a := range c.Allow {
			line("allow %s", a.Masked())
		}
	}
	switch c.Kind {
	case Internal, Boundary:
		line("sourcedir %s", p.SourcesDir)
	case Reference:
		stratum := c.Stratum
		if stratum == 0 {
			stratum = DefaultStratum
		}
		line("local stratum %d", stratum)
	}
	if c.SetClock {
		if c.Kind == Boundary {
			line("makestep 0.1 3")
		} else {
			line("makestep 1.0 3")
		}
	}
	if c.Kind == Boundary {
		line("maxclockerror 60")
	}
	line("leapsecmode slew")
	line("maxslewrate 2708.333")
	return b.Bytes(), renderSources(c), nil
}

func port(p uint16) uint16 {
	if p == 0 {
		return 123
	}
	return p
}

// renderSources is the sourcedir file: one server line a server.
func renderSources(c Config) []byte {
	var b bytes.Buffer
	b.WriteString("# servers of this NTP instance, written by sled-agent\n")
	poll := c.Poll
	if poll == nil && c.Kind == Boundary {
		poll = &Poll{Min: 0, Max: 5}
	}
	for _, a := range c.Servers {
		fmt.Fprintf(&b, "server %s iburst maxdelay 0.1", a.Unmap())
		if poll != nil {
			fmt.Fprintf(&b, " minpoll %d maxpoll %d", poll.Min, poll.Max)
		}
		if c.Kind == Boundary {
			b.WriteString(" maxsamples 8")
		}
		if c.ServerPort != 0 && c.ServerPort != 123 {
			fmt.Fprintf(&b, " port %d", c.ServerPort)
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Write renders c and puts its files in place: Root/chrony (0700) with
// chrony.conf and the sources file, each replaced atomically when it
// changed, and the socket directory made 0700 and owned by this user (see
// Config.SocketDir). It leaves the running chronyd alone: a changed
// chrony.conf applies at its next start, a changed sources file at
// "chronyc reload sources" (Daemon.SetServers).
func Write(c Config) error {
	conf, sources, err := Render(c)
	if err != nil {
		return err
	}
	p := c.Paths()
	for _, d := range []string{p.Dir, p.SocketDir} {
		if err := privateDir(d); err != nil {
			return err
		}
	}
	if err := atomicfile.WriteFileIfChanged(p.Conf, conf, atomicfile.Options{Perm: 0o644}); err != nil {
		return fmt.Errorf("chrony: write %s: %w", p.Conf, err)
	}
	if err := writeSources(p.Sources, sources); err != nil {
		return err
	}
	return nil
}

func writeSources(path string, data []byte) error {
	if err := atomicfile.WriteFileIfChanged(path, data, atomicfile.Options{Perm: 0o644}); err != nil {
		return fmt.Errorf("chrony: write %s: %w", path, err)
	}
	return nil
}

// privateDir makes dir (and its parents) exist, 0700 and owned by this
// process's user, as chronyd requires of its command socket's directory.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("chrony: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("chrony: %w", err)
	}
	if err := os.Lchown(dir, os.Geteuid(), os.Getegid()); err != nil {
		return fmt.Errorf("chrony: %w", err)
	}
	return nil
}

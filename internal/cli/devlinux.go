package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/timesync/reference"
)

// The Linux development sled's own places and names: fixed, so that a run
// that was killed is found and cleared by the next one, and distinct from
// a real agent's (tag sled-agent, /var/lib/sled-agent, /run/sled-agent), so
// that it never touches one.
const (
	devLinuxDataDir = "/var/tmp/sled-agent-dev"
	devLinuxRunDir  = "/run/sled-agent-dev"
	devLinuxTag     = "sadev"
	// devReferenceAddr is where the reference NTP server the sled's
	// internal NTP zone follows serves, on a link of its own on the host:
	// the rack's boundary NTP, as internal DNS names it. Outside every
	// sled's /64 the dev sled uses.
	devReferenceAddr = "fd00:1122:3344:1ff::1"
	// devReferenceStratum is the reference's claimed stratum; the NTP zone
	// syncs one below it.
	devReferenceStratum = 7
	// devGuestImage is the test guest's copy in the sled's image dir.
	devGuestImage = "test-guest.raw"
	// devGuestMemoryMiB is the guest's memory: the test guest needs little.
	devGuestMemoryMiB = 256
	// devGuestWait bounds each wait for a guest's console to show a line:
	// its lease (a boot through OVMF under TCG takes 20 s to a minute or
	// two on a busy machine), a ping's answer. A hang detector, not a
	// timing.
	devGuestWait = 5 * time.Minute
	// devTeardownWait bounds the removal of everything at the end.
	devTeardownWait = 3 * time.Minute
)

// errNeedsRoot is dev --runtime linux refused to a user other than root.
var errNeedsRoot = errors.New("dev --runtime linux makes network namespaces, mounts, loop devices and processes: it needs root (sudo ./scripts/dev --linux)")

// devLinux is what dev --runtime linux adds to the sled on loopback: the
// sled's disks as files, a reference NTP server for its NTP zone, the test
// guest's image, the rack of a second sled (devrack.go) with a guest on
// each (devguests.go), and at the end the removal of all of it.
type devLinux struct {
	progress io.Writer // where waits and builds are told (stderr)
	log      *slog.Logger
	cfg      agent.Config
	ref      *reference.Server
	image    string // guest A's disk, in the image dir
	// rack is the second sled and what joins the two (devrack.go).
	rack *devRack
	// logLevel is the agents' (sled B's is given it).
	logLevel string
}

// devLinuxOptions are what the dev command's flags say of a Linux sled.
type devLinuxOptions struct {
	// dataDirGiven, runDirGiven: the operator chose them.
	dataDirGiven, runDirGiven bool
	// logLevel is the agents' log level.
	logLevel string
}

// prepareDevLinux checks that this machine can run a Linux sled, clears
// what a killed earlier run left, and makes the sled's disks, its guest
// image, its reference NTP server and the rack, whose second sled it
// starts. cfg is completed with the sled's places. On error nothing it
// made is left.
func prepareDevLinux(ctx context.Context, cfg *agent.Config, o devLinuxOptions, progress io.Writer, log *slog.Logger) (d *devLinux, err error) {
	if cfg.VMMStandIn {
		return nil, errors.New("dev --runtime linux boots the test guest on each sled and has them ping each other: --vmm-stand-in, whose guests boot nothing, is for tests (run --vmm-stand-in)")
	}
	if os.Geteuid() != 0 {
		return nil, errNeedsRoot
	}
	bins, err := devLinuxTools()
	if err != nil {
		return nil, err
	}
	if !o.dataDirGiven {
		cfg.DataDir = devLinuxDataDir
	}
	if !o.runDirGiven {
		cfg.RunDir = devLinuxRunDir
	}
	cfg.TmpfsRunDir = true
	// The hidden --zone-tag and --netns-prefix: tests run their own.
	cfg.ZoneTag = cmp.Or(cfg.ZoneTag, devLinuxTag)
	cfg.NetnsPrefix = cmp.Or(cfg.NetnsPrefix, cfg.ZoneTag+"-")
	cfg.VdevDir = filepath.Join(cfg.DataDir, "vdev")
	cfg.VMMImageDir = filepath.Join(cfg.DataDir, "images")
	// The sleds carry their guests' VPC (devrack.go).
	cfg.VPCDataPath = true
	if u, err := netip.ParseAddr(cfg.UnderlayIP); err != nil || sledconfig.SledSubnet(u).Contains(netip.MustParseAddr(devSledBUnderlay)) {
		return nil, fmt.Errorf("--underlay-ip %q: dev's second sled is %s; give the first sled an IPv6 address of another /64", cfg.UnderlayIP, devSledBUnderlay)
	}
	d = &devLinux{progress: progress, log: log, cfg: *cfg, logLevel: o.logLevel}
	if d.rack, err = newDevRack(d.cfg, o.logLevel, progress, log); err != nil {
		return nil, err
	}
	if err := d.clearLeftovers(ctx); err != nil {
		return nil, err
	}
	if err := d.rack.clearLeftovers(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.close(false)
			d = nil
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return d, err
	}
	if err := os.WriteFile(filepath.Join(cfg.DataDir, devMark), []byte("the data dir of sled-agent dev --runtime linux, removed when it stops\n"), 0o600); err != nil {
		return d, err
	}
	for _, dir := range []string{cfg.VdevDir, cfg.VMMImageDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return d, err
		}
	}
	if err := d.guestImage(); err != nil {
		return d, err
	}
	fmt.Fprintf(progress, "dev: starting a reference NTP server at %s (stratum %d, never sets the clock)\n", devReferenceAddr, devReferenceStratum)
	d.ref, err = reference.Start(ctx, reference.Options{Binaries: bins, Tag: cfg.ZoneTag, Addr: netip.MustParseAddr(devReferenceAddr),
		Stratum: devReferenceStratum, Root: filepath.Join(cfg.DataDir, "reference"), Log: log.With("component", "reference-ntp")})
	if err != nil {
		return d, err
	}
	if err := d.rack.make(ctx, d.image); err != nil {
		return d, err
	}
	return d, nil
}

// disks makes a file-backed disk for each disk of the sled config doc, and
// returns doc with their serials: a disk of serial synthetic-serial-<name>
// is the file u2_<tag>-<name>.vdev in the vdev dir, whose serial is
// synthetic-serial-<tag>-<name> (an agent with a tag of its own looks at no
// other disk: never at the host's). Any other disk is refused.
func (d *devLinux) disks(doc []byte) ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(doc, &cfg); err != nil {
		return nil, fmt.Errorf("the sled config: %w", err)
	}
	disks, _ := cfg["disks"].(map[string]any)
	var names []string
	for _, disk := range disks {
		ident, _ := disk.(map[string]any)["identity"].(map[string]any)
		serial, _ := ident["serial"].(string)
		name, ok := strings.CutPrefix(serial, devVdevSerial)
		if !ok || name == "" {
			return nil, fmt.Errorf("the sled config's disk serial %q: dev --runtime linux runs on file-backed disks, whose serials are %s<name>", serial, devVdevSerial)
		}
		name = d.cfg.ZoneTag + "-" + name
		ident["serial"] = devVdevSerial + name
		names = append(names, name)
	}
	slices.Sort(names)
	if err := btrfs.MakeVdevs(d.cfg.VdevDir, names...); err != nil {
		return nil, fmt.Errorf("making the sled's disks: %w", err)
	}
	fmt.Fprintf(d.progress, "dev: the sled's disks are files: %s/u2_{%s}.vdev\n", d.cfg.VdevDir, strings.Join(names, ","))
	return json.Marshal(cfg)
}

// devVdevSerial begins the serial of a file-backed disk (btrfs's
// synthetic disks, upstream's RawSyntheticDisk).
const devVdevSerial = "synthetic-serial-"

// devLinuxTools finds what a Linux sled runs, or says how to get it.
func devLinuxTools() (chrony.Binaries, error) {
	const fix = "run sudo ./scripts/setup, which installs it"
	for _, t := range []struct{ bin, what string }{
		{"runsv", "runit's runsv (zones' services)"},
		{"mkfs.btrfs", "btrfs-progs (the sled's storage)"},
		{testguest.QEMU, "QEMU (the guests)"},
		{"ip", "iproute2's ip (the rack's namespaces and links)"},
	} {
		if _, err := exec.LookPath(t.bin); err != nil {
			return chrony.Binaries{}, fmt.Errorf("no %s: %s", t.what, fix)
		}
	}
	if _, _, err := testguest.OVMF(); err != nil {
		return chrony.Binaries{}, err
	}
	bins, err := chrony.Find()
	if err != nil {
		return chrony.Binaries{}, fmt.Errorf("%w: %s", err, fix)
	}
	return bins, nil
}

// devMark, in a Linux dev sled's data dir, says the dir is one: made by
// dev, and removed by it.
const devMark = "sled-agent-dev"

// clearLeftovers removes what an earlier run with the same data dir left
// when it was killed before it could: its zones, mounts and loop devices
// (a teardown), then the data dir. A data dir that is not empty and not a
// dev sled's is refused: it is not dev's to remove.
func (d *devLinux) clearLeftovers(ctx context.Context) error {
	if emptyOrAbsent(d.cfg.DataDir) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(d.cfg.DataDir, devMark)); err != nil {
		return fmt.Errorf("the data dir %s is not empty and is no dev sled's (no %s in it): dev --runtime linux makes its own data dir and removes it at the end; give a new one with --data-dir", d.cfg.DataDir, devMark)
	}
	fmt.Fprintf(d.progress, "dev: %s is there: an earlier dev sled did not stop cleanly; removing what it left\n", d.cfg.DataDir)
	if err := d.teardown(ctx); err != nil {
		return fmt.Errorf("clearing the earlier dev sled in %s: %w", d.cfg.DataDir, err)
	}
	return os.RemoveAll(d.cfg.DataDir)
}

// guestImage builds the test guest (once per machine: a few minutes, it
// downloads Debian's kernel) and copies it into the sled's image dir.
func (d *devLinux) guestImage() error {
	fmt.Fprintln(d.progress, "dev: making the test guest's image (the first time on a machine: a few minutes, it downloads Debian's kernel)…")
	src, err := testguest.Build(func(format string, args ...any) {
		fmt.Fprintf(d.progress, "dev:   "+format+"\n", args...)
	})
	if err != nil {
		return fmt.Errorf("the test guest: %w", err)
	}
	d.image = filepath.Join(d.cfg.VMMImageDir, devGuestImage)
	if err := testguest.CopyTo(d.image, src); err != nil {
		return fmt.Errorf("copying the test guest's image: %w", err)
	}
	return nil
}

// dnsRecords are what the sled's internal DNS adds for a Linux sled: the
// reference NTP server as the rack's boundary NTP, which the internal NTP
// zone follows.
func (d *devLinux) dnsRecords() dns.Records {
	return dns.Records{AAAA: map[string][]netip.Addr{dns.BoundaryNTPName: {netip.MustParseAddr(devReferenceAddr)}}}
}

// vmmWaitWord is the VMM's state as the agent reports it, for a progress
// line.
func vmmWaitWord(ctx context.Context, c *client.Client, id string) string {
	v, err := findVMM(ctx, c, id)
	if err != nil {
		return err.Error()
	}
	return "VMM " + vmmState(v)
}

// ansiControl matches the terminal control sequences a console's output
// holds (OVMF clears the screen and moves the cursor).
var ansiControl = regexp.MustCompile(`\x1b(\[[0-9;=?]*[ -/]*[@-~]|[@-Z\\-_])`)

// lastLines is the last n non-empty lines of the console output b, with
// terminal control sequences and characters dropped.
func lastLines(b []byte, n int) []string {
	var lines []string
	for _, l := range strings.Split(ansiControl.ReplaceAllString(string(b), ""), "\n") {
		l = strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f {
				return -1
			}
			return r
		}, l)
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines[max(0, len(lines)-n):]
}

// close removes everything the sled made: its zones, guests' QEMUs,
// namespaces, links, mounts and loop devices (a teardown), the reference
// NTP server, and, unless keep, the data dir. It says what it removed, and
// what it left and why.
func (d *devLinux) close(keep bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*devTeardownWait)
	defer cancel()
	fmt.Fprintln(d.progress, "dev: removing every zone, guest, mount and loop device the sleds made, and the rack…")
	var err error
	if d.rack == nil {
		// A dev that did not get as far as naming its rack (or a test's
		// cleanup of one): its parts are named from the sled's config.
		d.rack, err = newDevRack(d.cfg, cmp.Or(d.logLevel, "warn"), d.progress, d.log)
	}
	if err == nil {
		err = d.rack.close(ctx, keep)
	}
	err = errors.Join(err, d.teardown(ctx))
	if d.ref != nil {
		err = errors.Join(err, d.ref.Close())
	}
	if err == nil && d.cfg.ZoneTag != agent.DefaultZoneTag {
		// Nothing of the tag is left to lock.
		err = agent.RemoveHostLock(d.cfg.ZoneTag)
	}
	if !keep && err == nil {
		err = os.RemoveAll(d.cfg.DataDir)
	}
	if err != nil {
		return fmt.Errorf("removing the dev sleds: %w (what is left is listed by sudo ./sled-agent teardown --runtime linux --data-dir %s --yes; the next dev clears it)", err, d.cfg.DataDir)
	}
	what := "and its data dir " + d.cfg.DataDir
	if keep {
		what = "and kept its data dir " + d.cfg.DataDir + " (--keep)"
	}
	fmt.Fprintf(d.progress, "dev: removed everything the sleds made, the rack, %s\n", what)
	return nil
}

// teardown is `sled-agent teardown` of the sled's data dir, printing what
// it left and why.
func (d *devLinux) teardown(ctx context.Context) error {
	r, err := agent.TeardownReport(ctx, d.cfg, d.log)
	for _, l := range r.Left {
		fmt.Fprintln(d.progress, "dev: left", l)
	}
	zones := 0
	for _, l := range r.Removed {
		if strings.HasPrefix(l, "zone ") {
			zones++
		}
	}
	if err == nil {
		fmt.Fprintf(d.progress, "dev: removed %d zones and %d other parts (leftovers, pools, loop devices, the run dir)\n", zones, len(r.Removed)-zones)
	}
	return err
}

// emptyOrAbsent reports whether dir does not exist or holds nothing.
func emptyOrAbsent(dir string) bool {
	entries, err := os.ReadDir(dir)
	return errors.Is(err, fs.ErrNotExist) || err == nil && len(entries) == 0
}

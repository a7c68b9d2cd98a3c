package cli

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// helpFlag is a flag as a command's help lists it.
type helpFlag struct {
	// def is the default the help shows, as cobra prints it ("3", "\"x\""),
	// or "" for none; usage is the rest of the line.
	def, usage string
}

// helpPage is what `sled-agent <path> --help` says of flags.
type helpPage struct {
	flags map[string]helpFlag
	// global: the page has a "Global Flags:" section, flags of another
	// command.
	global bool
}

var (
	helpFlagLine = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9-]+)(?: [a-zA-Z0-9]+)?\s{2,}(.*)$`)
	helpDefault  = regexp.MustCompile(`\(default ([^:].*)\)$`)
)

// help runs `sled-agent <path> --help` and parses the flags it lists.
func help(t *testing.T, path ...string) helpPage {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append(slices.Clone(path), "--help"), &stdout, &stderr); code != 0 {
		t.Fatalf("sled-agent %s --help: exit %d: %s", strings.Join(path, " "), code, stderr.String())
	}
	page := helpPage{flags: map[string]helpFlag{}}
	section := ""
	for _, line := range strings.Split(stdout.String(), "\n") {
		switch {
		case line == "Flags:" || line == "Global Flags:":
			section = line
			page.global = page.global || line == "Global Flags:"
			continue
		case line == "" || !strings.HasPrefix(line, " "):
			section = ""
			continue
		}
		if section == "" {
			continue
		}
		m := helpFlagLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("sled-agent %s --help: a flag line this test cannot read: %q", strings.Join(path, " "), line)
		}
		f := helpFlag{usage: m[2]}
		if d := helpDefault.FindStringSubmatch(m[2]); d != nil {
			f.def = d[1]
		}
		page.flags[m[1]] = f
	}
	return page
}

// commandPaths returns the path of every command under root (root's own
// name left out), parents first.
func commandPaths(root *cobra.Command) [][]string {
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			p := append(slices.Clone(path), sub.Name())
			paths = append(paths, p)
			walk(sub, p)
		}
	}
	walk(root, nil)
	return paths
}

func names(flags map[string]helpFlag) []string { return slices.Sorted(maps.Keys(flags)) }

// operatorCommands talk to an agent: they, and only they, take --url and
// -o.
var operatorCommands = []string{"config", "inventory", "zones", "zone", "vmm"}

// Every command's help lists its own flags only: no command shows another's
// (a "Global Flags" section), the operator commands that run take --url
// (and -o, but for those that print one form only), and no other command
// takes either, but vpc's -o (it reads the data path, not the agent).
func TestHelpListsEachCommandsOwnFlags(t *testing.T) {
	root := newRoot()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	paths := commandPaths(root)
	if len(paths) < 30 {
		t.Fatalf("%d commands found; the walk missed some", len(paths))
	}
	for _, path := range paths {
		if path[0] == "help" {
			continue // help --help is help's own page
		}
		name := strings.Join(path, " ")
		page := help(t, path...)
		if page.global {
			t.Errorf("sled-agent %s --help lists another command's flags (Global Flags)", name)
		}
		cmd, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		_, hasURL := page.flags["url"]
		_, hasOutput := page.flags["output"]
		operator := slices.Contains(operatorCommands, path[0]) && cmd.Runnable()
		oneForm := name == "config put" || name == "vmm console"
		// vpc reads the data path's socket, not the agent, in both forms.
		wantOutput := operator && !oneForm || name == "vpc"
		if hasURL != operator || hasOutput != wantOutput {
			t.Errorf("sled-agent %s --help: --url listed %v, -o listed %v; want --url %v, -o %v", name, hasURL, hasOutput, operator, wantOutput)
		}
	}
}

// run's help lists every daemon flag (but the hidden ones tests use) and
// --config; dev's and teardown's list those they use, with the defaults
// they use.
func TestHelpOfTheDaemonCommands(t *testing.T) {
	var daemon []string
	newDaemonFlags().all.VisitAll(func(fl *pflag.Flag) {
		if !fl.Hidden {
			daemon = append(daemon, fl.Name)
		}
	})
	// dev makes a Linux sled's disks, pools and image dir itself, and its
	// NTP zone never sets the clock.
	devMakes := []string{"vdev-dir", "pool-root", "ntp-no-clock", "vmm-image-dir", "netns"}
	var devWant []string
	for _, n := range daemon {
		if !slices.Contains(devMakes, n) {
			devWant = append(devWant, n)
		}
	}
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"run", append(slices.Clone(daemon), "config", "help")},
		{"dev", append(devWant, "config", "help", "sled-config", "keep", "exit-when-converged")},
		{"teardown", []string{"config", "data-dir", "netns", "zone-tag", "netns-prefix", "runtime", "sled-id", "run-dir", "vdev-dir", "pool-root", "log-level", "yes", "help"}},
	} {
		got := names(help(t, tc.cmd).flags)
		slices.Sort(tc.want)
		if !slices.Equal(got, tc.want) {
			t.Errorf("sled-agent %s --help lists\n  %v\nwant\n  %v", tc.cmd, got, tc.want)
		}
	}

	run := help(t, "run").flags
	dev := help(t, "dev").flags
	// dev's sled is the example config's: its zones' addresses are in the
	// underlay /64 dev defaults to.
	if def := dev["underlay-ip"].def; def != `"fd00:1122:3344:103::1"` {
		t.Errorf("dev --help: --underlay-ip default %s, want dev's own, the example sled's", def)
	}
	if !bytes.Contains(sledconfig.Example(), []byte("fd00:1122:3344:103::")) {
		t.Errorf("the example config has no zone in fd00:1122:3344:103::/64, dev's sled")
	}
	for flag, want := range map[string]string{"log-level": `"warn"`, "bootstrap-prefix": `"fdb0:a840:2504:103::/64"`, "data-dir": "", "ddm-url": ""} {
		if got := dev[flag].def; got != want {
			t.Errorf("dev --help: --%s default %q, want %q", flag, got, want)
		}
	}
	for flag, says := range map[string]string{"data-dir": "temporary dir", "run-dir": devLinuxRunDir, "runtime": "root", "ddm-url": "simulator", "dns-server": "simulator", "nexus": "simulator"} {
		if !strings.Contains(dev[flag].usage, says) {
			t.Errorf("dev --help: --%s %q does not say its default (%s)", flag, dev[flag].usage, says)
		}
	}
	for flag, want := range map[string]string{"underlay-ip": `"fd00:1122:3344:101::1"`, "log-level": `"info"`, "ddm-url": `"http://[::1]:8000"`} {
		if got := run[flag].def; got != want {
			t.Errorf("run --help: --%s default %s, want %s", flag, got, want)
		}
	}
}

// The flags of `run` that docs/running-on-linux.md lists are exactly run's
// (but the hidden ones tests use): its list, the bullets after the line
// that begins "`run` flags", names every one, and no other.
func TestRunFlagsDocumented(t *testing.T) {
	const doc = "docs/running-on-linux.md"
	lines := strings.Split(string(readFile(t, doc)), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "`run` flags") })
	if start < 0 {
		t.Fatalf("%s: no line begins \"`run` flags\"", doc)
	}
	flagName := regexp.MustCompile("`--([a-z0-9-]+)")
	listed := map[string]bool{}
	inList := false
	for _, l := range lines[start+1:] {
		switch {
		case strings.HasPrefix(l, "- "):
			inList = true
		case inList && strings.HasPrefix(l, "  "):
		case !inList && l == "":
			continue
		default:
			inList = false
		}
		if !inList {
			break
		}
		for _, m := range flagName.FindAllStringSubmatch(l, -1) {
			listed[m[1]] = true
		}
	}
	if len(listed) == 0 {
		t.Fatalf("%s: no flag in the list after \"`run` flags\"", doc)
	}
	fs := newRunCmd().Flags()
	fs.VisitAll(func(fl *pflag.Flag) {
		if !fl.Hidden && !listed[fl.Name] {
			t.Errorf("%s: the list of run's flags does not name --%s", doc, fl.Name)
		}
	})
	for _, n := range slices.Sorted(maps.Keys(listed)) {
		if fl := fs.Lookup(n); fl == nil || fl.Hidden {
			t.Errorf("%s: the list of run's flags names --%s, which run does not take", doc, n)
		}
	}
}

// dev and teardown read run's config file: a key for a flag they do not
// take is read as run reads it, so that one file serves all three; a key
// no command knows is still refused, naming it.
func TestConfigFileKeysOfFlagsACommandDoesNotTake(t *testing.T) {
	write := func(doc string) string {
		file := filepath.Join(t.TempDir(), "agent.json")
		if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	dataDir := t.TempDir()
	var stdout, stderr bytes.Buffer
	// Run's keys teardown does not use: read, and nothing comes of them.
	file := write(`{"data-dir": "` + dataDir + `", "nat-period": "5s", "underlay-ip": "fd00:1122:3344:1f0::1", "skip-timesync": true}`)
	if code := run([]string{"teardown", "--config", file, "--yes"}, &stdout, &stderr); code != 0 {
		t.Errorf("teardown --config with run's keys: exit %d: %s", code, stderr.String())
	}
	for _, tc := range []struct {
		args []string
		doc  string
		want string
	}{
		// A key teardown does not take as a flag, with a value it refuses.
		{[]string{"teardown", "--yes"}, `{"data-dir": "` + dataDir + `", "sim-faults": "faults.json"}`, "teardown takes no sim faults"},
		// A file's runtime is checked as dev's flag is.
		{[]string{"dev"}, `{"runtime": "lnux"}`, "dev runs sim or linux"},
		// A bad value of a key dev does not take is refused as run would.
		{[]string{"dev"}, `{"ntp-no-clock": "yes"}`, `"ntp-no-clock"`},
		{[]string{"teardown", "--yes"}, `{"nat-perod": "5s"}`, "nat-perod"},
	} {
		stdout.Reset()
		stderr.Reset()
		args := append(slices.Clone(tc.args), "--config", write(tc.doc))
		if code := run(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("sled-agent %s with %s: exit %d, %q; want a refusal naming %q", strings.Join(tc.args, " "), tc.doc, code, stderr.String(), tc.want)
		}
	}
	// The flags a command does not take are not on its command line.
	stderr.Reset()
	if code := run([]string{"teardown", "--data-dir", dataDir, "--nat-period", "5s", "--yes"}, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "nat-period") {
		t.Errorf("teardown --nat-period: exit %d, %q; want it refused", code, stderr.String())
	}
}

package chrony

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestRenderInternalTrackOnly(t *testing.T) {
	conf, sources, err := Render(Config{
		Root:    "/z/oxz_ntp_1/root",
		Kind:    Internal,
		Servers: addrs("fd00:1122:3344:101::21", "fd00:1122:3344:102::22"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `# chronyd (internal), written by sled-agent from the zone's config: edits
# are overwritten.
user root
pidfile /z/oxz_ntp_1/root/chrony/chronyd.pid
driftfile /z/oxz_ntp_1/root/chrony/drift
dumpdir /z/oxz_ntp_1/root/chrony/dump
ntsdumpdir /z/oxz_ntp_1/root/chrony/dump
logdir /z/oxz_ntp_1/root/chrony/log
bindcmdaddress /z/oxz_ntp_1/root/chrony/chronyd.sock
cmdport 0
port 0
sourcedir /z/oxz_ntp_1/root/chrony/sources
leapsecmode slew
maxslewrate 2708.333
`
	if string(conf) != want {
		t.Errorf("chrony.conf:\n%s\nwant:\n%s", conf, want)
	}
	wantSources := `# servers of this NTP instance, written by sled-agent
server fd00:1122:3344:101::21 iburst maxdelay 0.1
server fd00:1122:3344:102::22 iburst maxdelay 0.1
`
	if string(sources) != wantSources {
		t.Errorf("sources:\n%s\nwant:\n%s", sources, wantSources)
	}
}

func TestRenderBoundarySetsClock(t *testing.T) {
	conf, sources, err := Render(Config{
		Root:      "/z/b",
		Kind:      Boundary,
		Servers:   addrs("192.0.2.1", "::ffff:192.0.2.2"),
		SetClock:  true,
		Address:   netip.MustParseAddr("fd00:1122:3344:101::21"),
		Allow:     []netip.Prefix{netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("fd00:1122:3344::1/48")},
		SocketDir: "/run/sa/ntp1",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `# chronyd (boundary), written by sled-agent from the zone's config: edits
# are overwritten.
user root
pidfile /z/b/chrony/chronyd.pid
driftfile /z/b/chrony/drift
dumpdir /z/b/chrony/dump
ntsdumpdir /z/b/chrony/dump
logdir /z/b/chrony/log
bindcmdaddress /run/sa/ntp1/chronyd.sock
cmdport 0
bindaddress fd00:1122:3344:101::21
port 123
allow fe80::/10
allow fd00:1122:3344::/48
sourcedir /z/b/chrony/sources
makestep 0.1 3
maxclockerror 60
leapsecmode slew
maxslewrate 2708.333
`
	if string(conf) != want {
		t.Errorf("chrony.conf:\n%s\nwant:\n%s", conf, want)
	}
	wantSources := `# servers of this NTP instance, written by sled-agent
server 192.0.2.1 iburst maxdelay 0.1 minpoll 0 maxpoll 5 maxsamples 8
server 192.0.2.2 iburst maxdelay 0.1 minpoll 0 maxpoll 5 maxsamples 8
`
	if string(sources) != wantSources {
		t.Errorf("sources:\n%s\nwant:\n%s", sources, wantSources)
	}
}

func TestRenderMakestepOnlyWhenItMaySetTheClock(t *testing.T) {
	for _, tc := range []struct {
		kind     Kind
		setClock bool
		want     string // "" for none
	}{
		{Internal, false, ""},
		{Internal, true, "makestep 1.0 3"},
		{Boundary, false, ""},
		{Boundary, true, "makestep 0.1 3"},
		{Reference, false, ""},
	} {
		c := Config{Root: "/r", Kind: tc.kind, SetClock: tc.setClock, Servers: addrs("192.0.2.1")}
		if tc.kind != Internal {
			c.Address = netip.MustParseAddr("127.0.0.1")
		}
		if tc.kind == Reference {
			c.Servers = nil
		}
		conf, _, err := Render(c)
		if err != nil {
			t.Fatalf("%v setClock=%v: %v", tc.kind, tc.setClock, err)
		}
		var got []string
		for l := range strings.Lines(string(conf)) {
			if strings.HasPrefix(l, "makestep") || strings.HasPrefix(l, "rtcsync") {
				got = append(got, strings.TrimSpace(l))
			}
		}
		var want []string
		if tc.want != "" {
			want = []string{tc.want}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%v setClock=%v: clock lines %q, want %q", tc.kind, tc.setClock, got, want)
		}
		args := c.Args()
		if hasX := slices.Contains(args, "-x"); hasX == tc.setClock {
			t.Errorf("%v setClock=%v: args %q", tc.kind, tc.setClock, args)
		}
	}
}

func TestRenderReference(t *testing.T) {
	conf, _, err := Render(Config{
		Root:    "/t/ref",
		Kind:    Reference,
		Address: netip.MustParseAddr("127.0.0.2"),
		Port:    12345,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := string(conf)
	for _, l := range []string{"bindaddress 127.0.0.2\n", "port 12345\n", "allow\n", "local stratum 8\n", "cmdport 0\n"} {
		if !strings.Contains(s, "\n"+l) {
			t.Errorf("no %q in:\n%s", l, s)
		}
	}
	for _, l := range []string{"sourcedir", "makestep", "server"} {
		if strings.Contains(s, "\n"+l) {
			t.Errorf("%q in:\n%s", l, s)
		}
	}
}

func TestRenderTestPollAndPort(t *testing.T) {
	_, sources, err := Render(Config{
		Root:       "/t/c",
		Kind:       Internal,
		Servers:    addrs("127.0.0.2"),
		ServerPort: 4123,
		Poll:       &Poll{Min: -2, Max: 0},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "server 127.0.0.2 iburst maxdelay 0.1 minpoll -2 maxpoll 0 port 4123\n"
	if !strings.HasSuffix(string(sources), want) {
		t.Errorf("sources:\n%s\nwant the line %q", sources, want)
	}
}

func TestRenderRefuses(t *testing.T) {
	long := "/" + strings.Repeat("d", MaxSocketDir)
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"relative root", Config{Root: "z/root", Kind: Internal}},
		{"unclean root", Config{Root: "/z/../root", Kind: Internal}},
		{"root with a space", Config{Root: "/z/a root", Kind: Internal}},
		{"root too long for the socket", Config{Root: long, Kind: Internal}},
		{"socket dir too long", Config{Root: "/z", SocketDir: long, Kind: Internal}},
		{"relative socket dir", Config{Root: "/z", SocketDir: "run/x", Kind: Internal}},
		{"no kind", Config{Root: "/z"}},
		{"boundary without servers", Config{Root: "/z", Kind: Boundary, Address: netip.MustParseAddr("fd00::1")}},
		{"boundary without address", Config{Root: "/z", Kind: Boundary, Servers: addrs("192.0.2.1")}},
		{"boundary on the unspecified address", Config{Root: "/z", Kind: Boundary, Servers: addrs("192.0.2.1"), Address: netip.MustParseAddr("::")}},
		{"zoned server", Config{Root: "/z", Kind: Internal, Servers: addrs("fe80::1%eth0")}},
		{"multicast server", Config{Root: "/z", Kind: Internal, Servers: addrs("ff02::101")}},
		{"invalid server", Config{Root: "/z", Kind: Internal, Servers: []netip.Addr{{}}}},
		{"reference with servers", Config{Root: "/z", Kind: Reference, Address: netip.MustParseAddr("127.0.0.1"), Servers: addrs("192.0.2.1")}},
		{"reference setting the clock", Config{Root: "/z", Kind: Reference, Address: netip.MustParseAddr("127.0.0.1"), SetClock: true}},
		{"reference stratum 16", Config{Root: "/z", Kind: Reference, Address: netip.MustParseAddr("127.0.0.1"), Stratum: 16}},
		{"poll out of range", Config{Root: "/z", Kind: Internal, Poll: &Poll{Min: -7, Max: 0}}},
		{"poll upside down", Config{Root: "/z", Kind: Internal, Poll: &Poll{Min: 3, Max: 2}}},
		{"invalid allow", Config{Root: "/z", Kind: Boundary, Servers: addrs("192.0.2.1"), Address: netip.MustParseAddr("fd00::1"), Allow: []netip.Prefix{{}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Render(tc.c); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Render: %v, want ErrInvalidConfig", err)
			}
			c := tc.c
			if c.Root == "/z" { // a case not about the root: nothing may appear in it
				c.Root = filepath.Join(t.TempDir(), "never")
			}
			if err := Write(c); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Write: %v, want ErrInvalidConfig", err)
			}
			if _, err := os.Stat(c.Root); err == nil {
				t.Error("Write created the root of a config it refused")
			}
		})
	}
}

func TestWriteMakesPrivateDirsAndFiles(t *testing.T) {
	root := t.TempDir()
	sockDir := filepath.Join(t.TempDir(), "sock")
	c := Config{Root: root, Kind: Internal, Servers: addrs("192.0.2.1"), SocketDir: sockDir}
	// A chrony dir left open by someone: Write closes it.
	if err := os.MkdirAll(filepath.Join(root, "chrony"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(c); err != nil {
		t.Fatal(err)
	}
	p := c.Paths()
	for _, d := range []string{p.Dir, p.SocketDir} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want 0700", d, st.Mode().Perm())
		}
	}
	conf, sources, _ := Render(c)
	for path, want := range map[string][]byte{p.Conf: conf, p.Sources: sources} {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s:\n%s\nwant:\n%s", path, got, want)
		}
	}
	if p.Socket != filepath.Join(sockDir, "chronyd.sock") {
		t.Errorf("socket %s", p.Socket)
	}
}

// An NTP zone's socket directory is short and per zone: the default tag's
// and a test tag's fit a unix socket's path, and are rendered as they are.
func TestSocketDir(t *testing.T) {
	const id = "3c3a8e4b-6d4f-4c6e-9a51-2c0f3e2b9a11"
	if got, want := SocketDir("sled-agent", id), "/run/sled-agent-ntp/sled-agent-"+id; got != want {
		t.Fatalf("SocketDir = %q, want %q", got, want)
	}
	for _, tag := range []string{"sled-agent", "zt0a1b2c", strings.Repeat("t", 29)} {
		c := Config{Root: "/" + strings.Repeat("r", 200), Kind: Internal, SocketDir: SocketDir(tag, id)}
		conf, _, err := Render(c)
		if err != nil {
			t.Fatalf("tag %q: %v", tag, err)
		}
		if want := "bindcmdaddress " + SocketDir(tag, id) + "/chronyd.sock\n"; !strings.Contains(string(conf), want) {
			t.Errorf("tag %q: chrony.conf lacks %q:\n%s", tag, want, conf)
		}
	}
	if _, _, err := Render(Config{Root: "/z", Kind: Internal, SocketDir: SocketDir(strings.Repeat("t", 30), id)}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a 30-byte tag: Render = %v, want ErrInvalidConfig", err)
	}
}

package dns

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	miekg "github.com/miekg/dns"
)

// Two switch zones, as the rack's internal DNS has them.
const (
	switch0  = "dendrite-a0a0a0a0-0000-4000-8000-000000000000.host.control-plane.oxide.internal"
	switch1  = "dendrite-b1b1b1b1-1111-4111-8111-111111111111.host.control-plane.oxide.internal"
	dendrite = "_dendrite._tcp.control-plane.oxide.internal"
)

func twoSwitches() Records {
	return Records{
		SRV: map[string][]SRV{
			dendrite: {{Target: switch0, Port: 12224}, {Target: switch1, Port: 12224}},
		},
		AAAA: map[string][]netip.Addr{
			switch0: {netip.MustParseAddr("fd00:1122:3344:101::2")},
			switch1: {netip.MustParseAddr("fd00:1122:3344:102::2")},
		},
	}
}

// startServer starts a server on 127.0.0.1 with a random port, closed when
// the test ends.
func startServer(t *testing.T, r Records) *Server {
	t.Helper()
	s := NewServer(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err := s.SetRecords(r); err != nil {
		t.Fatal(err)
	}
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// testWriter logs into the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// exchange asks s one question over proto ("udp" or "tcp").
func exchange(t *testing.T, s *Server, proto, name string, qtype uint16) *miekg.Msg {
	t.Helper()
	m := new(miekg.Msg)
	m.SetQuestion(name, qtype)
	c := &miekg.Client{Net: proto, Timeout: 5 * time.Second}
	resp, _, err := c.Exchange(m, s.Addr().String())
	if err != nil {
		t.Fatalf("%s %s %s: %v", proto, name, miekg.TypeToString[qtype], err)
	}
	return resp
}

func TestServerAnswers(t *testing.T) {
	s := startServer(t, twoSwitches())
	if s.Addr().Port() == 0 || s.Addr().Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("Addr() = %s", s.Addr())
	}
	tests := []struct {
		name    string
		qname   string
		qtype   uint16
		rcode   int
		aa      bool
		answers []string // the answers' text, TTL 0 included
		extra   []string
		soa     bool // an SOA in the authority section
	}{{
		name: "srv", qname: dendrite + ".", qtype: miekg.TypeSRV, rcode: miekg.RcodeSuccess, aa: true,
		answers: []string{
			dendrite + ".\t0\tIN\tSRV\t0 0 12224 " + switch0 + ".",
			dendrite + ".\t0\tIN\tSRV\t0 0 12224 " + switch1 + ".",
		},
		extra: []string{
			switch0 + ".\t0\tIN\tAAAA\tfd00:1122:3344:101::2",
			switch1 + ".\t0\tIN\tAAAA\tfd00:1122:3344:102::2",
		},
	}, {
		name: "aaaa", qname: switch1 + ".", qtype: miekg.TypeAAAA, rcode: miekg.RcodeSuccess, aa: true,
		answers: []string{switch1 + ".\t0\tIN\tAAAA\tfd00:1122:3344:102::2"},
	}, {
		name: "case does not matter", qname: strings.ToUpper(switch1) + ".", qtype: miekg.TypeAAAA, rcode: miekg.RcodeSuccess, aa: true,
		answers: []string{strings.ToUpper(switch1) + ".\t0\tIN\tAAAA\tfd00:1122:3344:102::2"},
	}, {
		name: "unknown name", qname: "_nexus._tcp." + Zone + ".", qtype: miekg.TypeSRV, rcode: miekg.RcodeNameError, aa: true, soa: true,
	}, {
		name: "known name, other type", qname: switch0 + ".", qtype: miekg.TypeSRV, rcode: miekg.RcodeSuccess, aa: true, soa: true,
	}, {
		name: "known name, A", qname: switch0 + ".", qtype: miekg.TypeA, rcode: miekg.RcodeSuccess, aa: true, soa: true,
	}, {
		name: "empty non-terminal", qname: "_tcp." + Zone + ".", qtype: miekg.TypeSRV, rcode: miekg.RcodeSuccess, aa: true, soa: true,
	}, {
		name: "apex soa", qname: Zone + ".", qtype: miekg.TypeSOA, rcode: miekg.RcodeSuccess, aa: true,
		answers: []string{Zone + ".\t0\tIN\tSOA\tns." + Zone + ". admin." + Zone + ". 1 3600 600 86400 0"},
	}, {
		name: "outside the zone", qname: "example.com.", qtype: miekg.TypeAAAA, rcode: miekg.RcodeRefused,
	}, {
		name: "parent of the zone", qname: "oxide.internal.", qtype: miekg.TypeSOA, rcode: miekg.RcodeRefused,
	}}
	for _, proto := range []string{"udp", "tcp"} {
		for _, tt := range tests {
			t.Run(proto+"/"+tt.name, func(t *testing.T) {
				resp := exchange(t, s, proto, tt.qname, tt.qtype)
				if resp.Rcode != tt.rcode || resp.Authoritative != tt.aa {
					t.Errorf("rcode %s aa %v, want %s aa %v", miekg.RcodeToString[resp.Rcode], resp.Authoritative,
						miekg.RcodeToString[tt.rcode], tt.aa)
				}
				if diff := cmp.Diff(tt.answers, rrStrings(resp.Answer), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("answers (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tt.extra, rrStrings(resp.Extra), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("additional (-want +got):\n%s", diff)
				}
				if gotSOA := len(resp.Ns) == 1 && resp.Ns[0].Header().Rrtype == miekg.TypeSOA; gotSOA != tt.soa {
					t.Errorf("authority %v, want an SOA: %v", resp.Ns, tt.soa)
				}
			})
		}
	}
}

func rrStrings(rrs []miekg.RR) []string {
	var s []string
	for _, rr := range rrs {
		s = append(s, rr.String())
	}
	return s
}

func TestServerTruncatesOverUDP(t *testing.T) {
	r := manySwitches(64)
	s := startServer(t, r)
	udp := exchange(t, s, "udp", dendrite+".", miekg.TypeSRV)
	if !udp.Truncated || len(udp.Answer) == 64 {
		t.Errorf("udp: truncated %v with %d answers, want truncated", udp.Truncated, len(udp.Answer))
	}
	tcp := exchange(t, s, "tcp", dendrite+".", miekg.TypeSRV)
	if tcp.Truncated || len(tcp.Answer) != 64 {
		t.Errorf("tcp: truncated %v with %d answers, want all 64", tcp.Truncated, len(tcp.Answer))
	}
}

// manySwitches has n targets for dendrite, too many for one UDP answer.
func manySwitches(n int) Records {
	r := Records{SRV: map[string][]SRV{}, AAAA: map[string][]netip.Addr{}}
	for i := range n {
		target := "dendrite-" + strings.Repeat(string(rune('a'+i%26)), 8) + "-" + string(rune('a'+i/26)) +
			"000-4000-8000-000000000000.host." + Zone
		r.SRV[dendrite] = append(r.SRV[dendrite], SRV{Target: target, Port: 12224})
		r.AAAA[target] = []netip.Addr{netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x00, 2: 0x11, 3: 0x22, 6: 1, 7: byte(i), 15: 2})}
	}
	return r
}

func TestServerFaults(t *testing.T) {
	s := startServer(t, twoSwitches())
	for _, proto := range []string{"udp", "tcp"} {
		s.SetFault(FaultServfail)
		if resp := exchange(t, s, proto, switch0+".", miekg.TypeAAAA); resp.Rcode != miekg.RcodeServerFailure {
			t.Errorf("%s: servfail fault: rcode %s", proto, miekg.RcodeToString[resp.Rcode])
		}

		s.SetFault(FaultDrop)
		m := new(miekg.Msg)
		m.SetQuestion(switch0+".", miekg.TypeAAAA)
		c := &miekg.Client{Net: proto, Timeout: 100 * time.Millisecond}
		if resp, _, err := c.Exchange(m, s.Addr().String()); err == nil {
			t.Errorf("%s: drop fault: got an answer %v", proto, resp)
		}

		s.SetFault(FaultNone)
		if resp := exchange(t, s, proto, switch0+".", miekg.TypeAAAA); resp.Rcode != miekg.RcodeSuccess || len(resp.Answer) != 1 {
			t.Errorf("%s: no fault: %v", proto, resp)
		}
	}
}

func TestServerLifecycle(t *testing.T) {
	s := NewServer(nil)
	if err := s.Close(); err != nil {
		t.Errorf("Close before Start: %v", err)
	}
	if err := s.Start("127.0.0.1:0"); err == nil {
		t.Error("Start after Close: no error")
	}

	s = NewServer(nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := s.Start("127.0.0.1:0"); err == nil {
		t.Error("second Start: no error")
	}
	// A second server cannot take the same port, for either protocol.
	if err := NewServer(nil).Start(s.Addr().String()); err == nil {
		t.Error("Start on a port in use: no error")
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := NewServer(nil).Start("127.0.0.1:not-a-port"); err == nil {
		t.Error("Start on a bad address: no error")
	}
}

func TestRecordsValidate(t *testing.T) {
	addr := netip.MustParseAddr("fd00::1")
	tests := []struct {
		name string
		r    Records
		want []string // in the error; none means valid
	}{
		{name: "empty"},
		{name: "two switches", r: twoSwitches()},
		{name: "trailing dot and upper case", r: Records{
			SRV:  map[string][]SRV{"_DENDRITE._tcp." + Zone + ".": {{Target: "x." + Zone + ".", Port: 1}}},
			AAAA: map[string][]netip.Addr{"X." + Zone: {addr}},
		}},
		{name: "name with no records", r: Records{SRV: map[string][]SRV{dendrite: nil}}},
		{name: "srv outside the zone", r: Records{SRV: map[string][]SRV{"_dendrite._tcp.example.com": nil}},
			want: []string{`srv "_dendrite._tcp.example.com": not in the zone`}},
		{name: "srv not a service name", r: Records{SRV: map[string][]SRV{"dendrite." + Zone: nil}},
			want: []string{`srv "dendrite.control-plane.oxide.internal": not a service name`}},
		{name: "srv at the apex", r: Records{SRV: map[string][]SRV{Zone: nil}},
			want: []string{`srv "control-plane.oxide.internal": not a service name`}},
		{name: "bad name", r: Records{AAAA: map[string][]netip.Addr{"a..b." + Zone: nil}},
			want: []string{`aaaa "a..b.control-plane.oxide.internal": not a domain name`}},
		{name: "empty name", r: Records{AAAA: map[string][]netip.Addr{"": nil}},
			want: []string{`aaaa "": not a domain name`}},
		{name: "same name twice", r: Records{AAAA: map[string][]netip.Addr{"x." + Zone: nil, "X." + Zone + ".": nil}},
			want: []string{`aaaa "x.control-plane.oxide.internal": the same name as "X.control-plane.oxide.internal."`}},
		{name: "no target", r: Records{SRV: map[string][]SRV{dendrite: {{Target: ".", Port: 1}}}}},
		{name: "port 0 and bad targets", r: Records{SRV: map[string][]SRV{dendrite: {{Target: switch0}, {Target: "", Port: 1}, {Target: "a..b", Port: 1}}}},
			want: []string{
				`srv "_dendrite._tcp.control-plane.oxide.internal" [0]: port 0`,
				`srv "_dendrite._tcp.control-plane.oxide.internal" [1]: target "": not a domain name`,
				`srv "_dendrite._tcp.control-plane.oxide.internal" [2]: target "a..b": not a domain name`,
			}},
		{name: "bad addresses", r: Records{AAAA: map[string][]netip.Addr{switch0: {
			addr, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("fe80::1%eth0"), {},
		}}},
			want: []string{
				`aaaa "` + switch0 + `" [1]: "10.0.0.1" is not an IPv6 address`,
				`aaaa "` + switch0 + `" [2]: "::ffff:10.0.0.1" is not an IPv6 address`,
				`aaaa "` + switch0 + `" [3]: "fe80::1%eth0" is not an IPv6 address`,
				`aaaa "` + switch0 + `" [4]: "invalid IP" is not an IPv6 address`,
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				s := NewServer(nil)
				if err := s.SetRecords(tt.r); err != nil {
					t.Fatalf("SetRecords: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: %v\nwant it to contain %q", err, w)
				}
			}
			s := NewServer(nil)
			if err := s.SetRecords(tt.r); err == nil {
				t.Error("SetRecords: no error")
			}
			if got := s.Records(); len(got.SRV)+len(got.AAAA) != 0 {
				t.Errorf("bad records were set: %v", got)
			}
		})
	}
}

const twoSwitchesJSON = `{
  "srv": {
    "_dendrite._tcp.control-plane.oxide.internal": [
      {"target": "dendrite-a0a0a0a0-0000-4000-8000-000000000000.host.control-plane.oxide.internal", "port": 12224, "priority": 0, "weight": 0},
      {"target": "dendrite-b1b1b1b1-1111-4111-8111-111111111111.host.control-plane.oxide.internal", "port": 12224}
    ]
  },
  "aaaa": {
    "dendrite-a0a0a0a0-0000-4000-8000-000000000000.host.control-plane.oxide.internal": ["fd00:1122:3344:101::2"],
    "dendrite-b1b1b1b1-1111-4111-8111-111111111111.host.control-plane.oxide.internal": ["fd00:1122:3344:102::2"]
  }
}`

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	s := NewServer(nil)
	if err := s.LoadFile(write("good.json", twoSwitchesJSON)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(twoSwitches(), s.Records(), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Fatalf("records (-want +got):\n%s", diff)
	}

	for _, tt := range []struct{ name, data, want string }{
		{"syntax", `{"srv": `, "unexpected EOF"},
		{"unknown field", `{"SRV": {}, "a": {}}`, `unknown field "a"`},
		{"bad address", `{"aaaa": {"x.control-plane.oxide.internal": ["fd00::1", "nope"]}}`, "nope"},
		{"invalid records", `{"aaaa": {"x.control-plane.oxide.internal": ["10.0.0.1"]}}`,
			`aaaa "x.control-plane.oxide.internal" [0]: "10.0.0.1" is not an IPv6 address`},
		{"port too big", `{"srv": {"` + dendrite + `": [{"target": "x.control-plane.oxide.internal", "port": 70000}]}}`, "70000"},
		{"trailing data", `{} {}`, "data after the records"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := s.LoadFile(write(tt.name+".json", tt.data))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("LoadFile: %v, want an error with %q", err, tt.want)
			}
			if diff := cmp.Diff(twoSwitches(), s.Records(), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("a bad file changed the records (-want +got):\n%s", diff)
			}
		})
	}
	if err := s.LoadFile(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("LoadFile of a missing file: no error")
	}
}

// logRecorder keeps the messages logged.
type logRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logRecorder) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logRecorder) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

func TestWatchFile(t *testing.T) {
	// hang is the hang detector: nothing here should take a second.
	hang, cancelHang := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancelHang()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if hang.Err() != nil {
				t.Fatalf("never saw %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	p := filepath.Join(t.TempDir(), "records.json")
	if err := os.WriteFile(p, []byte(twoSwitchesJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs logRecorder
	s := NewServer(slog.New(slog.NewTextHandler(&logs, nil)))
	s.watchInterval = 5 * time.Millisecond
	if err := s.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.WatchFile(ctx, p)
	}()
	defer func() {
		cancel()
		<-done
	}()

	// Switch 1 replaced at a new address, the file rewritten in place.
	moved := strings.Replace(twoSwitchesJSON, "fd00:1122:3344:102::2", "fd00:1122:3344:103::2", 1)
	if err := os.WriteFile(p, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the new address", func() bool {
		return s.Records().AAAA[switch1][0] == netip.MustParseAddr("fd00:1122:3344:103::2")
	})

	// A bad file is logged and changes nothing.
	if err := os.WriteFile(p, []byte(`{"aaaa": {"x.example.com": []}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the reload error", func() bool { return logs.contains("not in the zone") })
	if got := s.Records().AAAA[switch1][0]; got != netip.MustParseAddr("fd00:1122:3344:103::2") {
		t.Errorf("after a bad file: switch 1 at %s", got)
	}

	// Replaced by renaming, as editors and atomic writers do.
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(twoSwitchesJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	waitFor("the old address back", func() bool {
		return s.Records().AAAA[switch1][0] == netip.MustParseAddr("fd00:1122:3344:102::2")
	})

	// A file gone for a while keeps the records.
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	waitFor("the missing file logged", func() bool { return logs.contains("unreadable") })
	if got := s.Records(); len(got.SRV[dendrite]) != 2 {
		t.Errorf("after the file was removed: %v", got)
	}
}

func TestSwitchRecordsNameEachDaemon(t *testing.T) {
	a := netip.MustParseAddrPort("[fd00:1122:3344:101::2]:12224")
	b := netip.MustParseAddrPort("[fd00:1122:3344:102::2]:12225")
	r := SwitchRecords(a, b)
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := r.SRV["_dendrite._tcp."+Zone]
	if len(srv) != 2 || srv[0].Port != 12224 || srv[1].Port != 12225 {
		t.Fatalf("SRV %+v", srv)
	}
	for i, want := range []netip.Addr{a.Addr(), b.Addr()} {
		if got := r.AAAA[srv[i].Target]; len(got) != 1 || got[0] != want {
			t.Errorf("AAAA of %s = %v, want %v", srv[i].Target, got, want)
		}
	}
}

// Records of two services merged are served together: each is found by
// its own SRV name.
func TestMergedServiceRecordsAreEachFound(t *testing.T) {
	dpd := netip.MustParseAddrPort("[::1]:12224")
	nexus := netip.MustParseAddrPort("[::1]:12221")
	r := SwitchRecords(dpd)
	r.Merge(ServiceRecords("nexus", nexus))
	s := NewServer(nil)
	if err := s.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetRecords(r); err != nil {
		t.Fatal(err)
	}
	res, err := NewResolver([]netip.AddrPort{s.Addr()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for service, want := range map[string]netip.AddrPort{"dendrite": dpd, "nexus": nexus} {
		got, err := res.LookupService(context.Background(), service)
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("%s: %v, %v; want %v", service, got, err, want)
		}
	}
}

package ntpzone

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// dnsServer answers on a loopback UDP port: ntp.test has an AAAA and an A
// record, v6only.test an AAAA, broken.test is SERVFAIL, others NXDOMAIN.
func dnsServer(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		name, qtype := strings.ToLower(q.Question[0].Name), q.Question[0].Qtype
		hdr := dns.RR_Header{Name: q.Question[0].Name, Rrtype: qtype, Class: dns.ClassINET, Ttl: 60}
		switch {
		case name == "broken.test.":
			m.Rcode = dns.RcodeServerFailure
		case name == "ntp.test." && qtype == dns.TypeAAAA, name == "v6only.test." && qtype == dns.TypeAAAA:
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.ParseIP("fd00:1122:3344:1::7b")})
		case name == "ntp.test." && qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.ParseIP("192.0.2.123")})
		case name == "v6only.test.":
		default:
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// deadServer is a loopback UDP port that nothing listens on.
func deadServer(t *testing.T) netip.AddrPort {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(pc.LocalAddr().String())
	pc.Close()
	return a
}

func TestDNSLookup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The dead server first: it is skipped, the live one answers.
	lookup := dnsLookup([]netip.AddrPort{deadServer(t), dnsServer(t)})
	got, err := lookup(ctx, "NTP.test")
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.123"), netip.MustParseAddr("fd00:1122:3344:1::7b")}; err != nil || !slices.Equal(got, want) {
		t.Errorf("ntp.test: %v, %v; want %v", got, err, want)
	}
	if got, err := lookup(ctx, "v6only.test."); err != nil || len(got) != 1 {
		t.Errorf("v6only.test: %v, %v", got, err)
	}
	if _, err := lookup(ctx, "nope.test"); !errors.Is(err, ErrNoSuchName) || !strings.Contains(err.Error(), "NXDOMAIN") {
		t.Errorf("nope.test: %v, want ErrNoSuchName (NXDOMAIN)", err)
	}
	if _, err := lookup(ctx, "broken.test"); err == nil || errors.Is(err, ErrNoSuchName) || !strings.Contains(err.Error(), "SERVFAIL") {
		t.Errorf("broken.test: %v, want a SERVFAIL error", err)
	}
	_, err = dnsLookup([]netip.AddrPort{deadServer(t)})(ctx, "ntp.test")
	if err == nil || errors.Is(err, ErrNoSuchName) {
		t.Errorf("no server answers: %v, want an error", err)
	}
}

// A lookup gives up at its caller's deadline, even when no server answers.
func TestDNSLookupDeadline(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0") // reads nothing, answers nothing
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := dnsLookup([]netip.AddrPort{netip.MustParseAddrPort(pc.LocalAddr().String())})(ctx, "ntp.test")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("lookup = %v, want a deadline error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lookup did not give up at its deadline")
	}
}

func TestValidName(t *testing.T) {
	for s, want := range map[string]bool{
		"0.pool.ntp.org": true, "ntp.example.com.": true, "a_b-c": true, "x": true,
		"": false, ".": false, "a b": false, "a..b": false, "-a.b": false, "a/b": false, strings.Repeat("a", 64): false,
	} {
		if validName(s) != want {
			t.Errorf("validName(%q) = %v, want %v", s, !want, want)
		}
	}
}

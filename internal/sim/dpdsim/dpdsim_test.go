package dpdsim_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

var addrEq = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func start(t *testing.T) (*dpdsim.Server, *dpd.Client) {
	t.Helper()
	s := dpdsim.New(nil, 0)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	c, err := dpd.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return s, c
}

var (
	underlay = netip.MustParseAddr("fd00:1122:3344:101::1")
	target   = dpd.NatTarget{InternalIP: underlay, InnerMAC: dpd.MacAddr{0xa8, 0x40, 0x25, 0xff, 0x80, 0x05}, VNI: 100}
	other    = dpd.NatTarget{InternalIP: netip.MustParseAddr("fd00:1122:3344:102::1"), InnerMAC: dpd.MacAddr{0xa8, 0x40, 0x25, 0xff, 0x80, 0x06}, VNI: 100}
)

const targetJSON = `{"internal_ip":"fd00:1122:3344:101::1","inner_mac":{"a":[168,64,37,255,128,5]},"vni":100}`

func entry(external string, low, high uint16, t dpd.NatTarget) dpd.NatEntry {
	return dpd.NatEntry{External: netip.MustParseAddr(external), Low: low, High: high, Target: t}
}

// get is a raw GET with the right version.
func get(t *testing.T, s *dpdsim.Server, path string) simhttptest.Answer {
	t.Helper()
	return simhttptest.Do(t, "GET", s.URL()+path, "12.0.0", "", "")
}

func TestCreateIsANoOpWhenIdenticalAndRefusesAnyOtherOverlap(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	base := []dpd.NatEntry{
		entry("192.0.2.10", 1000, 1999, target),
		entry("2001:db8::10", 1000, 1999, target),
	}
	for _, e := range base {
		for range 2 {
			if err := c.CreateNAT(ctx, e); err != nil {
				t.Fatalf("CreateNAT(%+v): %v", e, err)
			}
		}
	}
	for _, ip := range []string{"192.0.2.10", "2001:db8::10"} {
		for name, e := range map[string]dpd.NatEntry{
			"same range, other target": entry(ip, 1000, 1999, other),
			"same range, other VNI":    entry(ip, 1000, 1999, dpd.NatTarget{InternalIP: underlay, InnerMAC: target.InnerMAC, VNI: 101}),
			"overlapping low end":      entry(ip, 500, 1000, target),
			"overlapping high end":     entry(ip, 1999, 2500, target),
			"inside":                   entry(ip, 1500, 1500, target),
			"around":                   entry(ip, 0, 65535, target),
			"same low, other high":     entry(ip, 1000, 1998, target),
		} {
			err := c.CreateNAT(ctx, e)
			var apiErr *dpd.APIError
			if !errors.Is(err, dpd.ErrConflict) || !errors.As(err, &apiErr) || apiErr.ErrorCode != "conflicting mapping" || apiErr.RequestID == "" {
				t.Errorf("%s %s: %v, want a 409 with error_code \"conflicting mapping\"", ip, name, err)
			}
		}
	}
	// Neighbours and other addresses are fine.
	more := []dpd.NatEntry{
		entry("192.0.2.10", 999, 999, other),
		entry("192.0.2.10", 2000, 65535, other),
		entry("192.0.2.11", 1000, 1999, other),
		entry("2001:db8::11", 1000, 1999, other),
		entry("::ffff:192.0.2.10", 1000, 1999, other), // the IPv6 table, not the IPv4 one
	}
	for _, e := range more {
		if e.External.Is4In6() {
			a := simhttptest.Do(t, "PUT", s.URL()+"/nat/ipv6/::ffff:192.0.2.10/1000/1999", "12.0.0", "application/json", targetJSON)
			if a.Status != 204 {
				t.Errorf("PUT IPv4-mapped: %d %s", a.Status, a.Body)
			}
			continue
		}
		if err := c.CreateNAT(ctx, e); err != nil {
			t.Errorf("CreateNAT(%+v): %v", e, err)
		}
	}
	if n := len(s.Entries()); n != len(base)+len(more) {
		t.Errorf("%d entries, want %d: %v", n, len(base)+len(more), s.Entries())
	}
	if n := s.Requests()["PUT /nat/ipv4/{ip}/{low}/{high}"]; n != 2+7+3 {
		t.Errorf("PUT /nat/ipv4 counted %d, want 12", n)
	}
}

func TestBadCreatesAre400AndChangeNothing(t *testing.T) {
	s, _ := start(t)
	s.Inject(entry("192.0.2.1", 0, 99, target))
	before := s.Entries()
	for _, tt := range []struct{ name, path, contentType, body string }{
		{"low > high", "/nat/ipv4/192.0.2.2/10/9", "application/json", targetJSON},
		{"IPv6 on the IPv4 route", "/nat/ipv4/2001:db8::1/0/9", "application/json", targetJSON},
		{"IPv4 on the IPv6 route", "/nat/ipv6/192.0.2.2/0/9", "application/json", targetJSON},
		{"IPv4-mapped on the IPv4 route", "/nat/ipv4/::ffff:192.0.2.2/0/9", "application/json", targetJSON},
		{"zone", "/nat/ipv6/fe80::1%25eth0/0/9", "application/json", targetJSON},
		{"garbage address", "/nat/ipv4/nope/0/9", "application/json", targetJSON},
		{"port too big", "/nat/ipv4/192.0.2.2/0/65536", "application/json", targetJSON},
		{"negative port", "/nat/ipv4/192.0.2.2/-1/9", "application/json", targetJSON},
		{"port not a number", "/nat/ipv4/192.0.2.2/x/9", "application/json", targetJSON},
		{"empty body", "/nat/ipv4/192.0.2.2/0/9", "application/json", ""},
		{"null", "/nat/ipv4/192.0.2.2/0/9", "application/json", "null"},
		{"array", "/nat/ipv4/192.0.2.2/0/9", "application/json", "[" + targetJSON + "]"},
		{"trailing data", "/nat/ipv4/192.0.2.2/0/9", "application/json", targetJSON + " x"},
		{"wrong content type", "/nat/ipv4/192.0.2.2/0/9", "text/plain", targetJSON},
		{"MAC as a string", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"internal_ip":"fd00::1","inner_mac":"A8:40:25:FF:80:05","vni":100}`},
		{"short MAC", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"internal_ip":"fd00::1","inner_mac":{"a":[1,2,3,4,5]},"vni":100}`},
		{"no MAC", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"internal_ip":"fd00::1","vni":100}`},
		{"no internal_ip", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"inner_mac":{"a":[1,2,3,4,5,6]},"vni":100}`},
		{"internal_ip IPv4", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"internal_ip":"10.0.0.1","inner_mac":{"a":[1,2,3,4,5,6]},"vni":100}`},
		{"no vni", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"internal_ip":"fd00::1","inner_mac":{"a":[1,2,3,4,5,6]}}`},
		{"vni over 24 bits", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"internal_ip":"fd00::1","inner_mac":{"a":[1,2,3,4,5,6]},"vni":16777216}`},
		{"negative vni", "/nat/ipv4/192.0.2.2/0/9", "application/json", `{"internal_ip":"fd00::1","inner_mac":{"a":[1,2,3,4,5,6]},"vni":-1}`},
	} {
		a := simhttptest.Do(t, "PUT", s.URL()+tt.path, "12.0.0", tt.contentType, tt.body)
		if a.Status != 400 {
			t.Errorf("%s: %d %s, want 400", tt.name, a.Status, a.Body)
			continue
		}
		simhttptest.CheckErrorBody(t, a)
	}
	if diff := cmp.Diff(before, s.Entries(), addrEq); diff != "" {
		t.Errorf("state changed (-want +got):\n%s", diff)
	}
	// Without a Content-Type the body is taken as JSON, as dropshot does;
	// unknown fields are ignored, as serde does.
	body := strings.TrimSuffix(targetJSON, "}") + `,"extra":true}`
	if a := simhttptest.Do(t, "PUT", s.URL()+"/nat/ipv4/192.0.2.2/0/9", "12.0.0", "", body); a.Status != 204 || a.Body != "" {
		t.Errorf("PUT without Content-Type: %d %q, want 204", a.Status, a.Body)
	}
}

func TestGetFindsTheEntryHoldingThePort(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	s.Inject(entry("192.0.2.1", 100, 199, target))
	s.Inject(entry("192.0.2.1", 200, 200, other))
	s.Inject(entry("2001:db8::1", 0, 65535, other))
	for _, tt := range []struct {
		ip   string
		port uint16
		want dpd.NatTarget
	}{
		{"192.0.2.1", 100, target},
		{"192.0.2.1", 150, target},
		{"192.0.2.1", 199, target},
		{"192.0.2.1", 200, other},
		{"2001:db8::1", 0, other},
		{"2001:db8::1", 65535, other},
	} {
		got, err := c.GetNAT(ctx, netip.MustParseAddr(tt.ip), tt.port)
		if err != nil || got != tt.want {
			t.Errorf("GetNAT(%s, %d) = %+v, %v; want %+v", tt.ip, tt.port, got, err, tt.want)
		}
	}
	for _, path := range []string{"/nat/ipv4/192.0.2.1/99", "/nat/ipv4/192.0.2.1/201", "/nat/ipv4/192.0.2.2/150"} {
		a := get(t, s, path)
		if a.Status != 404 {
			t.Errorf("GET %s: %d %s, want 404", path, a.Status, a.Body)
			continue
		}
		if code := simhttptest.CheckErrorBody(t, a); code != "no mapping" || !strings.Contains(a.Body, "no mapping") {
			t.Errorf("GET %s: %s, want error_code and message \"no mapping\"", path, a.Body)
		}
	}
	if a := get(t, s, "/nat/ipv4/192.0.2.1/150"); a.Status != 200 || a.Body != targetJSON {
		t.Errorf("GET raw = %d %s, want 200 %s", a.Status, a.Body, targetJSON)
	}
	if a := get(t, s, "/nat/ipv4/192.0.2.1/65536"); a.Status != 400 {
		t.Errorf("GET port 65536: %d, want 400", a.Status)
	}
}

func TestDeleteRemovesTheEntryHoldingThePortAndIsIdempotent(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	keep := entry("192.0.2.1", 0, 99, target)
	s.Inject(keep)
	s.Inject(entry("192.0.2.1", 100, 199, target))
	s.Inject(entry("2001:db8::1", 0, 65535, target))
	for range 2 {
		if err := c.DeleteNAT(ctx, netip.MustParseAddr("192.0.2.1"), 150); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteNAT(ctx, netip.MustParseAddr("2001:db8::1"), 443); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteNAT(ctx, netip.MustParseAddr("198.51.100.1"), 0); err != nil {
		t.Errorf("DeleteNAT of nothing: %v", err)
	}
	if diff := cmp.Diff([]dpd.NatEntry{keep}, s.Entries(), addrEq); diff != "" {
		t.Errorf("Entries (-want +got):\n%s", diff)
	}
	if a := get(t, s, "/nat/ipv6"); a.Body != `{"items":[],"next_page":null}` {
		t.Errorf("IPv6 addresses after deleting the last entry: %s", a.Body)
	}
	if a := simhttptest.Do(t, "DELETE", s.URL()+"/nat/ipv4/192.0.2.1/x", "12.0.0", "", ""); a.Status != 400 {
		t.Errorf("DELETE bad port: %d, want 400", a.Status)
	}
}

// pageOf is a decoded listing page.
type pageOf[T any] struct {
	Items    []T     `json:"items"`
	NextPage *string `json:"next_page"`
}

// walk lists path page by page with limit ("" for none) and returns the
// items and the size of each page.
func walk[T any](t *testing.T, s *dpdsim.Server, path, limit string) (items []T, sizes []int) {
	t.Helper()
	q := url.Values{}
	if limit != "" {
		q.Set("limit", limit)
	}
	for range 1000 {
		u := path
		if len(q) > 0 {
			u += "?" + q.Encode()
		}
		a := get(t, s, u)
		if a.Status != 200 {
			t.Fatalf("GET %s: %d %s", u, a.Status, a.Body)
		}
		var p pageOf[T]
		if err := json.Unmarshal([]byte(a.Body), &p); err != nil || p.Items == nil {
			t.Fatalf("GET %s: %s: %v", u, a.Body, err)
		}
		items = append(items, p.Items...)
		sizes = append(sizes, len(p.Items))
		if p.NextPage == nil {
			return items, sizes
		}
		q.Set("page_token", *p.NextPage)
	}
	t.Fatalf("GET %s: the listing does not end", path)
	return nil, nil
}

func TestListingsArePagedAndSorted(t *testing.T) {
	s, c := start(t)
	// 150 entries: 70 on one IPv4 address, one on each of 70 others (so
	// that 10.0.0.9 < 10.0.0.10 tests numeric order), 10 on an IPv6 one.
	var want []dpd.NatEntry
	for i := range 70 {
		want = append(want, entry(fmt.Sprintf("10.0.0.%d", i+1), 0, 65535, target))
	}
	for i := range 70 {
		want = append(want, entry("10.0.1.0", uint16(i*100), uint16(i*100+99), target))
	}
	for i := range 10 {
		want = append(want, entry("2001:db8::1", uint16(i*1000), uint16(i*1000+999), other))
	}
	shuffled := append([]dpd.NatEntry(nil), want...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for _, e := range shuffled {
		if err := c.CreateNAT(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(want, s.Entries(), addrEq); diff != "" {
		t.Fatalf("Entries (-want +got):\n%s", diff)
	}
	var wantAddrs []string
	for i := range 70 {
		wantAddrs = append(wantAddrs, fmt.Sprintf("10.0.0.%d", i+1))
	}
	wantAddrs = append(wantAddrs, "10.0.1.0")

	for _, tt := range []struct {
		limit string
		sizes []int
	}{
		{"", []int{64, 7}},
		{"1000", []int{64, 7}},
		{"7", []int{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 1}},
		{"71", []int{64, 7}},
	} {
		addrs, sizes := walk[string](t, s, "/nat/ipv4", tt.limit)
		if diff := cmp.Diff(wantAddrs, addrs); diff != "" {
			t.Errorf("limit %q: addresses (-want +got):\n%s", tt.limit, diff)
		}
		if !cmp.Equal(tt.sizes, sizes) {
			t.Errorf("limit %q: address pages of %v, want %v", tt.limit, sizes, tt.sizes)
		}
	}
	for _, tt := range []struct {
		limit string
		sizes []int
	}{
		{"", []int{64, 6}},
		{"7", []int{7, 7, 7, 7, 7, 7, 7, 7, 7, 7}}, // the last full page says it is the last
		{"70", []int{64, 6}},
		{"1", nil},
	} {
		entries, sizes := walk[dpd.NatEntry](t, s, "/nat/ipv4/10.0.1.0", tt.limit)
		if diff := cmp.Diff(want[70:140], entries, addrEq); diff != "" {
			t.Errorf("limit %q: entries (-want +got):\n%s", tt.limit, diff)
		}
		if tt.sizes != nil && !cmp.Equal(tt.sizes, sizes) {
			t.Errorf("limit %q: entry pages of %v, want %v", tt.limit, sizes, tt.sizes)
		}
	}
	if addrs, _ := walk[string](t, s, "/nat/ipv6", ""); !cmp.Equal(addrs, []string{"2001:db8::1"}) {
		t.Errorf("IPv6 addresses = %v", addrs)
	}
	if entries, _ := walk[dpd.NatEntry](t, s, "/nat/ipv6/2001:db8::1", "3"); !cmp.Equal(want[140:], entries, addrEq) {
		t.Errorf("IPv6 entries = %v", entries)
	}
	if a := get(t, s, "/nat/ipv4/192.0.2.99"); a.Status != 200 || a.Body != `{"items":[],"next_page":null}` {
		t.Errorf("entries of an unused address: %d %s", a.Status, a.Body)
	}
	all, err := c.AllNAT(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, all, addrEq); diff != "" {
		t.Errorf("AllNAT (-want +got):\n%s", diff)
	}
}

func TestBadPageQueriesAre400(t *testing.T) {
	s, _ := start(t)
	for i := range 3 {
		s.Inject(entry(fmt.Sprintf("192.0.2.%d", i+1), 0, 65535, target))
		s.Inject(entry("192.0.2.1", uint16(i), uint16(i), target))
	}
	var p pageOf[string]
	json.Unmarshal([]byte(get(t, s, "/nat/ipv4?limit=1").Body), &p)
	if p.NextPage == nil {
		t.Fatal("no next page")
	}
	addrToken := url.QueryEscape(*p.NextPage)
	for _, path := range []string{
		"/nat/ipv4?limit=0",
		"/nat/ipv4?limit=-1",
		"/nat/ipv4?limit=x",
		"/nat/ipv4?limit=",
		"/nat/ipv4?limit=4294967296",
		"/nat/ipv4?page_token=garbage!",
		"/nat/ipv6?page_token=" + addrToken,           // a token of the IPv4 listing
		"/nat/ipv4/192.0.2.1?page_token=" + addrToken, // a token of the address listing
		"/nat/ipv4/192.0.2.1?limit=0",
	} {
		a := get(t, s, path)
		if a.Status != 400 {
			t.Errorf("GET %s: %d %s, want 400", path, a.Status, a.Body)
			continue
		}
		simhttptest.CheckErrorBody(t, a)
	}
}

func TestSwitchIdentifiers(t *testing.T) {
	s := dpdsim.New(nil, 1)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := get(t, s, "/switch/identifiers")
	var ids map[string]any
	if err := json.Unmarshal([]byte(a.Body), &ids); err != nil || a.Status != 200 {
		t.Fatalf("GET /switch/identifiers = %d %s: %v", a.Status, a.Body, err)
	}
	id, _ := ids["sidecar_id"].(string)
	if _, err := uuid.Parse(id); err != nil {
		t.Errorf("sidecar_id %q: %v", id, err)
	}
	serial, _ := ids["serial"].(string)
	if ids["slot"] != 1.0 || ids["asic_backend"] != "sim" || ids["model"] != "sim" || ids["revision"] != 0.0 || !strings.HasPrefix(serial, "SIM-") {
		t.Errorf("identifiers = %s", a.Body)
	}
	s.RestartEmpty()
	if b := get(t, s, "/switch/identifiers"); b.Body != a.Body {
		t.Errorf("identifiers changed across a restart: %s, then %s", a.Body, b.Body)
	}
	if got := s.SwitchIdentifiers(); got.SidecarID != id || got.Slot != 1 {
		t.Errorf("SwitchIdentifiers() = %+v", got)
	}
	if other := dpdsim.New(nil, 1); other.SwitchIdentifiers().SidecarID == id {
		t.Error("two simulators share a sidecar_id")
	}
}

// The api-version check itself is tested in simhttp.
func TestServesUpToAPIVersion(t *testing.T) {
	s, _ := start(t)
	for _, tt := range []struct {
		version string
		status  int
	}{{dpdsim.APIVersion, 200}, {"11.0.0", 200}, {"12.0.1", 400}, {"13.0.0", 400}} {
		if a := simhttptest.Do(t, "GET", s.URL()+"/nat/ipv4", tt.version, "", ""); a.Status != tt.status {
			t.Errorf("api-version %q: %d %s, want %d", tt.version, a.Status, a.Body, tt.status)
		}
	}
}

func TestUnknownPathsAndMethods(t *testing.T) {
	s, _ := start(t)
	for _, tt := range []struct {
		method, path string
		status       int
		key          string
	}{
		{"GET", "/nonesuch", 404, "GET /nonesuch"},
		{"GET", "/", 404, "GET /"},
		{"GET", "/nat", 404, "GET /nat"},
		{"GET", "/nat/ipv5", 404, "GET /nat/ipv5"},
		{"GET", "/nat/ipv4/192.0.2.1/0/1/2", 404, "GET /nat/ipv4/192.0.2.1/0/1/2"},
		{"GET", "/nat/ipv4/", 404, "GET /nat/ipv4/"},
		{"GET", "/ports", 404, "GET /ports"},             // real, but not simulated
		{"DELETE", "/nat/ipv4", 405, "DELETE /nat/ipv4"}, // real (reset), but not simulated
		{"POST", "/nat/ipv4/192.0.2.1/0/1", 405, "POST /nat/ipv4/{ip}/{low}/{high}"},
		{"GET", "/nat/ipv4/192.0.2.1/0/1", 405, "GET /nat/ipv4/{ip}/{low}/{high}"},
		{"PUT", "/nat/ipv6/2001:db8::1/0", 405, "PUT /nat/ipv6/{ip}/{low}"},
		{"PUT", "/switch/identifiers", 405, "PUT /switch/identifiers"},
	} {
		a := simhttptest.Do(t, tt.method, s.URL()+tt.path, "12.0.0", "", "")
		if a.Status != tt.status {
			t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, a.Status, a.Body, tt.status)
			continue
		}
		simhttptest.CheckErrorBody(t, a)
		if n := s.Requests()[tt.key]; n != 1 {
			t.Errorf("%s %s: counted %d times as %q, want once", tt.method, tt.path, n, tt.key)
		}
	}
}

func TestRequestsAreCountedByRoute(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535, target))
	c.CreateNAT(ctx, entry("192.0.2.2", 0, 65535, target))
	c.CreateNAT(ctx, entry("2001:db8::1", 0, 65535, target))
	c.GetNAT(ctx, netip.MustParseAddr("192.0.2.1"), 0)
	c.DeleteNAT(ctx, netip.MustParseAddr("2001:db8::1"), 0)
	c.AllNAT(ctx)
	c.SwitchIdentifiers(ctx)
	want := map[string]int{
		"PUT /nat/ipv4/{ip}/{low}/{high}": 2,
		"PUT /nat/ipv6/{ip}/{low}/{high}": 1,
		"GET /nat/ipv4/{ip}/{low}":        1,
		"DELETE /nat/ipv6/{ip}/{low}":     1,
		"GET /nat/ipv4":                   1,
		"GET /nat/ipv4/{ip}":              2,
		"GET /nat/ipv6":                   1,
		"GET /switch/identifiers":         1,
	}
	if diff := cmp.Diff(want, s.Requests()); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
}

func TestInject(t *testing.T) {
	s, c := start(t)
	s.Inject(entry("192.0.2.1", 0, 99, target))
	s.Inject(entry("192.0.2.1", 100, 199, target))
	s.Inject(entry("192.0.2.1", 300, 399, target))
	// Another sled's entry replaces the ones it overlaps.
	theirs := entry("192.0.2.1", 50, 150, other)
	s.Inject(theirs)
	want := []dpd.NatEntry{theirs, entry("192.0.2.1", 300, 399, target)}
	if diff := cmp.Diff(want, s.Entries(), addrEq); diff != "" {
		t.Errorf("Entries (-want +got):\n%s", diff)
	}
	if err := c.CreateNAT(t.Context(), entry("192.0.2.1", 0, 65535, target)); !errors.Is(err, dpd.ErrConflict) {
		t.Errorf("CreateNAT over an injected entry: %v, want ErrConflict", err)
	}
	for name, bad := range map[string]dpd.NatEntry{
		"no address":    {Low: 0, High: 1, Target: target},
		"low > high":    entry("192.0.2.1", 2, 1, target),
		"IPv4 internal": entry("192.0.2.1", 0, 1, dpd.NatTarget{InternalIP: netip.MustParseAddr("10.0.0.1")}),
		"big VNI":       entry("192.0.2.1", 0, 1, dpd.NatTarget{InternalIP: underlay, VNI: 1 << 24}),
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Inject(%s) did not panic", name)
				}
			}()
			s.Inject(bad)
		}()
	}
}

// Faults, and restarts dropping connections, are tested in simhttp.
func TestRestartEmptyLosesEntries(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	if err := c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535, target)); err != nil {
		t.Fatal(err)
	}
	s.RestartEmpty()
	got, err := c.AllNAT(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("AllNAT after restart = %v, want empty", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			ip := netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
			for j := range 10 {
				e := dpd.NatEntry{External: ip, Low: uint16(j), High: uint16(j), Target: target}
				if err := c.CreateNAT(ctx, e); err != nil {
					t.Error(err)
				}
				if _, err := c.AllNAT(ctx); err != nil {
					t.Error(err)
				}
				if j%2 == 0 {
					if err := c.DeleteNAT(ctx, ip, uint16(j)); err != nil {
						t.Error(err)
					}
				}
				s.Requests()
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			s.SetFault(dpdsim.FaultNone)
			s.Entries()
		}
	})
	wg.Wait()
	if n := len(s.Entries()); n != 8*5 {
		t.Errorf("%d entries, want 40", n)
	}
}

func TestControlEndpoints(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	ctl := func(method, path, body string) simhttptest.Answer {
		t.Helper()
		return simhttptest.Do(t, method, s.URL()+path, "", "application/json", body)
	}
	if _, err := c.AllNAT(ctx); err != nil {
		t.Fatal(err)
	}

	inject := `{"external": "192.0.2.7", "low": 0, "high": 65535, "target": ` + targetJSON + `}`
	if a := ctl("POST", "/__sim/inject", inject); a.Status != 204 {
		t.Fatalf("inject: %d %s", a.Status, a.Body)
	}
	if diff := cmp.Diff([]dpd.NatEntry{entry("192.0.2.7", 0, 65535, target)}, s.Entries(), addrEq); diff != "" {
		t.Errorf("after inject (-want +got):\n%s", diff)
	}
	for _, bad := range []string{
		`{}`,
		`{"external": "192.0.2.7", "low": 0, "high": 65535}`,
		`{"external": "192.0.2.7", "low": 2, "high": 1, "target": ` + targetJSON + `}`,
		`{"external": "nope", "low": 0, "high": 1, "target": ` + targetJSON + `}`,
		`{"external": "192.0.2.7", "low": 0, "high": 1, "target": {"internal_ip": "fd00::1", "vni": 1}}`,
		`{"external": "192.0.2.7", "low": 0, "high": 1, "target": ` + targetJSON + `, "extra": 1}`,
	} {
		if a := ctl("POST", "/__sim/inject", bad); a.Status != 400 {
			t.Errorf("inject %s: %d, want 400", bad, a.Status)
		} else {
			simhttptest.CheckErrorBody(t, a)
		}
	}

	a := ctl("GET", "/__sim/state", "")
	var st struct {
		Fault    string         `json:"fault"`
		Entries  []dpd.NatEntry `json:"entries"`
		Requests map[string]int `json:"requests"`
	}
	if err := json.Unmarshal([]byte(a.Body), &st); err != nil || a.Status != 200 {
		t.Fatalf("state: %d %s: %v", a.Status, a.Body, err)
	}
	if st.Fault != "none" || len(st.Entries) != 1 || st.Requests["GET /nat/ipv4"] != 1 {
		t.Errorf("state = %+v", st)
	}

	if a := ctl("POST", "/__sim/restart-empty", ""); a.Status != 204 {
		t.Fatalf("restart-empty: %d %s", a.Status, a.Body)
	}
	if got := s.Entries(); len(got) != 0 {
		t.Errorf("after restart-empty: %v", got)
	}
	if a := ctl("GET", "/__sim/state", ""); !strings.Contains(a.Body, `"entries":[]`) {
		t.Errorf("state after restart-empty = %s, want an empty entries array", a.Body)
	}
}

func TestClosedServerSaysErrClosed(t *testing.T) {
	s := dpdsim.New(nil, 0)
	s.Close()
	if err := s.Start("127.0.0.1:0"); !errors.Is(err, dpdsim.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if err := s.SetFault(dpdsim.FaultNone); !errors.Is(err, dpdsim.ErrClosed) {
		t.Errorf("SetFault after Close = %v, want ErrClosed", err)
	}
}

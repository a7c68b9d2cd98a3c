package dpdsim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
)

// Deadlines of the hang detectors; nothing here asserts how fast anything is.
const (
	waitDeadline = 20 * time.Second
	waitInterval = 5 * time.Millisecond
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

// answer is a raw HTTP answer.
type answer struct {
	status int
	body   string
}

// raw sends a request the client would never send. version "" omits the
// api-version header; contentType "" omits Content-Type.
func raw(t *testing.T, method, url, version, contentType, body string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if version != "" {
		req.Header.Set("api-version", version)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, string(b)}
}

// get is raw GET with the right version.
func get(t *testing.T, s *dpdsim.Server, path string) answer {
	t.Helper()
	return raw(t, "GET", s.URL()+path, "12.0.0", "", "")
}

// checkErrorBody checks the upstream error body shape and returns its
// error_code.
func checkErrorBody(t *testing.T, a answer) string {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal([]byte(a.body), &body); err != nil {
		t.Fatalf("error body %q: %v", a.body, err)
	}
	id, _ := body["request_id"].(string)
	if _, err := uuid.Parse(id); err != nil {
		t.Errorf("error body %s: request_id is not a uuid", a.body)
	}
	if msg, _ := body["message"].(string); msg == "" {
		t.Errorf("error body %s: no message", a.body)
	}
	for k := range body {
		if k != "request_id" && k != "message" && k != "error_code" {
			t.Errorf("error body %s: unexpected field %q", a.body, k)
		}
	}
	code, _ := body["error_code"].(string)
	return code
}

// waitFor polls cond until it holds, failing the test after waitDeadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitDeadline); !cond(); time.Sleep(waitInterval) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
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
			a := raw(t, "PUT", s.URL()+"/nat/ipv6/::ffff:192.0.2.10/1000/1999", "12.0.0", "application/json", targetJSON)
			if a.status != 204 {
				t.Errorf("PUT IPv4-mapped: %d %s", a.status, a.body)
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
		a := raw(t, "PUT", s.URL()+tt.path, "12.0.0", tt.contentType, tt.body)
		if a.status != 400 {
			t.Errorf("%s: %d %s, want 400", tt.name, a.status, a.body)
			continue
		}
		checkErrorBody(t, a)
	}
	if diff := cmp.Diff(before, s.Entries(), addrEq); diff != "" {
		t.Errorf("state changed (-want +got):\n%s", diff)
	}
	// Without a Content-Type the body is taken as JSON, as dropshot does;
	// unknown fields are ignored, as serde does.
	body := strings.TrimSuffix(targetJSON, "}") + `,"extra":true}`
	if a := raw(t, "PUT", s.URL()+"/nat/ipv4/192.0.2.2/0/9", "12.0.0", "", body); a.status != 204 || a.body != "" {
		t.Errorf("PUT without Content-Type: %d %q, want 204", a.status, a.body)
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
		if a.status != 404 {
			t.Errorf("GET %s: %d %s, want 404", path, a.status, a.body)
			continue
		}
		if code := checkErrorBody(t, a); code != "no mapping" || !strings.Contains(a.body, "no mapping") {
			t.Errorf("GET %s: %s, want error_code and message \"no mapping\"", path, a.body)
		}
	}
	if a := get(t, s, "/nat/ipv4/192.0.2.1/150"); a.status != 200 || a.body != targetJSON {
		t.Errorf("GET raw = %d %s, want 200 %s", a.status, a.body, targetJSON)
	}
	if a := get(t, s, "/nat/ipv4/192.0.2.1/65536"); a.status != 400 {
		t.Errorf("GET port 65536: %d, want 400", a.status)
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
	if a := get(t, s, "/nat/ipv6"); a.body != `{"items":[],"next_page":null}` {
		t.Errorf("IPv6 addresses after deleting the last entry: %s", a.body)
	}
	if a := raw(t, "DELETE", s.URL()+"/nat/ipv4/192.0.2.1/x", "12.0.0", "", ""); a.status != 400 {
		t.Errorf("DELETE bad port: %d, want 400", a.status)
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
		if a.status != 200 {
			t.Fatalf("GET %s: %d %s", u, a.status, a.body)
		}
		var p pageOf[T]
		if err := json.Unmarshal([]byte(a.body), &p); err != nil || p.Items == nil {
			t.Fatalf("GET %s: %s: %v", u, a.body, err)
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
	if a := get(t, s, "/nat/ipv4/192.0.2.99"); a.status != 200 || a.body != `{"items":[],"next_page":null}` {
		t.Errorf("entries of an unused address: %d %s", a.status, a.body)
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
	json.Unmarshal([]byte(get(t, s, "/nat/ipv4?limit=1").body), &p)
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
		if a.status != 400 {
			t.Errorf("GET %s: %d %s, want 400", path, a.status, a.body)
			continue
		}
		checkErrorBody(t, a)
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
	if err := json.Unmarshal([]byte(a.body), &ids); err != nil || a.status != 200 {
		t.Fatalf("GET /switch/identifiers = %d %s: %v", a.status, a.body, err)
	}
	id, _ := ids["sidecar_id"].(string)
	if _, err := uuid.Parse(id); err != nil {
		t.Errorf("sidecar_id %q: %v", id, err)
	}
	serial, _ := ids["serial"].(string)
	if ids["slot"] != 1.0 || ids["asic_backend"] != "sim" || ids["model"] != "sim" || ids["revision"] != 0.0 || !strings.HasPrefix(serial, "SIM-") {
		t.Errorf("identifiers = %s", a.body)
	}
	s.RestartEmpty()
	if b := get(t, s, "/switch/identifiers"); b.body != a.body {
		t.Errorf("identifiers changed across a restart: %s, then %s", a.body, b.body)
	}
	if got := s.SwitchIdentifiers(); got.SidecarID != id || got.Slot != 1 {
		t.Errorf("SwitchIdentifiers() = %+v", got)
	}
	if other := dpdsim.New(nil, 1); other.SwitchIdentifiers().SidecarID == id {
		t.Error("two simulators share a sidecar_id")
	}
}

func TestAPIVersionHeader(t *testing.T) {
	s, _ := start(t)
	for _, tt := range []struct {
		version string
		status  int
	}{
		{"", 400},
		{"12.0.0", 200},
		{"11.0.0", 200},
		{"1.0.0", 200},
		{"12.0.0-rc.1", 200},
		{"12.0.0+build.5", 200},
		{"12.0.1", 400},
		{"12.1.0-rc1", 400},
		{"13.0.0", 400},
		{"banana", 400},
		{"12.0", 400},
		{"012.0.0", 400},
	} {
		a := raw(t, "GET", s.URL()+"/nat/ipv4", tt.version, "", "")
		if a.status != tt.status {
			t.Errorf("api-version %q: %d %s, want %d", tt.version, a.status, a.body, tt.status)
		}
		if a.status != 200 {
			checkErrorBody(t, a)
		}
	}
	// The version is checked before the path, as in dropshot.
	if a := raw(t, "GET", s.URL()+"/nonesuch", "", "", ""); a.status != 400 {
		t.Errorf("unknown path without version: %d, want 400", a.status)
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
		a := raw(t, tt.method, s.URL()+tt.path, "12.0.0", "", "")
		if a.status != tt.status {
			t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, a.status, a.body, tt.status)
			continue
		}
		checkErrorBody(t, a)
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

func TestFaultError(t *testing.T) {
	s, c := start(t)
	if err := s.SetFault(dpdsim.FaultError); err != nil {
		t.Fatal(err)
	}
	a := raw(t, "PUT", s.URL()+"/nat/ipv4/192.0.2.1/0/65535", "12.0.0", "application/json", targetJSON)
	if a.status != 500 {
		t.Fatalf("under FaultError: %d %s, want 500", a.status, a.body)
	}
	checkErrorBody(t, a)
	if len(s.Entries()) != 0 {
		t.Errorf("a failed create changed the state: %v", s.Entries())
	}
	s.SetFault(dpdsim.FaultNone)
	if err := c.CreateNAT(t.Context(), entry("192.0.2.1", 0, 65535, target)); err != nil {
		t.Errorf("after clearing: %v", err)
	}
}

func TestFaultRefuseClearsOnTheSameAddress(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	addr := s.Addr()
	if _, err := c.SwitchIdentifiers(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.SetFault(dpdsim.FaultRefuse); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := c.SwitchIdentifiers(ctx)
		if !errors.Is(err, dpd.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("under FaultRefuse: %v, want connection refused", err)
		}
	}
	if err := s.SetFault(dpdsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Errorf("address changed from %s to %s", addr, s.Addr())
	}
	if err := c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535, target)); err != nil {
		t.Errorf("after clearing: %v", err)
	}
	if n := s.Requests()["GET /switch/identifiers"]; n != 1 {
		t.Errorf("GET /switch/identifiers served %d times, want 1 (refused ones never arrive)", n)
	}
}

// startHangingCall starts call and waits until the simulator has the
// request; the returned channel gets the call's result.
func startHangingCall(t *testing.T, s *dpdsim.Server, key string, call func() error) <-chan error {
	t.Helper()
	before := s.Requests()[key]
	done := make(chan error, 1)
	go func() { done <- call() }()
	waitFor(t, "the request to arrive", func() bool { return s.Requests()[key] > before })
	return done
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitDeadline):
		t.Fatal("the call did not return")
		return nil
	}
}

func TestFaultHangUntilClientGivesUpOrTheFaultClears(t *testing.T) {
	s, c := start(t)
	s.SetFault(dpdsim.FaultHang)
	c.Timeout = 50 * time.Millisecond
	err := result(t, startHangingCall(t, s, "GET /nat/ipv4", func() error {
		_, err := c.AllNAT(context.Background())
		return err
	}))
	if !errors.Is(err, dpd.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("under FaultHang: %v, want ErrUnreachable wrapping DeadlineExceeded", err)
	}

	c.Timeout = time.Hour
	done := startHangingCall(t, s, "PUT /nat/ipv4/{ip}/{low}/{high}", func() error {
		return c.CreateNAT(t.Context(), entry("192.0.2.1", 0, 65535, target))
	})
	if err := s.SetFault(dpdsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Errorf("CreateNAT released by clearing the fault: %v", err)
	}
	if n := len(s.Entries()); n != 1 {
		t.Errorf("%d entries, want 1", n)
	}
}

func TestRestartEmptyLosesEntriesAndDropsInFlightRequests(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	if err := c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535, target)); err != nil {
		t.Fatal(err)
	}
	s.SetFault(dpdsim.FaultHang)
	// A fresh client: a request on a fresh connection is not retried by
	// the transport when that connection drops.
	fresh, err := dpd.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	fresh.Timeout = time.Hour
	done := startHangingCall(t, s, "GET /nat/ipv4", func() error {
		_, err := fresh.NATAddresses(ctx, false)
		return err
	})
	s.RestartEmpty()
	if err := result(t, done); !errors.Is(err, dpd.ErrUnreachable) {
		t.Errorf("in-flight call across the restart: %v, want ErrUnreachable", err)
	}
	s.SetFault(dpdsim.FaultNone)
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
	ctl := func(method, path, body string) answer {
		t.Helper()
		return raw(t, method, s.URL()+path, "", "application/json", body)
	}
	if a := ctl("PUT", "/__sim/fault", `{"fault": "error"}`); a.status != 204 {
		t.Fatalf("set error fault: %d %s", a.status, a.body)
	}
	var apiErr *dpd.APIError
	if _, err := c.AllNAT(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != 500 {
		t.Errorf("under error fault: %v, want 500", err)
	}
	if a := ctl("PUT", "/__sim/fault", `{"fault": "none"}`); a.status != 204 {
		t.Fatalf("clear fault: %d %s", a.status, a.body)
	}

	inject := `{"external": "192.0.2.7", "low": 0, "high": 65535, "target": ` + targetJSON + `}`
	if a := ctl("POST", "/__sim/inject", inject); a.status != 204 {
		t.Fatalf("inject: %d %s", a.status, a.body)
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
		if a := ctl("POST", "/__sim/inject", bad); a.status != 400 {
			t.Errorf("inject %s: %d, want 400", bad, a.status)
		} else {
			checkErrorBody(t, a)
		}
	}

	a := ctl("GET", "/__sim/state", "")
	var st struct {
		Fault    string         `json:"fault"`
		Entries  []dpd.NatEntry `json:"entries"`
		Requests map[string]int `json:"requests"`
	}
	if err := json.Unmarshal([]byte(a.body), &st); err != nil || a.status != 200 {
		t.Fatalf("state: %d %s: %v", a.status, a.body, err)
	}
	if st.Fault != "none" || len(st.Entries) != 1 || st.Requests["GET /nat/ipv4"] != 1 {
		t.Errorf("state = %+v", st)
	}

	if a := ctl("POST", "/__sim/restart-empty", ""); a.status != 204 {
		t.Fatalf("restart-empty: %d %s", a.status, a.body)
	}
	if got := s.Entries(); len(got) != 0 {
		t.Errorf("after restart-empty: %v", got)
	}
	if a := ctl("GET", "/__sim/state", ""); !strings.Contains(a.body, `"entries":[]`) {
		t.Errorf("state after restart-empty = %s, want an empty entries array", a.body)
	}
	if a := ctl("PUT", "/__sim/fault", `{"fault": "sulk"}`); a.status != 400 {
		t.Errorf("bad fault: %d, want 400", a.status)
	}
	if a := ctl("GET", "/__sim/nonesuch", ""); a.status != 404 {
		t.Errorf("unknown control path: %d, want 404", a.status)
	}

	// A timed refusal answers, refuses, then listens again by itself.
	if a := ctl("PUT", "/__sim/fault", `{"refuse_for": "50ms"}`); a.status != 204 {
		t.Fatalf("refuse_for: %d %s", a.status, a.body)
	}
	waitFor(t, "the refusal to end", func() bool { return s.Fault() == dpdsim.FaultNone })
	if err := c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535, target)); err != nil {
		t.Errorf("after the timed refusal: %v", err)
	}
	for k := range s.Requests() {
		if strings.Contains(k, "__sim") {
			t.Errorf("control request counted: %q", k)
		}
	}
}

func TestStartErrors(t *testing.T) {
	s, _ := start(t)
	if err := s.Start("127.0.0.1:0"); err == nil {
		t.Error("second Start succeeded")
	}
	if err := s.SetFault("sulk"); err == nil {
		t.Error("SetFault of an unknown fault succeeded")
	}
	other := dpdsim.New(nil, 0)
	if err := other.Start(s.Addr()); err == nil {
		other.Close()
		t.Error("Start on a taken address succeeded")
	}
	other.Close()
	if err := other.Start("127.0.0.1:0"); !errors.Is(err, dpdsim.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if err := other.SetFault(dpdsim.FaultNone); !errors.Is(err, dpdsim.ErrClosed) {
		t.Errorf("SetFault after Close = %v, want ErrClosed", err)
	}
}

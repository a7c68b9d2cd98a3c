package dpd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
)

// hangDeadline only detects hangs; nothing here asserts how fast anything is.
const hangDeadline = 20 * time.Second

var addrEq = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// seen is one request a fake server received.
type seen struct {
	Method, URI, APIVersion, ContentType, Body string
}

// recorder is a fake dpd that records requests and answers as scripted.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
	// answer writes the answer to a request; nil answers 204, or an empty
	// page for a listing.
	answer func(w http.ResponseWriter, r *http.Request)
}

func (f *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, seen{r.Method, r.URL.RequestURI(), r.Header.Get("api-version"), r.Header.Get("Content-Type"), string(body)})
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		answer(w, r)
		return
	}
	switch {
	case r.Method == "GET" && r.URL.Path == "/switch/identifiers":
		io.WriteString(w, `{"sidecar_id":"00000000-0000-0000-0000-000000000001","slot":1,"model":"m","serial":"s","asic_backend":"sim","revision":0}`)
	case r.Method == "GET" && strings.Count(r.URL.Path, "/") <= 3:
		io.WriteString(w, `{"items":[],"next_page":null}`)
	case r.Method == "GET":
		io.WriteString(w, `{"internal_ip":"fd00::1","inner_mac":{"a":[0,0,0,0,0,1]},"vni":100}`)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (f *recorder) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.reqs...)
}

func startFake(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) (*recorder, *dpd.Client) {
	t.Helper()
	f := &recorder{answer: answer}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := dpd.NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return f, c
}

var (
	mac    = dpd.MacAddr{0xa8, 0x40, 0x25, 0xff, 0x80, 0x05}
	target = dpd.NatTarget{InternalIP: netip.MustParseAddr("fd00:1122:3344:101::1"), InnerMAC: mac, VNI: 100}
)

func entry(external string, low, high uint16) dpd.NatEntry {
	return dpd.NatEntry{External: netip.MustParseAddr(external), Low: low, High: high, Target: target}
}

const targetJSON = `{"internal_ip":"fd00:1122:3344:101::1","inner_mac":{"a":[168,64,37,255,128,5]},"vni":100}`

func TestEveryCallSendsVersionAndFamiliesAreChosenByAddress(t *testing.T) {
	f, c := startFake(t, nil)
	ctx := t.Context()
	v4, v6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	calls := []func() error{
		func() error { return c.CreateNAT(ctx, entry("192.0.2.10", 0, 65535)) },
		func() error { return c.CreateNAT(ctx, entry("2001:db8::10", 1024, 2047)) },
		func() error { _, err := c.GetNAT(ctx, v4, 80); return err },
		func() error { _, err := c.GetNAT(ctx, v6, 0); return err },
		func() error { return c.DeleteNAT(ctx, v4, 0) },
		func() error { return c.DeleteNAT(ctx, v6, 1024) },
		func() error { _, err := c.NATAddresses(ctx, false); return err },
		func() error { _, err := c.NATAddresses(ctx, true); return err },
		func() error { _, err := c.NATEntries(ctx, v4); return err },
		func() error { _, err := c.NATEntries(ctx, v6); return err },
		func() error { _, err := c.SwitchIdentifiers(ctx); return err },
	}
	for i, call := range calls {
		if err := call(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	want := []seen{
		{"PUT", "/nat/ipv4/192.0.2.10/0/65535", "12.0.0", "application/json", targetJSON},
		{"PUT", "/nat/ipv6/2001:db8::10/1024/2047", "12.0.0", "application/json", targetJSON},
		{"GET", "/nat/ipv4/192.0.2.10/80", "12.0.0", "", ""},
		{"GET", "/nat/ipv6/2001:db8::10/0", "12.0.0", "", ""},
		{"DELETE", "/nat/ipv4/192.0.2.10/0", "12.0.0", "", ""},
		{"DELETE", "/nat/ipv6/2001:db8::10/1024", "12.0.0", "", ""},
		{"GET", "/nat/ipv4", "12.0.0", "", ""},
		{"GET", "/nat/ipv6", "12.0.0", "", ""},
		{"GET", "/nat/ipv4/192.0.2.10", "12.0.0", "", ""},
		{"GET", "/nat/ipv6/2001:db8::10", "12.0.0", "", ""},
		{"GET", "/switch/identifiers", "12.0.0", "", ""},
	}
	if diff := cmp.Diff(want, f.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestInvalidCallsSendNothing(t *testing.T) {
	f, c := startFake(t, nil)
	ctx := t.Context()
	withTarget := func(e dpd.NatEntry, mod func(*dpd.NatTarget)) dpd.NatEntry { mod(&e.Target); return e }
	for name, e := range map[string]dpd.NatEntry{
		"no address":         {Low: 0, High: 1, Target: target},
		"IPv4-mapped":        entry("::ffff:192.0.2.10", 0, 65535),
		"zone":               entry("fe80::1%eth0", 0, 65535),
		"low > high":         entry("192.0.2.10", 2, 1),
		"internal IPv4":      withTarget(entry("192.0.2.10", 0, 1), func(t *dpd.NatTarget) { t.InternalIP = netip.MustParseAddr("10.0.0.1") }),
		"no internal":        withTarget(entry("192.0.2.10", 0, 1), func(t *dpd.NatTarget) { t.InternalIP = netip.Addr{} }),
		"VNI over 24 bits":   withTarget(entry("192.0.2.10", 0, 1), func(t *dpd.NatTarget) { t.VNI = 1 << 24 }),
		"internal with zone": withTarget(entry("192.0.2.10", 0, 1), func(t *dpd.NatTarget) { t.InternalIP = netip.MustParseAddr("fe80::1%eth0") }),
	} {
		if err := c.CreateNAT(ctx, e); err == nil {
			t.Errorf("CreateNAT(%s) succeeded", name)
		}
	}
	for _, a := range []netip.Addr{{}, netip.MustParseAddr("::ffff:192.0.2.10"), netip.MustParseAddr("fe80::1%eth0")} {
		if _, err := c.GetNAT(ctx, a, 0); err == nil {
			t.Errorf("GetNAT(%v) succeeded", a)
		}
		if err := c.DeleteNAT(ctx, a, 0); err == nil {
			t.Errorf("DeleteNAT(%v) succeeded", a)
		}
		if _, err := c.NATEntries(ctx, a); err == nil {
			t.Errorf("NATEntries(%v) succeeded", a)
		}
	}
	if got := f.requests(); len(got) != 0 {
		t.Errorf("requests sent: %v, want none", got)
	}
}

func TestMacAddrJSON(t *testing.T) {
	b, err := json.Marshal(target)
	if err != nil || string(b) != targetJSON {
		t.Errorf("Marshal(target) = %s, %v; want %s", b, err, targetJSON)
	}
	var back dpd.NatTarget
	if err := json.Unmarshal(b, &back); err != nil || back != target {
		t.Errorf("round trip = %+v, %v", back, err)
	}
	var m dpd.MacAddr
	if err := json.Unmarshal([]byte(` { "a" : [ 1, 2, 3, 4, 5, 255 ], "extra": 1 } `), &m); err != nil || m != (dpd.MacAddr{1, 2, 3, 4, 5, 255}) {
		t.Errorf("Unmarshal with spaces and extra field = %v, %v", m, err)
	}
	for _, bad := range []string{
		`"A8:40:25:FF:80:05"`, `null`, `{}`, `{"a":null}`, `{"a":[1,2,3,4,5]}`, `{"a":[1,2,3,4,5,6,7]}`,
		`{"a":[1,2,3,4,5,256]}`, `{"a":[1,2,3,4,5,-1]}`, `{"a":[1,2,3,4,5,1.5]}`, `{"a":"qEAl/4AF"}`, `[1,2,3,4,5,6]`,
	} {
		m := dpd.MacAddr{9, 9, 9, 9, 9, 9}
		if err := json.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("Unmarshal(%s) = %v, want an error", bad, m)
		}
	}
}

func TestParseMACAndString(t *testing.T) {
	for _, s := range []string{"A8:40:25:FF:80:05", "a8:40:25:ff:80:05", "a8:40:25:Ff:80:05"} {
		got, err := dpd.ParseMAC(s)
		if err != nil || got != mac {
			t.Errorf("ParseMAC(%q) = %v, %v; want %v", s, got, err, mac)
		}
	}
	if s := mac.String(); s != "a8:40:25:ff:80:05" {
		t.Errorf("String = %q", s)
	}
	for _, bad := range []string{"", "A8:40:25:FF:80", "A8:40:25:FF:80:05:06", "A8-40-25-FF-80-05", "A8:40:25:FF:80:5", "A8:40:25:FF:80:005",
		"A8:40:25:FF:80:0x", "A8:40:25:FF:80:+5", "a840.25ff.8005", "A8:40:25:FF:80:GG"} {
		if m, err := dpd.ParseMAC(bad); err == nil {
			t.Errorf("ParseMAC(%q) = %v, want an error", bad, m)
		}
	}
}

// pages answers a listing from scripted bodies, keyed by the page_token.
func pages(bodies map[string]string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		body, ok := bodies[r.URL.Query().Get("page_token")]
		if !ok {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"request_id":"1","message":"bad page token"}`)
			return
		}
		io.WriteString(w, body)
	}
}

func TestListingsFollowPages(t *testing.T) {
	f, c := startFake(t, pages(map[string]string{
		"":       `{"items":["192.0.2.1","192.0.2.2"],"next_page":"p/2 +="}`,
		"p/2 +=": `{"items":["192.0.2.3"],"next_page":"p3"}`,
		"p3":     `{"items":["192.0.2.4"]}`,
	}))
	got, err := c.NATAddresses(t.Context(), false)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4")}
	if diff := cmp.Diff(want, got, addrEq); diff != "" {
		t.Errorf("NATAddresses (-want +got):\n%s", diff)
	}
	var uris []string
	for _, r := range f.requests() {
		uris = append(uris, r.URI)
	}
	if diff := cmp.Diff([]string{"/nat/ipv4", "/nat/ipv4?page_token=p%2F2+%2B%3D", "/nat/ipv4?page_token=p3"}, uris); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestListingEndsOnAnEmptyPage(t *testing.T) {
	f, c := startFake(t, pages(map[string]string{
		"":   `{"items":[{"external":"2001:db8::1","low":0,"high":9,"target":` + targetJSON + `}],"next_page":"p2"}`,
		"p2": `{"items":[],"next_page":"p3"}`,
	}))
	got, err := c.NATEntries(t.Context(), netip.MustParseAddr("2001:db8::1"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]dpd.NatEntry{entry("2001:db8::1", 0, 9)}, got, addrEq); diff != "" {
		t.Errorf("NATEntries (-want +got):\n%s", diff)
	}
	if n := len(f.requests()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

func TestEndlessListingFails(t *testing.T) {
	var n int
	var mu sync.Mutex
	_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		fmt.Fprintf(w, `{"items":["192.0.2.%d"],"next_page":"p%d"}`, i%250+1, i)
	})
	_, err := c.NATAddresses(t.Context(), false)
	if err == nil || !strings.Contains(err.Error(), "pages") {
		t.Errorf("NATAddresses = %v, want an error about too many pages", err)
	}
}

func TestListingsRefuseItemsOfAnotherKind(t *testing.T) {
	for name, tt := range map[string]struct {
		v6        bool
		entriesOf string
		body      string
	}{
		"IPv6 in IPv4 list":    {body: `{"items":["2001:db8::1"],"next_page":null}`},
		"IPv4 in IPv6 list":    {v6: true, body: `{"items":["192.0.2.1"],"next_page":null}`},
		"empty address":        {body: `{"items":[""],"next_page":null}`},
		"entry of another ip":  {entriesOf: "192.0.2.1", body: `{"items":[{"external":"192.0.2.2","low":0,"high":9,"target":` + targetJSON + `}]}`},
		"entry low > high":     {entriesOf: "192.0.2.1", body: `{"items":[{"external":"192.0.2.1","low":9,"high":0,"target":` + targetJSON + `}]}`},
		"entry without target": {entriesOf: "192.0.2.1", body: `{"items":[{"external":"192.0.2.1","low":0,"high":9}]}`},
		"not a page":           {body: `["192.0.2.1"]`},
	} {
		t.Run(name, func(t *testing.T) {
			_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, tt.body) })
			var err error
			if tt.entriesOf != "" {
				_, err = c.NATEntries(t.Context(), netip.MustParseAddr(tt.entriesOf))
			} else {
				_, err = c.NATAddresses(t.Context(), tt.v6)
			}
			if err == nil {
				t.Error("succeeded")
			}
		})
	}
}

func TestAllNATListsBothFamilies(t *testing.T) {
	f, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		item := func(ip string, low, high int) string {
			return fmt.Sprintf(`{"external":%q,"low":%d,"high":%d,"target":%s}`, ip, low, high, targetJSON)
		}
		switch r.URL.Path {
		case "/nat/ipv4":
			io.WriteString(w, `{"items":["192.0.2.1","192.0.2.2"],"next_page":null}`)
		case "/nat/ipv6":
			io.WriteString(w, `{"items":["2001:db8::1"],"next_page":null}`)
		case "/nat/ipv4/192.0.2.1":
			io.WriteString(w, `{"items":[`+item("192.0.2.1", 0, 99)+`,`+item("192.0.2.1", 100, 199)+`],"next_page":null}`)
		case "/nat/ipv4/192.0.2.2":
			io.WriteString(w, `{"items":[],"next_page":null}`) // gone since the address listing
		case "/nat/ipv6/2001:db8::1":
			io.WriteString(w, `{"items":[`+item("2001:db8::1", 0, 65535)+`],"next_page":null}`)
		}
	})
	got, err := c.AllNAT(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []dpd.NatEntry{entry("192.0.2.1", 0, 99), entry("192.0.2.1", 100, 199), entry("2001:db8::1", 0, 65535)}
	if diff := cmp.Diff(want, got, addrEq); diff != "" {
		t.Errorf("AllNAT (-want +got):\n%s", diff)
	}
	if n := len(f.requests()); n != 5 {
		t.Errorf("%d requests, want 5", n)
	}
}

func TestSwitchIdentifiersDecodeRealAnswers(t *testing.T) {
	_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"sidecar_id":"8f2c7a4e-5b1d-4c3e-9f0a-1b2c3d4e5f60","asic_backend":"tofino_asic",
			"fab":"T","lot":"A","lotnum":["1","2","3","4"],"wafer":7,"wafer_loc":[3,-2],
			"fuse":{"chip_id":1,"something":"new"},"model":"913-0000006","revision":2,"serial":"BRM44220010","slot":1}`)
	})
	got, err := c.SwitchIdentifiers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := dpd.SwitchIdentifiers{SidecarID: "8f2c7a4e-5b1d-4c3e-9f0a-1b2c3d4e5f60", Slot: 1, Model: "913-0000006",
		Serial: "BRM44220010", AsicBackend: "tofino_asic", Revision: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SwitchIdentifiers (-want +got):\n%s", diff)
	}
}

func TestNewClientNamesDPDAndSetsDefaultTimeout(t *testing.T) {
	// The rules for a base URL are dropshot's and tested there.
	if _, err := dpd.NewClient("ftp://[::1]:12224"); err == nil || !strings.HasPrefix(err.Error(), "dpd URL ") {
		t.Errorf("NewClient(ftp) = %v, want an error naming dpd", err)
	}
	c, err := dpd.NewClient("http://[::1]:12224")
	if err != nil || c.Timeout != dpd.DefaultTimeout {
		t.Errorf("NewClient = %+v, %v; want Timeout %v", c, err, dpd.DefaultTimeout)
	}
}

// How an error body becomes an APIError is dropshot's and tested there;
// this is that the error is dpd's, names it and matches ErrConflict and
// ErrNotFound by status.
func TestErrorAnswersAreTyped(t *testing.T) {
	const path = "/nat/ipv4/192.0.2.10/0/65535"
	for _, tt := range []struct {
		status             int
		conflict, notFound bool
	}{
		{status: 409, conflict: true},
		{status: 404, notFound: true},
		{status: 400},
		{status: 500},
	} {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				io.WriteString(w, `{"request_id":"r1","error_code":"conflicting mapping","message":"conflicting mapping: 192.0.2.10 ports 0-65535"}`)
			})
			err := c.CreateNAT(t.Context(), entry("192.0.2.10", 0, 65535))
			var got *dpd.APIError
			if !errors.As(err, &got) {
				t.Fatalf("CreateNAT = %v, want an APIError", err)
			}
			want := dpd.APIError{Method: "PUT", Path: path, StatusCode: tt.status, RequestID: "r1", ErrorCode: "conflicting mapping", Message: "conflicting mapping: 192.0.2.10 ports 0-65535"}
			if diff := cmp.Diff(want, *got); diff != "" {
				t.Errorf("APIError (-want +got):\n%s", diff)
			}
			if errors.Is(err, dpd.ErrConflict) != tt.conflict || errors.Is(err, dpd.ErrNotFound) != tt.notFound {
				t.Errorf("Is(ErrConflict) = %v, Is(ErrNotFound) = %v", errors.Is(err, dpd.ErrConflict), errors.Is(err, dpd.ErrNotFound))
			}
			if got.ClientError() != (tt.status < 500) || got.ServerError() != (tt.status >= 500) {
				t.Errorf("ClientError = %v, ServerError = %v for %d", got.ClientError(), got.ServerError(), got.StatusCode)
			}
			if errors.Is(err, dpd.ErrUnreachable) {
				t.Errorf("an answer was reported unreachable: %v", err)
			}
			wantMsg := fmt.Sprintf("dpd PUT %s: %d %s: conflicting mapping: 192.0.2.10 ports 0-65535 (error_code conflicting mapping) (request_id r1)",
				path, tt.status, http.StatusText(tt.status))
			if msg := err.Error(); msg != wantMsg {
				t.Errorf("Error() = %q, want %q", msg, wantMsg)
			}
		})
	}
}

func TestGetNATNotFoundAndIdentifiersNotYetKnown(t *testing.T) {
	_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/switch/identifiers" {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"request_id":"r","message":"switch identifiers not yet known"}`)
			return
		}
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"request_id":"r","error_code":"no mapping","message":"no mapping"}`)
	})
	_, err := c.GetNAT(t.Context(), netip.MustParseAddr("192.0.2.1"), 80)
	if !errors.Is(err, dpd.ErrNotFound) || errors.Is(err, dpd.ErrConflict) {
		t.Errorf("GetNAT = %v, want ErrNotFound", err)
	}
	_, err = c.SwitchIdentifiers(t.Context())
	var apiErr *dpd.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || !apiErr.ServerError() {
		t.Errorf("SwitchIdentifiers = %v, want a 503 APIError", err)
	}
}

// callWithin runs call, failing the test if it does not return in
// hangDeadline.
func callWithin(t *testing.T, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangDeadline):
		t.Fatal("call did not give up on a server that never answers")
		return nil
	}
}

// The tests below run the client against the simulator. Deadlines,
// ErrUnreachable and caller cancellation are tested in full in dropshot;
// the fault test here checks that the client wires up ErrUnreachable and
// its Timeout.

func startSim(t *testing.T) (*dpdsim.Server, *dpd.Client) {
	t.Helper()
	s := dpdsim.New(nil, 1)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, err := dpd.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return s, c
}

func TestSimulatorRoundTrip(t *testing.T) {
	s, c := startSim(t)
	ctx := t.Context()
	mine := []dpd.NatEntry{entry("2001:db8::5", 0, 65535), entry("192.0.2.10", 16384, 32767), entry("192.0.2.10", 0, 16383), entry("192.0.2.9", 0, 65535)}
	for _, e := range mine {
		for range 2 { // the second time is a no-op
			if err := c.CreateNAT(ctx, e); err != nil {
				t.Fatalf("CreateNAT(%+v): %v", e, err)
			}
		}
	}
	other := entry("192.0.2.10", 100, 200)
	other.Target.VNI = 101
	err := c.CreateNAT(ctx, other)
	var apiErr *dpd.APIError
	if !errors.Is(err, dpd.ErrConflict) || !errors.As(err, &apiErr) || apiErr.ErrorCode != "conflicting mapping" {
		t.Errorf("overlapping CreateNAT = %v, want ErrConflict with error_code \"conflicting mapping\"", err)
	}
	got, err := c.GetNAT(ctx, netip.MustParseAddr("192.0.2.10"), 20000)
	if err != nil || got != target {
		t.Errorf("GetNAT = %+v, %v; want %+v", got, err, target)
	}
	if _, err := c.GetNAT(ctx, netip.MustParseAddr("192.0.2.11"), 0); !errors.Is(err, dpd.ErrNotFound) {
		t.Errorf("GetNAT of nothing = %v, want ErrNotFound", err)
	}
	all, err := c.AllNAT(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []dpd.NatEntry{mine[3], mine[2], mine[1], mine[0]}
	if diff := cmp.Diff(want, all, addrEq); diff != "" {
		t.Errorf("AllNAT (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, s.Entries(), addrEq); diff != "" {
		t.Errorf("simulator state (-want +got):\n%s", diff)
	}
	for range 2 {
		if err := c.DeleteNAT(ctx, netip.MustParseAddr("192.0.2.10"), 20000); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]dpd.NatEntry{mine[3], mine[2], mine[0]}, s.Entries(), addrEq); diff != "" {
		t.Errorf("after delete (-want +got):\n%s", diff)
	}
	ids, err := c.SwitchIdentifiers(ctx)
	if err != nil || ids != s.SwitchIdentifiers() || ids.Slot != 1 {
		t.Errorf("SwitchIdentifiers = %+v, %v; want %+v", ids, err, s.SwitchIdentifiers())
	}
}

func TestSimulatorPagesAreFollowed(t *testing.T) {
	s, c := startSim(t)
	var want []dpd.NatEntry
	for i := range 100 {
		want = append(want, entry("198.51.100.1", uint16(i*10), uint16(i*10+9)))
	}
	for i := range 70 {
		want = append(want, entry(fmt.Sprintf("203.0.113.%d", i+1), 0, 65535))
	}
	for i := len(want) - 1; i >= 0; i-- {
		s.Inject(want[i])
	}
	got, err := c.AllNAT(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, addrEq); diff != "" {
		t.Errorf("AllNAT (-want +got):\n%s", diff)
	}
	reqs := s.Requests()
	if reqs["GET /nat/ipv4"] != 2 || reqs["GET /nat/ipv4/{ip}"] != 71+1 || reqs["GET /nat/ipv6"] != 1 {
		t.Errorf("requests = %v, want 2 address pages, 72 entry pages, 1 IPv6 address page", reqs)
	}
}

func TestSimulatorFaultsGiveTypedErrors(t *testing.T) {
	s, c := startSim(t)
	ctx := t.Context()

	s.SetFault(dpdsim.FaultError)
	err := c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535))
	var apiErr *dpd.APIError
	if !errors.As(err, &apiErr) || !apiErr.ServerError() || apiErr.RequestID == "" {
		t.Errorf("under FaultError: %v, want a 5xx APIError with a request id", err)
	}

	s.SetFault(dpdsim.FaultRefuse)
	_, err = c.AllNAT(ctx)
	if !errors.Is(err, dpd.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("under FaultRefuse: %v, want ErrUnreachable wrapping ECONNREFUSED", err)
	}

	s.SetFault(dpdsim.FaultHang)
	c.Timeout = 100 * time.Millisecond
	err = callWithin(t, func() error { _, err := c.SwitchIdentifiers(ctx); return err })
	if !errors.Is(err, dpd.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("under FaultHang: %v, want ErrUnreachable wrapping context.DeadlineExceeded", err)
	}

	if err := s.SetFault(dpdsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	c.Timeout = dpd.DefaultTimeout
	if err := c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535)); err != nil {
		t.Errorf("after clearing the fault: %v", err)
	}
}

func TestSimulatorRestartIsSurvivedByKeptAliveClient(t *testing.T) {
	s, c := startSim(t)
	ctx := t.Context()
	if err := c.CreateNAT(ctx, entry("192.0.2.1", 0, 65535)); err != nil {
		t.Fatal(err)
	}
	s.RestartEmpty()
	// The kept-alive connection was dropped; creating is idempotent, so
	// the transport may retry it on a new one.
	if err := c.CreateNAT(ctx, entry("192.0.2.2", 0, 65535)); err != nil {
		t.Fatalf("CreateNAT after restart: %v", err)
	}
	s.RestartEmpty()
	if err := c.DeleteNAT(ctx, netip.MustParseAddr("192.0.2.2"), 0); err != nil {
		t.Fatalf("DeleteNAT after restart: %v", err)
	}
	if got := s.Entries(); len(got) != 0 {
		t.Errorf("Entries after restart = %v, want none", got)
	}
}

package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// configDoc is a sled config document of generation gen holding zones.
func configDoc(t *testing.T, gen uint64, zones ...sledconfig.Zone) string {
	t.Helper()
	b, err := json.Marshal(sledconfigtest.Config(gen, zones...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// crucibleAt is crucible zone i with id (if not "") and address replaced.
func crucibleAt(i int, id, addr string) sledconfig.Zone {
	z := sledconfigtest.Crucible(i)
	if id != "" {
		z.ID = id
	}
	if addr != "" {
		z.ZoneType.Address = addr
	}
	return z
}

// vmmCount is how many VMMs the agent knows.
func vmmCount(t *testing.T, a *agent.Agent) int {
	t.Helper()
	code, b := call(t, a, http.MethodGet, "/agent/vmms", "")
	var page struct{ Items []json.RawMessage }
	if code != http.StatusOK || json.Unmarshal(b, &page) != nil {
		t.Fatalf("GET /agent/vmms: %d %s", code, b)
	}
	return len(page.Items)
}

func TestVMMCollidingWithAZoneOrTheSledIsRefused(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	crucible, dns := sledconfigtest.Crucible(0), sledconfigtest.InternalDNS(0)
	if code, b := call(t, a, http.MethodPut, "/omicron-config", configDoc(t, 2, crucible, dns)); code != http.StatusNoContent {
		t.Fatalf("PUT config: %d %s", code, b)
	}
	crucibleName := fmt.Sprintf("zone %s (id %s)", crucible.Name(), crucible.ID)
	dnsName := fmt.Sprintf("zone %s (id %s)", dns.Name(), dns.ID)
	for _, c := range []struct {
		name, id, addr string
		says           []string
	}{
		{"the id of a zone", crucible.ID, "[fd00:1122:3344:101::1:5]:12400", []string{crucibleName, "id " + crucible.ID + " is the id of"}},
		{"a zone's underlay address", testVMM, "[fd00:1122:3344:101::10]:12400", []string{crucibleName, "propolis_addr fd00:1122:3344:101::10 is the underlay address of"}},
		{"the sled's underlay address", testVMM, "[" + agent.DefaultUnderlayIP + "]:12400", []string{"is the underlay address of the sled"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, b := call(t, a, http.MethodPut, "/vmms/"+c.id, ensureBody(c.addr))
			var e struct {
				RequestID string `json:"request_id"`
				ErrorCode string `json:"error_code"`
				Message   string `json:"message"`
			}
			json.Unmarshal(b, &e)
			if code != http.StatusConflict || e.ErrorCode != "Conflict" || e.RequestID == "" {
				t.Fatalf("PUT /vmms/%s at %s: %d %s, want 409 Conflict", c.id, c.addr, code, b)
			}
			for _, s := range c.says {
				if !strings.Contains(e.Message, s) {
					t.Errorf("message %q does not say %q", e.Message, s)
				}
			}
			if code, _ := call(t, a, http.MethodGet, "/vmms/"+c.id+"/state", ""); code != http.StatusNotFound {
				t.Errorf("refused VMM known: GET state %d", code)
			}
			if n := vmmCount(t, a); n != 0 {
				t.Errorf("%d VMMs after a refusal", n)
			}
		})
	}
	// An internal DNS zone's addresses are in the internal DNS subnets, off
	// the sled's subnet, where no VMM may be: refused before any claim is
	// looked at.
	for _, addr := range []string{"fd00:1122:3344:1::1", "fd00:1122:3344:1::2"} {
		code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("["+addr+"]:12400"))
		if code != http.StatusBadRequest || !strings.Contains(string(b), addr+" is outside the sled's subnet") {
			t.Errorf("PUT /vmms/%s at %s (%s's): %d %s, want 400", testVMM, addr, dnsName, code, b)
		}
	}
	if n := vmmCount(t, a); n != 0 {
		t.Errorf("%d VMMs after a refusal", n)
	}
	// Once the zones are gone from the config, their ids and addresses are
	// free.
	if code, b := call(t, a, http.MethodPut, "/omicron-config", configDoc(t, 3)); code != http.StatusNoContent {
		t.Fatalf("PUT config: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+crucible.ID, ensureBody("[fd00:1122:3344:101::10]:12400")); code != http.StatusOK {
		t.Fatalf("registering at what the removed zones held: %d %s", code, b)
	}
}

func TestConfigCollidingWithAVMMOrTheSledIsRefused(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	if code, b := call(t, a, http.MethodPut, "/omicron-config", configDoc(t, 2, sledconfigtest.Crucible(1))); code != http.StatusNoContent {
		t.Fatalf("PUT config: %d %s", code, b)
	}
	const vmmAddr = "fd00:1122:3344:101::1:9"
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("["+vmmAddr+"]:12400")); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	dnsAtVMM := sledconfigtest.InternalDNS(0)
	dnsAtVMM.ZoneType.GZAddress = vmmAddr
	dnsOnSled := sledconfigtest.InternalDNS(1)
	dnsOnSled.ZoneType.GZAddress = agent.DefaultUnderlayIP
	withID, atVMM := crucibleAt(0, testVMM, ""), crucibleAt(0, "", "["+vmmAddr+"]:32345")
	onSled := crucibleAt(0, "", "["+agent.DefaultUnderlayIP+"]:32345")
	vmmName := "VMM " + testVMM
	for _, c := range []struct {
		name string
		zone sledconfig.Zone
		says []string
	}{
		{"a zone with the VMM's id", withID, []string{withID.Name(), "id " + testVMM + " is the id of " + vmmName}},
		{"a zone at the VMM's address", atVMM, []string{atVMM.Name(), "underlay address " + vmmAddr + " is the propolis_addr of " + vmmName}},
		// A gz_address is in the internal DNS subnets, never the sled's,
		// where VMMs are: refused by validation, before any claim.
		{"an internal DNS zone whose gz_address is the VMM's", dnsAtVMM, []string{dnsAtVMM.ID, "zone_type.gz_address: " + vmmAddr + " is outside the internal DNS subnets"}},
		// The sled's own address is refused by validation, which knows it,
		// before any claim is looked at.
		{"a zone at the sled's underlay address", onSled, []string{onSled.ID, "zone_type.address: underlay address " + agent.DefaultUnderlayIP + " is the sled's own underlay address"}},
		{"an internal DNS zone whose gz_address is the sled's", dnsOnSled, []string{dnsOnSled.ID, "zone_type.gz_address: " + agent.DefaultUnderlayIP + " is the sled's own underlay address"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, b := call(t, a, http.MethodPut, "/omicron-config", configDoc(t, 3, sledconfigtest.Crucible(1), c.zone))
			if code != http.StatusBadRequest || !bytes.Contains(b, []byte(`"InvalidRequest"`)) {
				t.Fatalf("PUT config: %d %s, want 400", code, b)
			}
			for _, s := range c.says {
				if !strings.Contains(string(b), s) {
					t.Errorf("answer %s does not say %q", b, s)
				}
			}
			if gen := a.Store().Current().Generation; gen != 2 {
				t.Errorf("ledgered generation %d after a refusal, want 2", gen)
			}
		})
	}
	// A refused config took nothing: the VMM is as it was, and a config
	// that collides with nothing is accepted.
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("["+vmmAddr+"]:12400")); code != http.StatusOK {
		t.Fatalf("registering the VMM again: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/omicron-config", configDoc(t, 3, sledconfigtest.Crucible(1), sledconfigtest.Crucible(0))); code != http.StatusNoContent {
		t.Fatalf("PUT a config that collides with nothing: %d %s", code, b)
	}
	// Unregistered, the VMM's id and address are free.
	if code, b := call(t, a, http.MethodDelete, "/vmms/"+testVMM, ""); code != http.StatusOK {
		t.Fatalf("unregister: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/omicron-config", configDoc(t, 4, withID, crucibleAt(1, "", "["+vmmAddr+"]:32345"))); code != http.StatusNoContent {
		t.Fatalf("PUT a config with what the VMM held: %d %s", code, b)
	}
}

// send is call for goroutines other than the test's.
func send(a *agent.Agent, method, path, body string) (int, string, error) {
	req, err := http.NewRequest(method, "http://"+a.Addr()+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// A config PUT and a VMM PUT that collide, sent together, are never both
// accepted, and one of them always is.
func TestCollidingConfigAndVMMRacingOneWins(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	const tries = 60
	wins := map[string]int{}
	for i := range tries {
		vmmID := fmt.Sprintf("%08x-1111-4000-8000-000000000000", i)
		addr := fmt.Sprintf("fd00:1122:3344:101::2:%x", i)
		z := crucibleAt(i, vmmID, "") // the same id, or (odd tries) the same address
		if i%2 == 1 {
			z = crucibleAt(i, "", "["+addr+"]:32345")
		}
		doc := configDoc(t, uint64(10+i), z)
		var wg sync.WaitGroup
		var cfgCode, vmmCode int
		var cfgBody, vmmBody string
		var cfgErr, vmmErr error
		begin := make(chan struct{})
		wg.Go(func() { <-begin; cfgCode, cfgBody, cfgErr = send(a, http.MethodPut, "/omicron-config", doc) })
		wg.Go(func() {
			<-begin
			vmmCode, vmmBody, vmmErr = send(a, http.MethodPut, "/vmms/"+vmmID, ensureBody("["+addr+"]:12400"))
		})
		close(begin)
		wg.Wait()
		if cfgErr != nil || vmmErr != nil {
			t.Fatalf("try %d: %v, %v", i, cfgErr, vmmErr)
		}
		cfgOK, vmmOK := cfgCode == http.StatusNoContent, vmmCode == http.StatusOK
		switch {
		case cfgOK && vmmOK:
			t.Fatalf("try %d: both accepted: a zone and a VMM share %s", i, map[bool]string{true: "an address", false: "an id"}[i%2 == 1])
		case !cfgOK && !vmmOK:
			t.Fatalf("try %d: both refused: config %d %s; VMM %d %s", i, cfgCode, cfgBody, vmmCode, vmmBody)
		case cfgOK && vmmCode != http.StatusConflict, vmmOK && cfgCode != http.StatusBadRequest:
			t.Fatalf("try %d: config %d %s; VMM %d %s", i, cfgCode, cfgBody, vmmCode, vmmBody)
		case cfgOK:
			wins["config"]++
		default:
			wins["vmm"]++
		}
	}
	t.Logf("%d tries: %v", tries, wins)
}

// After a restart, the ledgered config's zones and the resumed VMMs hold
// what they held before the API serves again.
func TestClaimsAreTakenBackAtStart(t *testing.T) {
	dir := t.TempDir()
	first := newAgent(t, agent.Config{DataDir: dir})
	stop := run(t, first)
	crucible := sledconfigtest.Crucible(0)
	if code, b := call(t, first, http.MethodPut, "/omicron-config", configDoc(t, 2, crucible)); code != http.StatusNoContent {
		t.Fatalf("PUT config: %d %s", code, b)
	}
	const vmmAddr = "[fd00:1122:3344:101::1:5]:12400"
	if code, b := call(t, first, http.MethodPut, "/vmms/"+testVMM, ensureBody(vmmAddr)); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	second := newAgent(t, agent.Config{DataDir: dir})
	run(t, second)
	other := "00000000-2222-4000-8000-000000000000"
	if code, b := call(t, second, http.MethodPut, "/vmms/"+other, ensureBody("["+"fd00:1122:3344:101::10]:12400")); code != http.StatusConflict || !strings.Contains(string(b), crucible.Name()) {
		t.Fatalf("a VMM at the ledgered zone's address after a restart: %d %s", code, b)
	}
	if code, b := call(t, second, http.MethodPut, "/omicron-config", configDoc(t, 3, crucibleAt(1, testVMM, ""))); code != http.StatusBadRequest || !strings.Contains(string(b), "VMM "+testVMM) {
		t.Fatalf("a zone with the resumed VMM's id: %d %s", code, b)
	}
}

package sledconfig

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// The example's sled: the /64 its zones are in.
const exampleSled = "fd00:1122:3344:103::1"

// A zone's addresses must be ones upstream allocates to the sled: its /64
// (not the first addresses), or for internal DNS the reserved internal DNS
// /64s. Anything else would route this sled's traffic for another sled's or
// service's address into the zone.
func TestZoneAddressesStayOnTheSled(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(doc map[string]any)
		path   string // of the one problem; "" for none
		msg    string
	}{
		{"a public address", func(doc map[string]any) { zoneTypeOf(doc, crucibleID)["address"] = "[2001:4860:4860::8888]:32345" },
			zp(crucibleID) + ".zone_type.address", "underlay address 2001:4860:4860::8888 is outside the sled's subnet fd00:1122:3344:103::/64"},
		{"another sled's address", func(doc map[string]any) {
			zoneTypeOf(doc, nexusID)["internal_address"] = "[fd00:1122:3344:104::47]:12221"
		},
			zp(nexusID) + ".zone_type.internal_address", "fd00:1122:3344:104::47 is outside the sled's subnet"},
		{"external DNS's underlay address", func(doc map[string]any) {
			zoneTypeOf(doc, externalDNSID)["http_address"] = "[fd00:1122:3344:2::1]:5353"
		},
			zp(externalDNSID) + ".zone_type.http_address", "fd00:1122:3344:2::1 is outside the sled's subnet"},
		{"the subnet's anycast address", func(doc map[string]any) { zoneTypeOf(doc, crucibleID)["address"] = "[fd00:1122:3344:103::]:32345" },
			zp(crucibleID) + ".zone_type.address", "fd00:1122:3344:103:: is one of the first addresses of the sled's subnet"},
		{"the switch zone's address", func(doc map[string]any) { zoneTypeOf(doc, internalNTPID)["address"] = "[fd00:1122:3344:103::2]:123" },
			zp(internalNTPID) + ".zone_type.address", "fd00:1122:3344:103::2 is one of the first addresses"},
		{"internal DNS on the sled's subnet", func(doc map[string]any) {
			zoneTypeOf(doc, internalDNSID)["dns_address"] = "[fd00:1122:3344:103::99]:53"
		},
			zp(internalDNSID) + ".zone_type.dns_address", "underlay address fd00:1122:3344:103::99 is outside the internal DNS subnets reserved in the sled's availability zone (fd00:1122:3344:1::/64 to fd00:1122:3344:5::/64)"},
		{"a gz_address on the sled's subnet", func(doc map[string]any) { zoneTypeOf(doc, internalDNSID)["gz_address"] = "fd00:1122:3344:103::99" },
			zp(internalDNSID) + ".zone_type.gz_address", "fd00:1122:3344:103::99 is outside the internal DNS subnets"},
		{"a gz_address of another AZ", func(doc map[string]any) { zoneTypeOf(doc, internalDNSID)["gz_address"] = "fd00:1122:3345:1::2" },
			zp(internalDNSID) + ".zone_type.gz_address", "fd00:1122:3345:1::2 is outside the internal DNS subnets"},
		{"past the reserved internal DNS subnets", func(doc map[string]any) {
			zt := zoneTypeOf(doc, internalDNSID)
			zt["dns_address"], zt["http_address"], zt["gz_address"] = "[fd00:1122:3344:6::1]:53", "[fd00:1122:3344:1::1]:5353", "fd00:1122:3344:1::2"
		}, zp(internalDNSID) + ".zone_type.dns_address", "fd00:1122:3344:6::1 is outside the internal DNS subnets"},
		{"the last reserved internal DNS subnet", func(doc map[string]any) {
			zt := zoneTypeOf(doc, internalDNSID)
			zt["dns_address"], zt["http_address"], zt["gz_address"] = "[fd00:1122:3344:5::1]:53", "[fd00:1122:3344:5::1]:5353", "fd00:1122:3344:5::2"
		}, "", ""},
		{"the top of the sled's subnet", func(doc map[string]any) {
			zoneTypeOf(doc, crucibleID)["address"] = "[fd00:1122:3344:103:ffff:ffff:ffff:ffff]:32345"
		}, "", ""},
		// A loopback address is reported as one, not also as off the sled.
		{"loopback", func(doc map[string]any) { zoneTypeOf(doc, crucibleID)["address"] = "[::1]:32345" },
			zp(crucibleID) + ".zone_type.address", "::1 is a loopback address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := fullDoc(t)
			tc.change(doc)
			cfg, err := Parse(encode(t, doc))
			if err != nil {
				t.Fatal(err)
			}
			err = ValidateWith(cfg, ValidateOptions{SledUnderlay: netip.MustParseAddr(exampleSled)})
			if tc.path == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || len(verr.Problems) != 1 {
				t.Fatalf("ValidateWith = %v, want one problem", err)
			}
			if p := verr.Problems[0]; p.Path != tc.path || !strings.Contains(p.Message, tc.msg) {
				t.Errorf("problem %q, want %s saying %q", p, tc.path, tc.msg)
			}
			// A config ledgered before the rule is loaded, not dropped
			// (configstore).
			if !verr.WellFormed() {
				t.Error("WellFormed() = false for a zone off the sled")
			}
		})
	}
}

func TestSledAddrProblem(t *testing.T) {
	sled := netip.MustParseAddr("fd00:1122:3344:101::1")
	for addr, want := range map[string]string{
		"fd00:1122:3344:101::5":    "",
		"fd00:1122:3344:101::1:5":  "",
		"fd00:1122:3344:101::1":    "", // the sled's own: a collision, refused as one
		"fd00:1122:3344:101::":     "one of the first addresses",
		"fd00:1122:3344:101::2":    "one of the first addresses",
		"fd00:1122:3344:101::3":    "",
		"fd00:1122:3344:102::5":    "is outside the sled's subnet fd00:1122:3344:101::/64 (the /64 of its underlay address fd00:1122:3344:101::1)",
		"fd00:1122:3344:1::2":      "is outside the sled's subnet",
		"2001:4860:4860::8888":     "is outside the sled's subnet",
		"fd00:1122:3344:100:1::5":  "is outside the sled's subnet",
		"fd00:1122:3344:101:1::":   "",
		"fd00:1122:3344:101:0:1::": "",
	} {
		got := SledAddrProblem(sled, netip.MustParseAddr(addr))
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("SledAddrProblem(%s) = %q, want %q", addr, got, want)
		}
	}
	if got := SledSubnet(sled); got != netip.MustParsePrefix("fd00:1122:3344:101::/64") {
		t.Errorf("SledSubnet = %s", got)
	}
}

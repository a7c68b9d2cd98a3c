package hardware

import (
	"path/filepath"
	"strings"
	"testing"
)

// The samples under testdata/cpuinfo are in /proc/cpuinfo's format (two
// processors each), with the vendor, family and model Linux shows for each
// part.
func TestCPUFamilyFromCPUInfo(t *testing.T) {
	for _, tc := range []struct {
		file           string
		vendor         string
		family, model  uint32
		want           CPUFamily
		wantParseError bool
	}{
		{file: "milan", vendor: amdVendor, family: 0x19, model: 0x01, want: CPUAMDMilan},
		// Upstream rounds Zen 4 EPYC down to Milan: it is not a family a
		// guest may choose.
		{file: "genoa", vendor: amdVendor, family: 0x19, model: 0x11, want: CPUAMDMilan},
		{file: "raphael", vendor: amdVendor, family: 0x19, model: 0x61, want: CPUAMDMilan},
		// A mobile Zen 3: upstream leaves it unknown.
		{file: "cezanne", vendor: amdVendor, family: 0x19, model: 0x50, want: CPUUnknown},
		{file: "turin", vendor: amdVendor, family: 0x1a, model: 0x02, want: CPUAMDTurin},
		{file: "turin-dense", vendor: amdVendor, family: 0x1a, model: 0x11, want: CPUAMDTurinDns},
		{file: "intel", vendor: "GenuineIntel", family: 6, model: 0x8f, want: CPUUnknown},
		{file: "neoverse-n1", wantParseError: true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			id, err := readCPUID(filepath.Join("testdata", "cpuinfo", tc.file))
			if tc.wantParseError {
				if err == nil {
					t.Fatalf("parsed %+v from a cpuinfo without vendor, family and model", id)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id != (cpuID{Vendor: tc.vendor, Family: tc.family, Model: tc.model}) {
				t.Errorf("parsed %+v, want vendor %s family %#x model %#x", id, tc.vendor, tc.family, tc.model)
			}
			if got := id.family(); got != tc.want {
				t.Errorf("family() = %s, want %s", got, tc.want)
			}
		})
	}
}

// Upstream's ranges, at their edges.
func TestCPUFamilyRanges(t *testing.T) {
	for _, tc := range []struct {
		vendor        string
		family, model uint32
		want          CPUFamily
	}{
		{amdVendor, 0x19, 0x00, CPUAMDMilan},
		{amdVendor, 0x19, 0x0f, CPUAMDMilan},
		{amdVendor, 0x19, 0x10, CPUAMDMilan},
		{amdVendor, 0x19, 0x1f, CPUAMDMilan},
		{amdVendor, 0x19, 0x20, CPUAMDMilan},
		{amdVendor, 0x19, 0x2f, CPUAMDMilan},
		{amdVendor, 0x19, 0x30, CPUUnknown},
		{amdVendor, 0x19, 0x5f, CPUUnknown},
		{amdVendor, 0x19, 0x60, CPUAMDMilan},
		{amdVendor, 0x19, 0x6f, CPUAMDMilan},
		{amdVendor, 0x19, 0x70, CPUUnknown},
		{amdVendor, 0x1a, 0x00, CPUAMDTurin},
		{amdVendor, 0x1a, 0x0f, CPUAMDTurin},
		{amdVendor, 0x1a, 0x10, CPUAMDTurinDns},
		{amdVendor, 0x1a, 0x1f, CPUAMDTurinDns},
		{amdVendor, 0x1a, 0x20, CPUUnknown},
		{amdVendor, 0x1a, 0x3f, CPUUnknown},
		{amdVendor, 0x1a, 0x40, CPUAMDTurin},
		{amdVendor, 0x1a, 0x4f, CPUAMDTurin},
		{amdVendor, 0x1a, 0x50, CPUUnknown},
		{amdVendor, 0x17, 0x31, CPUUnknown}, // Rome
		{amdVendor, 0x1b, 0x00, CPUUnknown},
		{"HygonGenuine", 0x18, 0x01, CPUUnknown},
		{"GenuineIntel", 0x19, 0x01, CPUUnknown}, // the numbers are AMD's only
	} {
		id := cpuID{Vendor: tc.vendor, Family: tc.family, Model: tc.model}
		if got := id.family(); got != tc.want {
			t.Errorf("%s family %#x model %#x: %s, want %s", tc.vendor, tc.family, tc.model, got, tc.want)
		}
	}
}

func TestParseCPUInfoRejectsGarbage(t *testing.T) {
	for _, in := range []string{
		"",
		"vendor_id\t: AuthenticAMD\ncpu family\t: 25\n",              // no model
		"vendor_id\t: AuthenticAMD\ncpu family\t: x\nmodel\t\t: 1\n", // not a number
	} {
		if id, err := parseCPUInfo(strings.NewReader(in)); err == nil {
			t.Errorf("parseCPUInfo(%q) = %+v, want an error", in, id)
		}
	}
}

func TestProbeReportsUnknownCPUWithANote(t *testing.T) {
	info, notes, err := Probe(Options{
		DMIDir:  filepath.Join("testdata", "dmi", "lenovo"),
		CPUInfo: filepath.Join(t.TempDir(), "no-cpuinfo"),
		MemInfo: filepath.Join("testdata", "meminfo"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if info.CPUFamily != CPUUnknown {
		t.Errorf("cpu family %s, want %s", info.CPUFamily, CPUUnknown)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "cpu family") || !strings.Contains(notes[0], "no-cpuinfo") {
		t.Errorf("notes %q: want one on the cpu family naming the missing file", notes)
	}
}

// An Info made by hand, whose CPU was never looked at, reports it unknown.
func TestFamilyOfAnInfoMadeByHand(t *testing.T) {
	if got := (Info{}).Family(); got != CPUUnknown {
		t.Errorf("Info{}.Family() = %q, want %q", got, CPUUnknown)
	}
	if got := (Info{CPUFamily: CPUAMDMilan}).Family(); got != CPUAMDMilan {
		t.Errorf("Family() = %q, want %q", got, CPUAMDMilan)
	}
}

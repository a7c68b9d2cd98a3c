package hardware

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestProbeFromRecordedFiles(t *testing.T) {
	info, notes, err := Probe(Options{
		DMIDir:   filepath.Join("testdata", "dmi", "lenovo"),
		CPUInfo:  filepath.Join("testdata", "cpuinfo", "turin-dense"),
		MemInfo:  filepath.Join("testdata", "meminfo"),
		Hostname: host("sled-host-7"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 0 {
		t.Errorf("notes %q, want none: everything was readable", notes)
	}
	want := Baseboard{Part: "7D2XCTO1WW", Revision: 7, Serial: "J900ABCD"}
	if info.Baseboard != want {
		t.Errorf("baseboard %+v, want %+v", info.Baseboard, want)
	}
	if info.CPUFamily != CPUAMDTurinDns {
		t.Errorf("cpu family %s, want %s", info.CPUFamily, CPUAMDTurinDns)
	}
	if want := uint64(528157184) * 1024; info.PhysicalRAM != want {
		t.Errorf("physical RAM %d, want MemTotal %d", info.PhysicalRAM, want)
	}
	if info.HardwareThreads < 1 {
		t.Errorf("hardware threads %d, want at least 1", info.HardwareThreads)
	}
}

// The operator's values replace what the firmware says, and the notes on
// what they replace.
func TestProbeOverrides(t *testing.T) {
	rev := uint32(0)
	for _, tc := range []struct {
		name  string
		opts  Options
		want  Baseboard
		notes int
	}{
		{name: "all", opts: Options{Part: "913-0000019", Serial: "BRM42220004", Revision: &rev},
			want: Baseboard{Part: "913-0000019", Serial: "BRM42220004", Revision: 0}},
		{name: "serial only", opts: Options{Serial: "BRM42220004"},
			// qemu's part stands; its revision note stays.
			want: Baseboard{Part: "Standard PC (Q35 + ICH9, 2009)", Serial: "BRM42220004"}, notes: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.DMIDir = filepath.Join("testdata", "dmi", "qemu")
			tc.opts.CPUInfo = filepath.Join("testdata", "cpuinfo", "milan")
			tc.opts.MemInfo = filepath.Join("testdata", "meminfo")
			tc.opts.Hostname = host("sled-host-7")
			info, notes, err := Probe(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if info.Baseboard != tc.want {
				t.Errorf("baseboard %+v, want %+v", info.Baseboard, tc.want)
			}
			if len(notes) != tc.notes {
				t.Errorf("notes %q, want %d", notes, tc.notes)
			}
		})
	}
}

func TestProbeRefusesBadOverrides(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Part: " 913-0000019"}, "baseboard-part"},
		{Options{Serial: "BRM4222\n0004"}, "baseboard-serial"},
	} {
		if _, _, err := Probe(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Probe(%+v): %v, want an error naming %s", tc.opts, err, tc.want)
		}
	}
}

func TestParseMemInfo(t *testing.T) {
	for _, in := range []string{
		"",
		"MemFree: 100 kB\n",
		"MemTotal: 100\n",
		"MemTotal: many kB\n",
		"MemTotal: 0 kB\n",
		"MemTotal: 18446744073709551615 kB\n", // overflows in bytes
	} {
		if n, err := parseMemInfo(strings.NewReader(in)); err == nil {
			t.Errorf("parseMemInfo(%q) = %d, want an error", in, n)
		}
	}
	n, err := parseMemInfo(strings.NewReader("MemTotal:        1024 kB\nMemFree: 1 kB\n"))
	if err != nil || n != 1<<20 {
		t.Errorf("parseMemInfo = %d, %v; want %d", n, err, 1<<20)
	}
}

// This machine, for real: only what holds on any host.
func TestProbeThisHost(t *testing.T) {
	info, notes, err := Probe(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this host: %+v; notes: %q", info, notes)
	if info.PhysicalRAM == 0 {
		t.Error("no physical RAM")
	}
	if info.HardwareThreads < 1 {
		t.Errorf("%d hardware threads", info.HardwareThreads)
	}
	if info.Baseboard.Part == "" || info.Baseboard.Serial == "" {
		t.Errorf("baseboard %+v: part and serial must not be empty", info.Baseboard)
	}
	switch info.CPUFamily {
	case CPUUnknown, CPUAMDMilan, CPUAMDTurin, CPUAMDTurinDns:
	default:
		t.Errorf("cpu family %q is none of upstream's", info.CPUFamily)
	}
}

package hardware

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func host(name string) func() (string, error) {
	return func() (string, error) { return name, nil }
}

// The sets under testdata/dmi are /sys/class/dmi/id as Linux shows it on
// those machines (one value and a newline a file).
func TestBaseboardFromDMI(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		want Baseboard
		// notes: the fields with a note, and what each must mention.
		notePart, noteSerial, noteRevision string
	}{
		// Everything in the system's structure; "07" is revision 7.
		{dir: "lenovo", want: Baseboard{Part: "7D2XCTO1WW", Revision: 7, Serial: "J900ABCD"}},
		// The system's version is empty: revision 0, with a note.
		{dir: "dell", want: Baseboard{Part: "PowerEdge R6525", Revision: 0, Serial: "8XYZ123"},
			noteRevision: "product_version is empty"},
		// The system's structure holds the maker's placeholders: the board's
		// name and serial; its version "1.02" is not a whole number.
		{dir: "supermicro", want: Baseboard{Part: "H12SSL-NT", Revision: 0, Serial: "UM21AS012345"},
			noteRevision: `board_version "1.02" is not a number`},
		// A VM: a product name but no serial anywhere: the host name.
		{dir: "qemu", want: Baseboard{Part: "Standard PC (Q35 + ICH9, 2009)", Revision: 0, Serial: "sled-host-7"},
			noteSerial: "host name", noteRevision: `"pc-q35-8.2" is not a number`},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			b, notes := readBaseboard(filepath.Join("testdata", "dmi", tc.dir), host("sled-host-7"))
			if b != tc.want {
				t.Errorf("baseboard %+v, want %+v", b, tc.want)
			}
			checkNote(t, "part", notes.Part, tc.notePart)
			checkNote(t, "serial", notes.Serial, tc.noteSerial)
			checkNote(t, "revision", notes.Revision, tc.noteRevision)
		})
	}
}

func checkNote(t *testing.T, field, got, want string) {
	t.Helper()
	switch {
	case want == "" && got != "":
		t.Errorf("%s: unexpected note %q", field, got)
	case want != "" && !strings.Contains(got, want):
		t.Errorf("%s: note %q does not mention %q", field, got, want)
	}
}

// No DMI at all (a VM without SMBIOS, a machine without firmware tables):
// what upstream's PC sleds report, never an empty part or serial.
func TestBaseboardWithoutDMI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "no-dmi")
	b, notes := readBaseboard(dir, host("sled-host-7"))
	if want := (Baseboard{Part: PCPart, Serial: "sled-host-7"}); b != want {
		t.Errorf("baseboard %+v, want %+v", b, want)
	}
	checkNote(t, "part", notes.Part, "product_name is missing, board_name is missing")
	checkNote(t, "serial", notes.Serial, "host name")
	checkNote(t, "revision", notes.Revision, "reporting 0")

	// Without a host name either: upstream's unknown identifier.
	for _, hostname := range []func() (string, error){
		host(""),
		func() (string, error) { return "", errors.New("uname failed") },
	} {
		b, notes = readBaseboard(dir, hostname)
		if b.Serial != UnknownSerial || !strings.Contains(notes.Serial, UnknownSerial) {
			t.Errorf("serial %q (note %q), want %q", b.Serial, notes.Serial, UnknownSerial)
		}
	}
}

// A serial that cannot be read (as a non-root user cannot read
// product_serial) falls to the next source, then to the host name.
func TestBaseboardUnreadableSerial(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	write("product_name", "ProLiant DL325 Gen10 Plus")
	write("product_version", "Rev 2")
	// A directory where the file should be: reading it fails, as an
	// unreadable file's would (the test runs as root, whom no mode stops).
	for _, name := range []string{"product_serial", "board_serial"} {
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	b, notes := readBaseboard(dir, host("sled-host-7"))
	if want := (Baseboard{Part: "ProLiant DL325 Gen10 Plus", Revision: 2, Serial: "sled-host-7"}); b != want {
		t.Errorf("baseboard %+v, want %+v", b, want)
	}
	checkNote(t, "part", notes.Part, "")
	checkNote(t, "serial", notes.Serial, "product_serial is unreadable")
	checkNote(t, "revision", notes.Revision, "")

	// With the board's serial readable, that is the serial.
	if err := os.Remove(filepath.Join(dir, "board_serial")); err != nil {
		t.Fatal(err)
	}
	write("board_serial", "PWARKB1234")
	if b, _ := readBaseboard(dir, host("sled-host-7")); b.Serial != "PWARKB1234" {
		t.Errorf("serial %q, want the board's PWARKB1234", b.Serial)
	}
}

func TestPlaceholders(t *testing.T) {
	for v, want := range map[string]bool{
		"To Be Filled By O.E.M.": true,
		"Default string":         true,
		"System Serial Number":   true,
		"0123456789":             true,
		"00000000":               true,
		"XXXXXXXXXX":             true,
		"Not Specified":          true,
		"H12SSL-NT":              false,
		"0":                      false,
		"8XYZ123":                false,
		"PowerEdge R6525":        false,
	} {
		if got := isPlaceholder(v); got != want {
			t.Errorf("isPlaceholder(%q) = %t, want %t", v, got, want)
		}
	}
}

func TestParseRevision(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"0", 0, true},
		{"3", 3, true},
		{"07", 7, true},
		{"Rev 2", 2, true},
		{"REV:4", 4, true},
		{"v3", 3, true},
		{"R03", 3, true},
		{"1.0", 1, true},
		{"2.00", 2, true},
		{"4294967295", 4294967295, true},
		{"4294967296", 0, false},
		{"1.02", 0, false},
		{"1.", 0, false},
		{"A01", 0, false},
		{"pc-q35-8.2", 0, false},
		{"-1", 0, false},
		{"", 0, false},
		{"rev", 0, false},
	} {
		got, ok := parseRevision(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRevision(%q) = %d, %t; want %d, %t", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

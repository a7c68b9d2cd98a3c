package wire

import (
	"errors"
	"testing"
)

// The buffers of oxide-vpc's lib/oxide-vpc/src/engine/geneve.rs tests, UDP
// header included as there; ParseGeneve gets what follows it.

func TestGeneveOPTEParseSingleOpt(t *testing.T) {
	buf := []byte{
		0x1E, 0x61, 0x17, 0xC1, 0x00, 0x14, 0x00, 0x00,
		0x01, 0x00, 0x65, 0x58, 0x00, 0x04, 0xD2, 0x00,
		0x01, 0x29, 0x00, 0x00,
	}
	var g Geneve
	if err := ParseGeneve(buf[UDPLen:], &g); err != nil {
		t.Fatal(err)
	}
	if !g.External || g.VNI != 1234 || g.OptLen != 4 || g.InnerOff != 12 {
		t.Errorf("%+v", g)
	}
}

func TestGeneveOPTEParseMultiOpt(t *testing.T) {
	buf := []byte{
		0x1E, 0x61, 0x17, 0xC1, 0x00, 0x24, 0x00, 0x00,
		0x05, 0x00, 0x65, 0x58, 0x00, 0x04, 0xD2, 0x00,
		0x01, 0x29, 0x00, 0x00,
		0xff, 0xff, 0x05, 0x01, 0x00, 0x00, 0x00, 0x00,
		0xff, 0xff, 0x06, 0x01, 0x00, 0x00, 0x00, 0x00,
	}
	var g Geneve
	if err := ParseGeneve(buf[UDPLen:], &g); err != nil {
		t.Fatal(err)
	}
	if !g.External || g.HasMSS || g.HasMulticast {
		t.Errorf("%+v", g)
	}
	it := GeneveOptions(buf[UDPLen:])
	var got []Option
	for {
		o, ok, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, o)
	}
	if len(got) != 3 || got[1].Class != 0xffff || got[1].Type != 5 || len(got[1].Data) != 4 || got[2].Type != 6 {
		t.Errorf("options %+v", got)
	}
}

func TestGeneveOPTEUnknownCriticalFails(t *testing.T) {
	for _, class := range []uint16{0xffff, OxideOptionClass} {
		buf := []byte{
			0x01, 0b0100_0000, 0x65, 0x58, 0x00, 0x04, 0xD2, 0x00,
			byte(class >> 8), byte(class), 0x80, 0x00,
		}
		var g Geneve
		err := ParseGeneve(buf, &g)
		var uc UnknownCriticalOptionError
		if !errors.As(err, &uc) || uc.Class != class || uc.Type != 0x80 {
			t.Errorf("class %#x: %v", class, err)
		}
		// OPTE walks the options only when the C bit is set.
		buf[1] = 0
		if err := ParseGeneve(buf, &g); err != nil {
			t.Errorf("class %#x without C: %v", class, err)
		}
	}
}

func TestGeneveOPTEMulticastLength(t *testing.T) {
	// option_packet_length_with_known_options and parse_multicast_replication_values.
	for _, r := range []Replication{ReplicationExternal, ReplicationUnderlay, ReplicationBoth, ReplicationReserved} {
		buf := []byte{
			0x02, 0x00, 0x65, 0x58, 0x00, 0x00, 0x00, 0x00,
			0x01, 0x29, 0x01, 0x01, byte(r) << 6, 0x00, 0x00, 0x00,
		}
		var g Geneve
		if err := ParseGeneve(buf, &g); err != nil {
			t.Fatal(err)
		}
		if !g.HasMulticast || g.Replication != r || g.InnerOff != 16 {
			t.Errorf("%d: %+v", r, g)
		}
	}
}

func TestGeneveMalformedOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		buf  []byte
	}{
		// an option's length runs past opt_len
		{"overrun", []byte{0x01, 0x00, 0x65, 0x58, 0, 0, 1, 0, 0x01, 0x29, 0x00, 0x01, 0, 0, 0, 0}},
		// the MSS option with no body: ingot's MssInfo parse fails in OPTE
		{"mss without body", []byte{0x01, 0x00, 0x65, 0x58, 0, 0, 1, 0, 0x01, 0x29, 0x02, 0x00}},
	} {
		b := append([]byte(nil), c.buf...)
		var g Geneve
		if err := ParseGeneve(b, &g); err != nil || !g.OptionsMalformed || g.HasMSS {
			t.Errorf("%s, C clear: %v %+v", c.name, err, g)
		}
		b[1] = GeneveFlagCritical
		if err := ParseGeneve(b, &g); !errors.Is(err, ErrGeneveOption) {
			t.Errorf("%s, C set: %v", c.name, err)
		}
	}
}

func TestGeneveHeaderFields(t *testing.T) {
	var g Geneve
	b := []byte{0x00, 0xc0, 0x65, 0x58, 0xff, 0xff, 0xff, 0xaa}
	if err := ParseGeneve(b, &g); err != nil {
		t.Fatal(err)
	}
	if !g.OAM || !g.Critical || g.VNI != MaxVNI {
		t.Errorf("%+v", g)
	}
	if err := ParseGeneve(b[:7], &g); !errors.Is(err, ErrTruncated) {
		t.Errorf("short: %v", err)
	}
	b[0] = 0x01 // claims 4 bytes of options that are not there
	if err := ParseGeneve(b, &g); !errors.Is(err, ErrTruncated) {
		t.Errorf("options past end: %v", err)
	}
}

func FuzzParseGeneve(f *testing.F) {
	f.Add(goldenInternalTCP[OuterLen:])
	f.Add(goldenSwitchICMP[OuterLen:])
	f.Fuzz(func(t *testing.T, b []byte) {
		var g Geneve
		if ParseGeneve(b, &g) == nil && g.InnerOff > len(b) {
			t.Fatalf("inner offset %d past %d", g.InnerOff, len(b))
		}
	})
}

package configstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// fakeLedger records commits and returns scripted results.
type fakeLedger struct {
	mu        sync.Mutex
	rec       ledger.Record
	copies    []ledger.CopyStatus
	readErr   error
	commitErr error
	commits   []uint64
	repairs   int
	// entered, if set, is closed when Commit is entered; block, if set, is
	// then waited on.
	entered, block chan struct{}
}

func (f *fakeLedger) Read() (ledger.Record, []ledger.CopyStatus, error) {
	return f.rec, f.copies, f.readErr
}

func (f *fakeLedger) Commit(rec ledger.Record) ([]ledger.CopyStatus, error) {
	if f.entered != nil {
		close(f.entered)
		<-f.block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commits = append(f.commits, rec.Generation)
	if f.commitErr != nil {
		return nil, f.commitErr
	}
	f.rec = rec
	return nil, nil
}

func (f *fakeLedger) Repair(rec ledger.Record) ([]ledger.CopyStatus, []ledger.CopyStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.repairs++
	return f.copies, f.copies, nil
}

func (f *fakeLedger) Status() []ledger.CopyStatus { return f.copies }

func (f *fakeLedger) repairCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.repairs
}

func (f *fakeLedger) committed() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint64(nil), f.commits...)
}

func doc(gen uint64, n int) []byte {
	b, _ := json.Marshal(sledconfigtest.Config(gen, sledconfigtest.Crucibles(n)...))
	return b
}

// sledUnderlay is the sled's address in the tests; doc's zones do not use it.
var sledUnderlay = netip.MustParseAddr("fd00:1122:3344:101::1")

// docWith is a config of generation gen whose first crucible is changed.
func docWith(gen uint64, change func(z *sledconfig.Zone)) []byte {
	zones := sledconfigtest.Crucibles(2)
	change(&zones[0])
	b, _ := json.Marshal(sledconfigtest.Config(gen, zones...))
	return b
}

func TestOpen(t *testing.T) {
	loopback := docWith(7, func(z *sledconfig.Zone) { z.ZoneType.Address = "[::1]:32345" })
	onSled := docWith(7, func(z *sledconfig.Zone) { z.ZoneType.Address = "[fd00:1122:3344:101::1]:32345" })
	offSled := docWith(7, func(z *sledconfig.Zone) { z.ZoneType.Address = "[2001:4860:4860::8888]:32345" })
	cases := []struct {
		name        string
		l           *fakeLedger
		wantGen     uint64 // 0: no config
		wantProblem string
		wantCommits int
	}{
		{"ledgered before a newer rule: loaded, reported", &fakeLedger{rec: ledger.Record{Generation: 7, Data: loopback},
			copies: []ledger.CopyStatus{{State: ledger.StateOK}, {State: ledger.StateOK}}}, 7,
			"generation 7 was loaded, but fails validation: the zones it names keep failing until a config that passes is put: invalid sled config: 1 problem: zones[\"" + sledconfigtest.ZoneID(0) + "\"].zone_type.address", 0},
		{"zone on the sled's own address: loaded, reported", &fakeLedger{rec: ledger.Record{Generation: 7, Data: onSled},
			copies: []ledger.CopyStatus{{State: ledger.StateOK}, {State: ledger.StateOK}}}, 7, "the sled's own underlay address", 0},
		// Ledgered by an agent that did not know the rule: the sled's
		// zones stay managed, none is torn down on its account.
		{"zone off the sled's subnet: loaded, reported", &fakeLedger{rec: ledger.Record{Generation: 7, Data: offSled},
			copies: []ledger.CopyStatus{{State: ledger.StateOK}, {State: ledger.StateOK}}}, 7,
			"generation 7 was loaded, but fails validation: the zones it names keep failing until a config that passes is put: invalid sled config: 1 problem: zones[\"" + sledconfigtest.ZoneID(0) + "\"].zone_type.address: underlay address 2001:4860:4860::8888 is outside the sled's subnet", 0},
		{"generation upstream cannot hold: not loaded", &fakeLedger{rec: ledger.Record{Generation: 1 << 63, Data: doc(1<<63, 2)},
			copies: []ledger.CopyStatus{{State: ledger.StateOK}, {State: ledger.StateOK}}}, 0, "is not usable", 0},
		{"fresh", &fakeLedger{readErr: ledger.ErrNotFound}, 0, "", 0},
		{"corrupt", &fakeLedger{readErr: fmt.Errorf("copy a: bad checksum: %w", ledger.ErrCorrupt)}, 0, "bad checksum", 0},
		{"unparseable", &fakeLedger{rec: ledger.Record{Generation: 3, Data: []byte(`{"generation":3}`)}}, 0, "generation 3 is not usable", 0},
		{"good", &fakeLedger{rec: ledger.Record{Generation: 7, Data: doc(7, 2)},
			copies: []ledger.CopyStatus{{State: ledger.StateOK}, {State: ledger.StateOK}}}, 7, "", 0},
		{"one copy corrupt is rewritten", &fakeLedger{rec: ledger.Record{Generation: 7, Data: doc(7, 2)},
			copies: []ledger.CopyStatus{{State: ledger.StateOK}, {State: ledger.StateCorrupt}}}, 7, "", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var notified []*sledconfig.Config
			s := configstore.Open(c.l, nil, func(cfg *sledconfig.Config) { notified = append(notified, cfg) },
				configstore.Options{SledUnderlay: sledUnderlay})
			cur := s.Current()
			switch {
			case c.wantGen == 0 && (cur != nil || len(notified) != 0):
				t.Fatalf("config %v loaded, notified %d", cur, len(notified))
			case c.wantGen != 0 && (cur == nil || cur.Generation != c.wantGen || len(notified) != 1 || notified[0] != cur):
				t.Fatalf("config %v, notified %v; want generation %d", cur, notified, c.wantGen)
			}
			if p := s.LoadProblem(); (c.wantProblem == "") != (p == "") || !strings.Contains(p, c.wantProblem) {
				t.Errorf("LoadProblem = %q, want %q", p, c.wantProblem)
			}
			if n := len(c.l.committed()); n != c.wantCommits {
				t.Errorf("%d commits at open, want %d", n, c.wantCommits)
			}
		})
	}
}

func TestPut(t *testing.T) {
	l := &fakeLedger{readErr: ledger.ErrNotFound}
	var notified []uint64
	s := configstore.Open(l, nil, func(cfg *sledconfig.Config) { notified = append(notified, cfg.Generation) }, configstore.Options{})
	ctx := context.Background()
	steps := []struct {
		doc  []byte
		want error
	}{
		{doc(5, 2), nil},
		{doc(5, 2), nil}, // same: no-op
		{doc(5, 1), configstore.ErrGenerationConflict},
		{doc(4, 2), configstore.ErrOldGeneration},
		{[]byte(`{`), configstore.ErrInvalid},
		{doc(6, 1), nil},
	}
	for i, st := range steps {
		err := s.Put(ctx, st.doc)
		if (st.want == nil) != (err == nil) || (st.want != nil && !errors.Is(err, st.want)) {
			t.Fatalf("step %d: err %v, want %v", i, err, st.want)
		}
	}
	if got := l.committed(); fmt.Sprint(got) != "[5 6]" {
		t.Errorf("commits %v, want [5 6]", got)
	}
	if fmt.Sprint(notified) != "[5 6]" {
		t.Errorf("notified %v, want [5 6]", notified)
	}
	// Invalid configs read as one message, not "invalid … invalid …".
	err := s.Put(ctx, []byte(`{"generation":9}`))
	if msg := err.Error(); strings.Count(msg, "invalid sled config") != 1 {
		t.Errorf("message %q", msg)
	}
}

// A config that no runtime could realise is refused, naming the zone and
// the field, and changes nothing.
func TestPutRefusesWhatCannotBeRealised(t *testing.T) {
	l := &fakeLedger{readErr: ledger.ErrNotFound}
	s := configstore.Open(l, nil, nil, configstore.Options{SledUnderlay: sledUnderlay})
	if err := s.Put(t.Context(), doc(5, 2)); err != nil {
		t.Fatal(err)
	}
	zone := `zones["` + sledconfigtest.ZoneID(0) + `"]`
	for _, c := range []struct {
		name string
		doc  []byte
		want string
	}{
		{"loopback", docWith(6, func(z *sledconfig.Zone) { z.ZoneType.Address = "[::1]:32345" }), zone + ".zone_type.address: \"[::1]:32345\": ::1 is a loopback address"},
		{"port 0", docWith(6, func(z *sledconfig.Zone) { z.ZoneType.Address = "[fd00:1122:3344:101::10]:0" }), zone + ".zone_type.address: \"[fd00:1122:3344:101::10]:0\" has port 0"},
		{"the sled's address", docWith(6, func(z *sledconfig.Zone) { z.ZoneType.Address = "[fd00:1122:3344:101::1]:32345" }),
			zone + ".zone_type.address: underlay address fd00:1122:3344:101::1 is the sled's own underlay address"},
		{"off the sled's subnet", docWith(6, func(z *sledconfig.Zone) { z.ZoneType.Address = "[2001:4860:4860::8888]:32345" }),
			zone + ".zone_type.address: underlay address 2001:4860:4860::8888 is outside the sled's subnet fd00:1122:3344:101::/64"},
		{"generation", doc(1<<63, 2), "generation: 9223372036854775808 is larger than the largest generation"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := s.Put(t.Context(), c.doc)
			if !errors.Is(err, configstore.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Put = %v, want ErrInvalid saying %q", err, c.want)
			}
		})
	}
	if got := l.committed(); fmt.Sprint(got) != "[5]" {
		t.Errorf("commits %v, want [5]", got)
	}
	if g := s.Current().Generation; g != 5 {
		t.Errorf("current generation %d", g)
	}
}

func TestPutWhenLedgerFails(t *testing.T) {
	l := &fakeLedger{readErr: ledger.ErrNotFound, commitErr: fmt.Errorf("disk gone: %w", ledger.ErrNoCopyWritten)}
	s := configstore.Open(l, nil, nil, configstore.Options{})
	err := s.Put(context.Background(), doc(1, 1))
	if !errors.Is(err, configstore.ErrUnavailable) || !errors.Is(err, ledger.ErrNoCopyWritten) {
		t.Fatalf("err %v", err)
	}
	if s.Current() != nil {
		t.Fatal("a config that was not ledgered became current")
	}
}

func TestPutGivesUpWaitingForAStuckCommit(t *testing.T) {
	l := &fakeLedger{readErr: ledger.ErrNotFound, block: make(chan struct{}), entered: make(chan struct{})}
	s := configstore.Open(l, nil, nil, configstore.Options{})
	first := make(chan error)
	go func() { first <- s.Put(context.Background(), doc(1, 1)) }()
	<-l.entered // the first Put is inside Commit, holding the commit slot

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(ctx, doc(2, 1)); !errors.Is(err, configstore.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("second Put while a commit is stuck: %v", err)
	}
	close(l.block)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := l.committed(); fmt.Sprint(got) != "[1]" {
		t.Fatalf("commits %v", got)
	}
}

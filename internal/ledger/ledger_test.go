package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

const testName = "omicron-sled-config.json"

// newLedger opens a ledger over n fresh directories.
func newLedger(t *testing.T, n int) (*Ledger, []string) {
	t.Helper()
	root := t.TempDir()
	var dirs []string
	for i := range n {
		dirs = append(dirs, filepath.Join(root, fmt.Sprintf("m2-%d", i), "config"))
	}
	l, err := Open(dirs, testName, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l, dirs
}

func doc(gen uint64) []byte {
	return fmt.Appendf(nil, `{"generation":%d,"zones":[{"id":"z%d","kind":"internal_dns"}]}`, gen, gen)
}

func mustCommit(t *testing.T, l *Ledger, gen uint64) Record {
	t.Helper()
	rec := Record{Generation: gen, Data: doc(gen)}
	st, err := l.Commit(rec)
	if err != nil {
		t.Fatalf("Commit(%d): %v", gen, err)
	}
	wantStates(t, "Commit", st, StateOK, StateOK)
	return rec
}

func mustRead(t *testing.T, l *Ledger, want Record) []CopyStatus {
	t.Helper()
	got, st, err := l.Read()
	if err != nil {
		t.Fatalf("Read: %v (statuses %+v)", err, st)
	}
	if got.Generation != want.Generation || !bytes.Equal(got.Data, want.Data) {
		t.Fatalf("Read = gen %d %q, want gen %d %q", got.Generation, got.Data, want.Generation, want.Data)
	}
	return st
}

// wantStates checks the states of the first len(want) copies (all of them
// when len(want) == len(st)).
func wantStates(t *testing.T, what string, st []CopyStatus, want ...CopyState) {
	t.Helper()
	var got []CopyState
	for _, s := range st {
		got = append(got, s.State)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s states = %v, want %v (%+v)", what, got, want, st)
	}
}

func copyPath(dir string) string { return filepath.Join(dir, testName) }

func TestCommitThenRead(t *testing.T) {
	l, dirs := newLedger(t, 2)
	rec := mustCommit(t, l, 3)
	st := mustRead(t, l, rec)
	wantStates(t, "Read", st, StateOK, StateOK)
	for i, s := range st {
		if s.Path != copyPath(dirs[i]) || s.Generation != 3 || s.Err != "" {
			t.Errorf("status %d = %+v", i, s)
		}
	}
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s created with mode %v, want no group/other access", d, perm)
		}
	}

	// A second Ledger over the same directories (an agent restart) sees it.
	l2, err := Open(dirs, testName, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustRead(t, l2, rec)
}

func TestFileFormat(t *testing.T) {
	l, dirs := newLedger(t, 1)
	data := []byte(`{"a":"<&>","b":[1, 2]}`) // not compact, has HTML characters
	if _, err := l.Commit(Record{Generation: 12, Data: data}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(copyPath(dirs[0]))
	if err != nil {
		t.Fatal(err)
	}
	// sha256 of "12\n" + data, computed independently:
	// printf '12\n%s' '{"a":"<&>","b":[1, 2]}' | sha256sum
	want := `{"format":1,"generation":12,"sha256":"` + checksum(12, data) + `","data":{"a":"<&>","b":[1, 2]}}` + "\n"
	if string(got) != want {
		t.Fatalf("file =\n%s\nwant\n%s", got, want)
	}
	if bytes.Count(got, []byte("\n")) != 1 {
		t.Errorf("file is not one line")
	}
	rec, _, err := l.Read()
	if err != nil || !bytes.Equal(rec.Data, data) {
		t.Fatalf("Read = %q, %v; want data exactly as committed", rec.Data, err)
	}
}

func TestChecksumKnownValue(t *testing.T) {
	// Pins the checksum definition so it cannot drift: sha256("1\n{}").
	// printf '1\n{}' | sha256sum
	const want = "2abb749635de1a7f1d45ce3a27636ef330ff16dee7fdaa274fc681af89860e52"
	if got := checksum(1, []byte("{}")); got != want {
		t.Fatalf("checksum(1, {}) = %s, want %s", got, want)
	}
}

func TestHigherGenerationWins(t *testing.T) {
	l, _ := newLedger(t, 2)
	mustCommit(t, l, 1)
	rec := mustCommit(t, l, 2)
	wantStates(t, "Read", mustRead(t, l, rec), StateOK, StateOK)
}

func TestStaleCopy(t *testing.T) {
	for stale := range 2 {
		t.Run(fmt.Sprintf("copy%d", stale), func(t *testing.T) {
			l, dirs := newLedger(t, 2)
			mustCommit(t, l, 4)
			old, err := os.ReadFile(copyPath(dirs[stale]))
			if err != nil {
				t.Fatal(err)
			}
			rec := mustCommit(t, l, 5)
			if err := os.WriteFile(copyPath(dirs[stale]), old, 0o600); err != nil {
				t.Fatal(err)
			}
			st := mustRead(t, l, rec)
			s := st[stale]
			if s.State != StateStale || s.Generation != 4 || !strings.Contains(s.Err, "older") {
				t.Fatalf("stale copy status = %+v", s)
			}
			if o := st[1-stale]; o.State != StateOK || o.Generation != 5 {
				t.Fatalf("good copy status = %+v", o)
			}
			mustCommit(t, l, 6)
			wantStates(t, "Read", mustRead(t, l, Record{Generation: 6, Data: doc(6)}), StateOK, StateOK)
		})
	}
}

func TestSameGenerationDifferentData(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 7)
	other := encodeCopy(Record{Generation: 7, Data: []byte(`{"other":true}`)})
	if err := os.WriteFile(copyPath(dirs[1]), other, 0o600); err != nil {
		t.Fatal(err)
	}
	st := mustRead(t, l, Record{Generation: 7, Data: doc(7)}) // the first directory wins the tie
	if st[1].State != StateStale || !strings.Contains(st[1].Err, "different data") {
		t.Fatalf("status = %+v", st[1])
	}
}

func TestInterruptedWrite(t *testing.T) {
	l, dirs := newLedger(t, 2)
	rec := mustCommit(t, l, 8)

	// A crash between write and rename leaves a temp file of any content
	// next to the good copy: garbage, a partial envelope of a newer
	// generation, even a complete one.
	leftovers := [][]byte{
		[]byte("\x00\xffgarbage"),
		encodeCopy(Record{Generation: 9, Data: doc(9)})[:40],
		encodeCopy(Record{Generation: 9, Data: doc(9)}),
	}
	var temps []string
	for i, b := range leftovers {
		p := filepath.Join(dirs[i%2], tempName(testName))
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		temps = append(temps, p)
	}
	// Files Open must not touch: another ledger's temp file, a foreign file.
	keep := []string{
		filepath.Join(dirs[0], tempName("other.json")),
		filepath.Join(dirs[0], tempName(testName+".0123456789abcdef")),
		filepath.Join(dirs[0], tempPrefix+testName+".notours"),
		filepath.Join(dirs[0], "README"),
	}
	for _, p := range keep {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	wantStates(t, "Read", mustRead(t, l, rec), StateOK, StateOK)
	for _, p := range temps {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("Read touched temp file %s: %v", p, err)
		}
	}

	l2, err := Open(dirs, testName, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range temps {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Open left temp file %s (err %v)", p, err)
		}
	}
	for _, p := range keep {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("Open removed %s: %v", p, err)
		}
	}
	wantStates(t, "Read", mustRead(t, l2, rec), StateOK, StateOK)
}

func TestCommitLeavesNoTempFiles(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 1)
	mustCommit(t, l, 2)
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != testName {
			t.Errorf("%s holds %v, want only %s", d, entries, testName)
		}
	}
}

// corruptions damage a valid copy file in ways Read must detect.
var corruptions = []struct {
	name   string
	damage func(b []byte) []byte
	reason string // substring of the status Err
}{
	{"flip data byte", func(b []byte) []byte {
		i := bytes.Index(b, []byte("internal_dns"))
		b[i] ^= 0x01 // 'i' -> 'h': still valid JSON
		return b
	}, "checksum mismatch"},
	{"flip generation digit", func(b []byte) []byte {
		i := bytes.Index(b, []byte(`"generation":12`))
		b[i+len(`"generation":1`)] = '3'
		return b
	}, "checksum mismatch"},
	{"flip checksum digit", func(b []byte) []byte {
		i := bytes.Index(b, []byte(`"sha256":"`)) + len(`"sha256":"`)
		if b[i] == '0' {
			b[i] = '1'
		} else {
			b[i] = '0'
		}
		return b
	}, "checksum mismatch"},
	{"truncate", func(b []byte) []byte { return b[:len(b)/2] }, "does not end in a newline"},
	{"truncate to newline", func(b []byte) []byte {
		return append(b[:len(b)/2:len(b)/2], '\n')
	}, "not a valid envelope"},
	{"drop final newline", func(b []byte) []byte { return b[:len(b)-1] }, "does not end in a newline"},
	{"empty", func([]byte) []byte { return nil }, "empty file"},
	{"wrong format", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"format":1`), []byte(`"format":2`), 1)
	}, "unsupported format 2"},
	{"no checksum", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"sha256":`), []byte(`"sha512":`), 1)
	}, `no "sha256" member`},
	{"not JSON", func([]byte) []byte { return []byte("hello\n") }, "not a valid envelope"},
	{"trailing garbage", func(b []byte) []byte { return append(b, "{}\n"...) }, "not a valid envelope"},
}

func TestCorruptCopy(t *testing.T) {
	for _, c := range corruptions {
		for bad := range 2 {
			t.Run(fmt.Sprintf("%s/copy%d", c.name, bad), func(t *testing.T) {
				l, dirs := newLedger(t, 2)
				rec := mustCommit(t, l, 12)
				p := copyPath(dirs[bad])
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, c.damage(b), 0o600); err != nil {
					t.Fatal(err)
				}

				st := mustRead(t, l, rec)
				if s := st[bad]; s.State != StateCorrupt || !strings.Contains(s.Err, c.reason) {
					t.Fatalf("corrupt copy status = %+v, want corrupt with %q", s, c.reason)
				}
				if s := st[1-bad]; s.State != StateOK || s.Generation != 12 {
					t.Fatalf("good copy status = %+v", s)
				}
				if got := l.Status(); !slices.Equal(got, st) {
					t.Fatalf("Status() = %+v, want %+v", got, st)
				}

				rec = mustCommit(t, l, 13)
				wantStates(t, "Read after Commit", mustRead(t, l, rec), StateOK, StateOK)
			})
		}
	}
}

func TestMissingCopy(t *testing.T) {
	for gone := range 2 {
		t.Run(fmt.Sprintf("copy%d", gone), func(t *testing.T) {
			l, dirs := newLedger(t, 2)
			rec := mustCommit(t, l, 2)
			if err := os.Remove(copyPath(dirs[gone])); err != nil {
				t.Fatal(err)
			}
			st := mustRead(t, l, rec)
			if st[gone].State != StateMissing || st[1-gone].State != StateOK {
				t.Fatalf("statuses = %+v", st)
			}
			rec = mustCommit(t, l, 3)
			wantStates(t, "Read after Commit", mustRead(t, l, rec), StateOK, StateOK)
		})
	}
}

func TestAllCopiesCorrupt(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 12)
	for i, d := range dirs {
		b, err := os.ReadFile(copyPath(d))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(copyPath(d), corruptions[i].damage(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rec, st, err := l.Read()
	if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnreadable) {
		t.Fatalf("Read err = %v, want ErrCorrupt only", err)
	}
	if rec.Data != nil || rec.Generation != 0 {
		t.Errorf("Read returned a record %+v with an error", rec)
	}
	wantStates(t, "Read", st, StateCorrupt, StateCorrupt)
	for _, s := range st {
		if !strings.Contains(s.Err, "checksum mismatch") || !strings.Contains(err.Error(), s.Path) {
			t.Errorf("status %+v; err %v should name the path and reason", s, err)
		}
	}
}

func TestNoCopies(t *testing.T) {
	l, _ := newLedger(t, 2)
	_, st, err := l.Read()
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read err = %v, want ErrNotFound", err)
	}
	wantStates(t, "Read", st, StateMissing, StateMissing)
}

func TestMissingAndCorrupt(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 1)
	os.Remove(copyPath(dirs[0]))
	os.WriteFile(copyPath(dirs[1]), nil, 0o600)
	_, st, err := l.Read()
	if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotFound) {
		t.Fatalf("Read err = %v, want ErrCorrupt", err)
	}
	wantStates(t, "Read", st, StateMissing, StateCorrupt)
}

// breakDir replaces dir with a regular file, which stops writes even for
// root (chmod does not).
func breakDir(t *testing.T, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestUnwritableDir(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 1)
	breakDir(t, dirs[0])

	rec := Record{Generation: 2, Data: doc(2)}
	st, err := l.Commit(rec)
	if err != nil {
		t.Fatalf("Commit with one good directory: %v", err)
	}
	wantStates(t, "Commit", st, StateWriteFailed, StateOK)
	if st[0].Err == "" || st[0].Generation != 0 || st[1].Generation != 2 {
		t.Fatalf("statuses = %+v", st)
	}
	if got := l.Status(); !slices.Equal(got, st) {
		t.Fatalf("Status() = %+v, want %+v", got, st)
	}

	st = mustRead(t, l, rec)
	wantStates(t, "Read", st, StateUnreadable, StateOK)

	breakDir(t, dirs[1])
	st, err = l.Commit(Record{Generation: 3, Data: doc(3)})
	if !errors.Is(err, ErrNoCopyWritten) {
		t.Fatalf("Commit err = %v, want ErrNoCopyWritten", err)
	}
	wantStates(t, "Commit", st, StateWriteFailed, StateWriteFailed)

	// Nothing readable is not "not found": the document may be intact on a
	// disk that is merely absent.
	_, st, err = l.Read()
	if !errors.Is(err, ErrUnreadable) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read err = %v, want ErrUnreadable", err)
	}
	wantStates(t, "Read", st, StateUnreadable, StateUnreadable)
}

func TestDirectoryRemovedIsNotMissing(t *testing.T) {
	l, dirs := newLedger(t, 2)
	rec := mustCommit(t, l, 1)
	if err := os.RemoveAll(dirs[0]); err != nil {
		t.Fatal(err)
	}
	wantStates(t, "Read", mustRead(t, l, rec), StateUnreadable, StateOK)
	os.RemoveAll(dirs[1])
	_, _, err := l.Read()
	if !errors.Is(err, ErrUnreadable) || errors.Is(err, ErrNotFound) {
		t.Fatalf("Read err = %v, want ErrUnreadable", err)
	}
}

func TestCorruptAndUnreadable(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 1)
	breakDir(t, dirs[0])
	os.WriteFile(copyPath(dirs[1]), []byte("{}\n"), 0o600)
	_, st, err := l.Read()
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrUnreadable) {
		t.Fatalf("Read err = %v, want ErrCorrupt and ErrUnreadable", err)
	}
	wantStates(t, "Read", st, StateUnreadable, StateCorrupt)
}

func TestCopyPathIsDirectory(t *testing.T) {
	l, dirs := newLedger(t, 2)
	if err := os.Mkdir(copyPath(dirs[0]), 0o700); err != nil {
		t.Fatal(err)
	}
	rec := Record{Generation: 1, Data: doc(1)}
	st, err := l.Commit(rec)
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "Commit", st, StateWriteFailed, StateOK)
	wantStates(t, "Read", mustRead(t, l, rec), StateUnreadable, StateOK)
}

func TestUnreadablePermission(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads files regardless of mode")
	}
	l, dirs := newLedger(t, 2)
	rec := mustCommit(t, l, 1)
	if err := os.Chmod(copyPath(dirs[0]), 0); err != nil {
		t.Fatal(err)
	}
	wantStates(t, "Read", mustRead(t, l, rec), StateUnreadable, StateOK)
}

func TestCommitRejectsInvalidData(t *testing.T) {
	l, dirs := newLedger(t, 2)
	for _, data := range []string{"", "{", `{"a":1}` + "\n", ` {"a":1}`, "not json", `{"a":1}{"b":2}`} {
		st, err := l.Commit(Record{Generation: 1, Data: []byte(data)})
		if !errors.Is(err, ErrInvalidData) || st != nil {
			t.Errorf("Commit(%q) = %v, %v; want ErrInvalidData", data, st, err)
		}
	}
	if _, err := l.Commit(Record{Generation: 1, Data: make([]byte, MaxDataBytes+1)}); !errors.Is(err, ErrInvalidData) {
		t.Errorf("Commit(huge) = %v, want ErrInvalidData", err)
	}
	// Data its committer has checked is still refused with surrounding
	// whitespace, empty, or too large.
	for _, data := range []string{"", `{"a":1}` + "\n", ` {"a":1}`, string(make([]byte, MaxDataBytes+1))} {
		st, err := l.Commit(Record{Generation: 1, Data: []byte(data), Checked: true})
		if !errors.Is(err, ErrInvalidData) || st != nil {
			t.Errorf("Commit(%.20q, checked) = %v, %v; want ErrInvalidData", data, st, err)
		}
	}
	for _, d := range dirs {
		if entries, _ := os.ReadDir(d); len(entries) != 0 {
			t.Errorf("%s holds %v after rejected commits", d, entries)
		}
	}
	if l.Status() != nil {
		t.Errorf("Status() = %v after rejected commits, want nil", l.Status())
	}
}

func TestOpenRejectsBadArguments(t *testing.T) {
	d := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(d, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dirs []string
		name string
	}{
		{nil, testName},
		{[]string{d}, ""},
		{[]string{d}, "."},
		{[]string{d}, "../x.json"},
		{[]string{d}, "a/b.json"},
		{[]string{d}, tempPrefix + "x"},
		{[]string{d, ""}, testName},
		{[]string{d, d + "/"}, testName},
		{[]string{d, link}, testName},
	} {
		if _, err := Open(tc.dirs, tc.name, nil); err == nil {
			t.Errorf("Open(%q, %q) succeeded", tc.dirs, tc.name)
		}
	}
}

func TestOpenToleratesUnusableDir(t *testing.T) {
	root := t.TempDir()
	blocker := filepath.Join(root, "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dirs := []string{filepath.Join(blocker, "config"), filepath.Join(root, "good")}
	l, err := Open(dirs, testName, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	rec := Record{Generation: 1, Data: doc(1)}
	st, err := l.Commit(rec)
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "Commit", st, StateWriteFailed, StateOK)
	wantStates(t, "Read", mustRead(t, l, rec), StateUnreadable, StateOK)
}

func TestStatusCopy(t *testing.T) {
	l, _ := newLedger(t, 2)
	if l.Status() != nil {
		t.Fatalf("Status() before any Read or Commit = %v, want nil", l.Status())
	}
	mustCommit(t, l, 1)
	st := l.Status()
	st[0].State = "scribbled"
	if l.Status()[0].State != StateOK {
		t.Fatal("Status() returned a slice aliasing the ledger's")
	}
}

// TestConcurrentUse is for the race detector: Status, Read and Commit from
// several goroutines, and every copy consistent afterwards.
func TestConcurrentUse(t *testing.T) {
	l, _ := newLedger(t, 2)
	mustCommit(t, l, 1)
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := range 20 {
				gen := uint64(2 + w*100 + i)
				if _, err := l.Commit(Record{Generation: gen, Data: doc(gen)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			if rec, _, err := l.Read(); err != nil || !bytes.Equal(rec.Data, doc(rec.Generation)) {
				t.Errorf("Read = %+v, %v", rec, err)
				return
			}
		}
	})
	wg.Go(func() {
		for range 1000 {
			for _, s := range l.Status() {
				if s.State != StateOK && s.State != StateStale {
					t.Errorf("Status = %+v", s)
					return
				}
			}
		}
	})
	wg.Wait()

	// Commits were serialized: both copies hold the same generation, and
	// the last published status is that of the newest operation.
	_, st, err := l.Read()
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "Read", st, StateOK, StateOK)
	if !slices.Equal(l.Status(), st) {
		t.Fatalf("Status() = %+v, want %+v", l.Status(), st)
	}
}

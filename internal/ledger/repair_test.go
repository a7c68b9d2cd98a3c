package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// failIn returns a fault that fails op in the given directories, after the
// step was done.
func failIn(op fileOp, dirs ...string) faultFunc {
	return func(o fileOp, path string, err error) error {
		if o == op && (slices.Contains(dirs, path) || slices.Contains(dirs, filepath.Dir(path))) {
			return fmt.Errorf("injected %s failure", op)
		}
		return err
	}
}

// TestCommitAgreesWithReadAfterRestart fails every step of the write, in one
// copy or in all, and checks that what Commit answered agrees with what a
// restarted ledger reads: an error means the old record, success the new.
func TestCommitAgreesWithReadAfterRestart(t *testing.T) {
	for _, op := range []fileOp{opCreate, opWrite, opSync, opClose, opRename, opSyncDir} {
		afterRename := op == opRename || op == opSyncDir
		for _, all := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s all=%v", op, all), func(t *testing.T) {
				l, dirs := newLedger(t, 2)
				old := mustCommit(t, l, 1)
				failing := dirs[:1]
				if all {
					failing = dirs
				}
				l.fault = failIn(op, failing...)
				rec := Record{Generation: 2, Data: doc(2)}
				st, err := l.Commit(rec)

				want := StateWriteFailed
				if afterRename {
					want = StateNotDurable
				}
				if st[0].State != want || st[0].Err == "" {
					t.Errorf("failed copy: %+v, want %s with a reason", st[0], want)
				}
				if all && st[1].State != want || !all && st[1].State != StateOK {
					t.Errorf("second copy: %+v", st[1])
				}

				again, err2 := Open(dirs, testName, nil)
				if err2 != nil {
					t.Fatal(err2)
				}
				got, _, rerr := again.Read()
				if rerr != nil {
					t.Fatalf("Read after restart: %v", rerr)
				}
				switch {
				case err == nil && got.Generation != rec.Generation:
					t.Fatalf("Commit succeeded but a restart reads generation %d", got.Generation)
				case err != nil && got.Generation != old.Generation:
					t.Fatalf("Commit failed (%v) but a restart reads generation %d", err, got.Generation)
				case err != nil && !errors.Is(err, ErrNoCopyWritten):
					t.Fatalf("Commit error %v does not wrap ErrNoCopyWritten", err)
				}
				if want := all && !afterRename; (err != nil) != want {
					t.Errorf("Commit error %v, want an error: %v", err, want)
				}
				if entries, _ := os.ReadDir(dirs[0]); len(entries) != 1 {
					t.Errorf("%s holds %v, want the copy alone", dirs[0], entries)
				}
			})
		}
	}
}

// A rename that really failed leaves the old copy, which reading it back
// shows: the copy is not counted as written.
func TestRenameThatFailedIsNotCounted(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 1)
	if err := os.Remove(copyPath(dirs[0])); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(copyPath(dirs[0]), 0o700); err != nil { // rename(2) cannot replace it
		t.Fatal(err)
	}
	st, err := l.Commit(Record{Generation: 2, Data: doc(2)})
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "Commit", st, StateWriteFailed, StateOK)
	if !strings.Contains(st[0].Err, "not a regular file") {
		t.Errorf("reason %q", st[0].Err)
	}
}

func TestRepair(t *testing.T) {
	l, dirs := newLedger(t, 2)
	rec := mustCommit(t, l, 2)
	stat := func(i int) os.FileInfo {
		t.Helper()
		fi, err := os.Stat(copyPath(dirs[i]))
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	repair := func(what string, wantFound, wantNow []CopyState) ([]CopyStatus, []CopyStatus) {
		t.Helper()
		found, now, err := l.Repair(rec)
		if err != nil {
			t.Fatalf("%s: Repair: %v", what, err)
		}
		wantStates(t, what+": found", found, wantFound...)
		wantStates(t, what+": now", now, wantNow...)
		if got := l.Status(); !slices.Equal(got, now) {
			t.Fatalf("%s: Status() = %+v, want %+v", what, got, now)
		}
		mustRead(t, l, rec)
		return found, now
	}
	okOK := []CopyState{StateOK, StateOK}

	// Nothing wrong: nothing rewritten.
	before := stat(1)
	repair("whole", okOK, okOK)
	if !os.SameFile(before, stat(1)) {
		t.Error("a good copy was rewritten")
	}

	if err := os.Remove(copyPath(dirs[0])); err != nil {
		t.Fatal(err)
	}
	repair("missing", []CopyState{StateMissing, StateOK}, okOK)
	if !os.SameFile(before, stat(1)) {
		t.Error("the good copy was rewritten along with the missing one")
	}

	if err := os.WriteFile(copyPath(dirs[1]), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	repair("corrupt", []CopyState{StateOK, StateCorrupt}, okOK)

	// A copy holding another generation, older or newer, is stale.
	for _, gen := range []uint64{1, 3} {
		other, err := Open(dirs[:1], testName, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Commit(Record{Generation: gen, Data: doc(gen)}); err != nil {
			t.Fatal(err)
		}
		found, _ := repair(fmt.Sprintf("generation %d", gen), []CopyState{StateStale, StateOK}, okOK)
		if !strings.Contains(found[0].Err, fmt.Sprintf("generation %d", gen)) {
			t.Errorf("found %+v", found[0])
		}
	}

	// A copy that cannot be rewritten says what was wrong and why.
	breakDir(t, dirs[0])
	_, now := repair("unwritable", []CopyState{StateUnreadable, StateOK}, []CopyState{StateWriteFailed, StateOK})
	if !strings.Contains(now[0].Err, "was unreadable") || !strings.Contains(now[0].Err, "create temp file") {
		t.Errorf("reason %q", now[0].Err)
	}
	breakDir(t, dirs[1])
	if _, now, err := l.Repair(rec); !errors.Is(err, ErrNoCopyWritten) {
		t.Fatalf("Repair with no writable copy: %v %+v", err, now)
	}
}

// A copy left not_durable is fsynced again by Repair, not rewritten.
func TestRepairMakesANotDurableCopyDurable(t *testing.T) {
	l, dirs := newLedger(t, 2)
	l.fault = failIn(opSyncDir, dirs[1])
	rec := Record{Generation: 1, Data: doc(1)}
	st, err := l.Commit(rec)
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "Commit", st, StateOK, StateNotDurable)
	written, _ := os.Stat(copyPath(dirs[1]))

	// Still failing: still not durable.
	found, now, err := l.Repair(rec)
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "found", found, StateOK, StateNotDurable)
	wantStates(t, "now", now, StateOK, StateNotDurable)

	l.fault = nil
	found, now, err = l.Repair(rec)
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "found", found, StateOK, StateNotDurable)
	wantStates(t, "now", now, StateOK, StateOK)
	if fi, _ := os.Stat(copyPath(dirs[1])); !os.SameFile(written, fi) {
		t.Error("the copy was rewritten; only its directory needed an fsync")
	}
	_, now, _ = l.Repair(rec)
	wantStates(t, "now", now, StateOK, StateOK)
}

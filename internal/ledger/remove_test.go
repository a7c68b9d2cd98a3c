package ledger

import (
	"errors"
	"os"
	"testing"
)

// Remove deletes every copy, so that Read finds none; a copy it cannot
// remove is reported and Read still finds it.
func TestRemove(t *testing.T) {
	l, dirs := newLedger(t, 2)
	mustCommit(t, l, 3)
	now, err := l.Remove()
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, "removed", now, StateMissing, StateMissing)
	if _, _, err := l.Read(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read after Remove: %v, want ErrNotFound", err)
	}
	// Removing again is no error: nothing is left.
	if _, err := l.Remove(); err != nil {
		t.Fatalf("removing a removed ledger: %v", err)
	}

	// A copy whose directory is gone (an absent disk?) is not known to be
	// removed: that is an error, and the other copy is removed all the same.
	rec := mustCommit(t, l, 4)
	aside := dirs[1] + ".aside"
	if err := os.Rename(dirs[1], aside); err != nil {
		t.Fatal(err)
	}
	now, err = l.Remove()
	if err == nil {
		t.Fatal("Remove with a copy's directory gone: no error")
	}
	wantStates(t, "one directory gone", now, StateMissing, StateUnreadable)
	if err := os.Rename(aside, dirs[1]); err != nil {
		t.Fatal(err)
	}
	mustRead(t, l, rec)
	if _, err := os.Stat(copyPath(dirs[0])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the first copy: %v, want it removed", err)
	}
}

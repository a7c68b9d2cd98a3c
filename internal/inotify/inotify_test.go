package inotify

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// The events of a real watch: an entry made, renamed and removed, then the
// directory itself removed.
func TestWatchAndEvents(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "watched")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Watch(dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_MOVED_FROM|unix.IN_DELETE|unix.IN_DELETE_SELF)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "a-longer-name-than-one-slot")
	if err := os.WriteFile(a, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	var got []Event
	buf := make([]byte, BufferSize)
	for !slices.ContainsFunc(got, func(e Event) bool { return e.Mask&unix.IN_IGNORED != 0 }) {
		n, err := f.Read(buf)
		if err != nil {
			t.Fatalf("read: %v (events so far %+v)", err, got)
		}
		got = slices.AppendSeq(got, Events(buf[:n]))
	}
	want := []Event{
		{unix.IN_CREATE, "a"},
		{unix.IN_MOVED_FROM, "a"},
		{unix.IN_MOVED_TO, "a-longer-name-than-one-slot"},
		{unix.IN_DELETE, "a-longer-name-than-one-slot"},
		{unix.IN_DELETE_SELF, ""},
		{unix.IN_IGNORED, ""},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events\n%+v, want\n%+v", got, want)
	}
}

func TestEventsOfATruncatedRead(t *testing.T) {
	ev := make([]byte, unix.SizeofInotifyEvent+8)
	binary.NativeEndian.PutUint32(ev[4:8], unix.IN_CREATE)
	binary.NativeEndian.PutUint32(ev[12:16], 8)
	copy(ev[unix.SizeofInotifyEvent:], "name\x00\x00\x00\x00")
	got := slices.Collect(Events(append(ev, ev[:unix.SizeofInotifyEvent+2]...)))
	if want := []Event{{unix.IN_CREATE, "name"}, {unix.IN_CREATE, "na"}}; !slices.Equal(got, want) {
		t.Fatalf("%+v, want %+v", got, want)
	}
	if got := slices.Collect(Events(ev[:unix.SizeofInotifyEvent-1])); len(got) != 0 {
		t.Fatalf("a short read gave %+v", got)
	}
}
